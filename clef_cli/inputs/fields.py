"""A record's field names, and the names that only look like one.

A field a record does not know is ignored (it may be the user's own column, kept with
`--keep-columns`). But a name that is a field's other case or its singular/plural (`image`,
`Images`, `Video`, `ID`, `question`) is almost always that field misspelt: ignoring it would
score another record than the one meant (`"image": [...]` scored as text only). So such a name is
a near miss, unless the user claimed it (`--keep-columns`, a column mapping).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

MEDIA_FIELDS = ("images", "audio", "videos")
RECORD_FIELDS = ("id", "state", "questions", *MEDIA_FIELDS)
_LOOKALIKES = {form: name for name in RECORD_FIELDS for form in (name.removesuffix("s"), name.removesuffix("s") + "s")}
"""Each record field's singular and plural, lower case: `image`, `Images`, `ID`, `question` resemble one."""


def near_miss(names: Iterable[Any], claimed: Collection[str] = ()) -> tuple[str, str] | None:
    """The first of `names` that looks like a record field but is not one, with the field it
    resembles; None if there is none. `claimed`: names the user gave a use, never near misses."""
    for name in names:
        if isinstance(name, str) and name not in RECORD_FIELDS and name not in claimed:
            resembled = _LOOKALIKES.get(name.casefold())
            if resembled is not None:
                return name, resembled
    return None


def near_miss_message(name: str, resembled: str) -> str:
    return f"unknown field {name!r} (did you mean {resembled!r}?)"
