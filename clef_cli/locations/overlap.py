"""Whether a place a command writes (an output file, a store, a head folder) meets a place it
reads: the one check that an output never replaces an input, nor lands where a later run reads
its input from.

Each location is brought to one form first, with no request made: a local path or
local-filesystem URI is made absolute with its symbolic links resolved (a glob's fixed folders
only), an object URI gets its scheme and bucket in lower case and its key percent-decoded (as
pyarrow sends it) with `.`, `..` and empty segments resolved. Then a written file meets an input
that is the same location, a folder or prefix holding it (an `s3://b/in` input may be a prefix),
or a glob matching it; a written folder (a store) also meets an input it holds or a glob that
reads inside it. stdin (`-`) is nothing to overwrite.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote

from clef_cli.errors import UsageError
from clef_cli.locations.uris import local_path, shown

_GLOB = ("*", "?", "[")


class _Spot(NamedTuple):
    """A location in one form: where it lives (`""` for this machine, `s3://bucket`) and its
    segments below that; `pattern`: a glob's, matched segment by segment."""

    root: str
    parts: tuple[str, ...]
    pattern: bool = False


def _is_glob(segment: str) -> bool:
    return any(character in segment for character in _GLOB)


def _resolved(parts: Iterable[str]) -> tuple[str, ...]:
    """`.`, `..` and empty segments resolved as in a path (never above the root)."""
    found: list[str] = []
    for segment in parts:
        if segment == "..":
            if found:
                found.pop()
        elif segment not in ("", "."):
            found.append(segment)
    return tuple(found)


def _spot(location: str | Path) -> _Spot | None:
    """`location` in one form; None for stdin (`-`)."""
    if str(location) == "-":
        return None
    path = local_path(location)
    if path is None:
        scheme, _, rest = str(location).partition("://")
        bucket, _, key = rest.partition("/")
        parts = _resolved(unquote(key).split("/"))
        return _Spot(f"{scheme.lower()}://{bucket.lower()}", parts, any(map(_is_glob, parts)))
    segments = Path(os.path.abspath(path)).parts
    fixed = next((i for i, segment in enumerate(segments) if _is_glob(segment)), len(segments))
    base = Path(*segments[:fixed]).resolve()
    parts = base.parts[1:] + _resolved(segments[fixed:])
    return _Spot(base.parts[0], parts, fixed < len(segments))


def _matches(parts: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    """Whether every segment of `parts` matches the pattern's segment at its place."""
    return all(fnmatch.fnmatchcase(name, segment) for name, segment in zip(parts, pattern, strict=False))


def relation(written: str | Path, read: str | Path, folder: bool = False) -> str | None:
    """How the written location meets the read one, in a message's words, or None when apart: it
    "is" the same location, "lies inside" a folder or prefix read, "matches" a glob read, or (a
    written `folder` only) "holds" what is read, or files a glob would read."""
    out, source = _spot(written), _spot(read)
    if out is None or source is None or out.root != source.root:
        return None
    size = len(out.parts)
    if not source.pattern:
        if out.parts == source.parts:
            return "is"
        if out.parts[: len(source.parts)] == source.parts:
            return "lies inside"
        return "holds" if folder and source.parts[:size] == out.parts else None
    base = next(i for i, segment in enumerate(source.parts) if _is_glob(segment))
    if size == len(source.parts) and _matches(out.parts, source.parts):
        return "matches"
    if folder and size <= base and source.parts[:size] == out.parts:
        return "holds"
    if folder and size < len(source.parts) and _matches(out.parts, source.parts):
        return "holds files matched by"
    return None


def refuse_overlap(
    option: str,
    written: str | Path | None,
    reads: Iterable[str | Path | None],
    folder: bool = False,
    what: str = "input",
) -> None:
    """A usage error (exit 2, one line naming the option and both locations) when `written` meets
    any of `reads` (None: not given); `folder`: a folder or prefix is written (a store); `what`
    the read locations are, as the message names them."""
    if written is None:
        return
    for read in reads:
        found = None if read is None else relation(written, read, folder)
        if found is not None:
            raise UsageError(
                f"{option} {shown(str(written))} {found} the {what} {shown(str(read))}: {_HARM[found.split()[0]]}; "
                f"give {option} another location"
            )


def refuse_inside_store(option: str, locations: Iterable[str | Path | None], store: str | Path | None) -> None:
    """A usage error (exit 2, one line) when a location a job reads or writes beside its store (a
    media root, --stats-json) is the store's folder or prefix or lies inside it: the folder is the
    store's own, and a bucket store's prune deletes the objects under it that no manifest names."""
    if store is None or not str(store).strip():
        return
    for location in locations:
        found = None if location is None else relation(store, location, folder=True)
        if found in ("is", "holds"):
            assert location is not None
            where = "is" if found == "is" else "lies inside"
            raise UsageError(
                f"{option} {shown(str(location))} {where} the store --checkpoint {shown(str(store))}: the store's "
                f"folder is its own (a prune deletes what it does not name); give {option} a location outside it"
            )


_HARM = {
    "is": "writing would replace it",
    "lies": "a later run would read it as input",
    "matches": "a later run would read it as input",
    "holds": "their files would mix",
}
"""What goes wrong, by the relation's first word."""
