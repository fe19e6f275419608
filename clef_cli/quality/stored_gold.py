"""Which stored records the gold ids name. By default a gold id is the id a stored record was
computed under. A store shared by many runs holds each prompt once, under the id of the run that
computed it; `--scored OUT.parquet` (a `clef score` output, which carries `record_key`) maps the
gold ids of that run to their keys, and the keys to the stored states."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from clef_cli.errors import UsageError

if TYPE_CHECKING:
    from clef_cli.store.checkpoint import Checkpoint
    from clef_cli.store.hidden_store import HiddenReader, StoredRecord


def keys_of_ids(scored: Path, wanted: set[str]) -> dict[str, list[str]]:
    """record_key -> the wanted ids that have it, from a scored Parquet."""
    try:
        table = pq.read_table(scored, columns=["id", "record_key"])
    except (OSError, KeyError, ValueError) as error:
        raise UsageError(f"--scored {scored}: not a clef score output with a record_key column ({error})") from None
    ids_by_key: dict[str, list[str]] = {}
    for record_id, key in zip(table.column("id").to_pylist(), table.column("record_key").to_pylist(), strict=True):
        if key is not None and str(record_id) in wanted:
            ids_by_key.setdefault(key, []).append(str(record_id))
    return ids_by_key


def gold_stored(
    checkpoint: Checkpoint | None, reader: HiddenReader, wanted: set[str], scored: Path | None = None
) -> list[tuple[str, StoredRecord]]:
    """(gold id, stored record) for every wanted id found (headers only, no states)."""
    if scored is None or checkpoint is None:
        return [(record.id, record) for record in reader.records(states=False, verify=False) if record.id in wanted]
    ids_by_key = keys_of_ids(scored, wanted)
    entry_of = {entry.files["hidden"]["name"]: entry.name for entry in checkpoint.entries if entry.has_hidden}
    found: list[tuple[str, StoredRecord]] = []
    seen: set[str] = set()
    for shard, stored in reader.by_shard(states=False, verify=False):
        table = checkpoint.shard_table(entry_of[shard.path.name])
        key_of = dict(
            zip(table.column("record_index").to_pylist(), table.column("record_key").to_pylist(), strict=True)
        )
        for record in stored:
            key = key_of.get(record.index)
            if key in ids_by_key and key not in seen:
                seen.add(key)
                found.extend((record_id, record) for record_id in ids_by_key[key])
    return found
