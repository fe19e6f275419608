"""Whether a record in `--records` is still the one that was scored.

Review shows the text and media it reads from `--records` beside the answers the scored file
holds. An input edited since it was scored would put new text beside old answers, so each wanted
record's key is computed again from the inputs exactly as `clef score` computed it (the output's
`clef.key_prompt`, `clef.media_limits`, `clef.questions` and `clef.struct_nulls` say how) and
compared with the scored `record_key`. No media is decoded, and nothing is fetched: a record with
a remote medium is shown unchecked (keying it would download it), and says so.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from clef_cli.encoding.media_limits import MediaLimits, key_limits
from clef_cli.inputs.columns import mapping_from_metadata
from clef_cli.inputs.parquet_rows import StructNulls
from clef_cli.inputs.readers import read_records
from clef_cli.inputs.records import MEDIA_FIELDS, Record
from clef_cli.quality.labels.scored import ScoredFile
from clef_cli.store.record_key import MediaHasher, PromptShape, record_key

REMOTE = ("http://", "https://")


@dataclass
class Freshness:
    edited: list[str] = field(default_factory=list)
    """Ids whose inputs no longer give the scored key: left out of the review."""
    unchecked: int = 0
    """Records that could not be checked (remote media)."""
    notes: list[str] = field(default_factory=list)


def check_records(scored: ScoredFile, records: list[Path | str], wanted: Collection[str]) -> Freshness:
    """Which `wanted` records of `--records` are not the prompts the scored file scored."""
    metadata = scored.metadata
    if scored.record_keys is None or "clef.key_prompt" not in metadata:
        note = "the scored file does not say how its keys were made (scored by an older clef): --records text unchecked"
        return Freshness(notes=[note])
    prompt = PromptShape.from_metadata(metadata["clef.key_prompt"])
    stored = key_limits(json.loads(metadata.get("clef.media_limits", "{}")))  # the allow-list etc. key nothing
    limits = MediaLimits(**{**stored, "allow_remote": False})
    questions = json.loads(metadata["clef.questions"]) if "clef.questions" in metadata else None
    struct_nulls = StructNulls(metadata.get("clef.struct_nulls", StructNulls.refuse.value))
    scored_key = dict(zip(scored.ids, scored.record_keys, strict=True))
    hasher, found = MediaHasher(limits), Freshness()
    columns = mapping_from_metadata(metadata.get("clef.columns"))  # the --columns the scoring run read them with
    for record in read_records(records, questions, struct_nulls=struct_nulls, columns=columns):
        if not isinstance(record, Record) or record.id not in wanted or record.id not in scored_key:
            continue
        entries = (entry for name in MEDIA_FIELDS for entry in getattr(record, name))
        if any(isinstance(entry, str) and entry.startswith(REMOTE) for entry in entries):
            found.unchecked += 1
        elif record_key(record, prompt, hasher) != scored_key[record.id]:
            found.edited.append(record.id)
    if found.edited:
        found.notes.append(
            f"{len(found.edited)} record(s) in --records changed since they were scored (first: {found.edited[0]!r}): "
            "left out, since their text would not match the answers; score them again to review them"
        )
    if found.unchecked:
        found.notes.append(f"{found.unchecked} record(s) with remote media shown unchecked against their record_key")
    return found
