"""Which stored records the gold ids name. A store shared by many runs holds each prompt once,
under the id of the run that computed it, so an id can name several stored prompts: a record
edited between runs leaves its old prompt and its new one under the same id.

- `--scored OUT.parquet` (a `clef score` output, which carries `record_key`) maps the gold ids of
  that run to their keys, and the keys to the stored states: exact.
- Without it, a gold id is the id a stored record was computed under; when that names several
  stored prompts, the one the latest run that used the store used is taken, and when the
  latest run used none or several of them, the ids are refused with the fix (`--scored`); a
  prompt stored twice under one id (the same key) counts once."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from clef_cli.errors import UsageError
from clef_cli.inputs.sources import local_copy
from clef_cli.sizes import plural

if TYPE_CHECKING:
    from clef_cli.store.checkpoint import Checkpoint
    from clef_cli.store.hidden_store import HiddenReader, StoredRecord

NAMED = 5
"""Ambiguous ids named in a refusal."""


def keys_of_ids(scored: Path | str, wanted: set[str]) -> dict[str, list[str]]:
    """record_key -> the wanted ids that have it, from a scored Parquet."""
    try:
        table = pq.read_table(local_copy(scored, "--scored"), columns=["id", "record_key"])
    except (OSError, KeyError, ValueError) as error:
        raise UsageError(f"--scored {scored}: not a clef score output with a record_key column ({error})") from None
    ids_by_key: dict[str, list[str]] = {}
    for record_id, key in zip(table.column("id").to_pylist(), table.column("record_key").to_pylist(), strict=True):
        if key is not None and str(record_id) in wanted:
            ids_by_key.setdefault(key, []).append(str(record_id))
    return ids_by_key


def stored_keys(
    checkpoint: Checkpoint, reader: HiddenReader, ids: set[str] | None = None, keys: Collection[str] | None = None
) -> Iterator[tuple[str | None, StoredRecord]]:
    """(record_key, stored record) of the stored records (headers only, no states); only from
    the shards whose results hold one of `ids` or `keys` when given, so a store in a bucket
    downloads the hidden-state files of the gold records' shards, no others."""
    from clef_cli.store.hidden_store import read_shard

    entry_of = {entry.files["hidden"]["name"]: entry.name for entry in checkpoint.entries if entry.has_hidden}
    located = None
    if keys is not None and checkpoint.index is not None:
        located = {shard for shard, _ in checkpoint.index.locate(sorted(keys)).values()}
    for shard in reader.shards:
        name = entry_of[shard.path.name]
        if located is not None and name not in located:
            continue
        table = checkpoint.shard_table(name)
        if ids is not None and not pc.any(pc.is_in(table.column("id"), pa.array(sorted(ids), pa.string()))).as_py():
            continue
        key_of = dict(
            zip(table.column("record_index").to_pylist(), table.column("record_key").to_pylist(), strict=True)
        )
        for record in read_shard(shard.local(), states=False):
            yield key_of.get(record.index), record


def gold_stored(
    checkpoint: Checkpoint | None,
    reader: HiddenReader,
    wanted: set[str],
    scored: Path | str | None = None,
    notes: list[str] | None = None,
) -> list[tuple[str, StoredRecord]]:
    """(gold id, stored record) for every wanted id found (headers only, no states); how
    ambiguous ids were mapped is appended to `notes`."""
    if scored is None:
        return _by_stored_id(checkpoint, reader, wanted, notes if notes is not None else [])
    if checkpoint is None:
        raise UsageError("--scored needs the checkpoint's key index")
    ids_by_key = keys_of_ids(scored, wanted)
    found: list[tuple[str, StoredRecord]] = []
    seen: set[str] = set()
    for key, record in stored_keys(checkpoint, reader, keys=ids_by_key.keys()):
        if key in ids_by_key and key not in seen:
            seen.add(key)
            found.extend((record_id, record) for record_id in ids_by_key[key])
    return found


def _by_stored_id(
    checkpoint: Checkpoint | None, reader: HiddenReader, wanted: set[str], notes: list[str]
) -> list[tuple[str, StoredRecord]]:
    """Gold ids read as the ids stored records were computed under (see the module's docstring)."""
    if checkpoint is None:
        records = reader.records(states=False, verify=False)
        pairs: Iterator[tuple[str | None, StoredRecord]] = ((None, record) for record in records)
    else:
        pairs = stored_keys(checkpoint, reader, ids=wanted)
    prompts: dict[str, dict[str | None, StoredRecord]] = {}
    for key, record in pairs:
        if record.id in wanted:
            prompts.setdefault(record.id, {}).setdefault(key if key is not None else f"index:{record.index}", record)
    ambiguous = sorted(record_id for record_id, by_key in prompts.items() if len(by_key) > 1)
    if ambiguous:
        chosen = _latest_prompts(checkpoint, {record_id: prompts[record_id] for record_id in ambiguous})
        unresolved = [record_id for record_id in ambiguous if record_id not in chosen]
        if unresolved:
            named = ", ".join(map(repr, unresolved[:NAMED])) + (" ..." if len(unresolved) > NAMED else "")
            raise UsageError(
                f"the gold names {plural(len(unresolved), 'id')} with several stored prompts (records edited "
                f"between runs), and the latest run that used the store does not tell which one it labels: {named}; "
                "pass --scored OUT.parquet, the `clef score` output whose ids the gold file uses"
            )
        for record_id, key in chosen.items():
            prompts[record_id] = {key: prompts[record_id][key]}
        notes.append(
            f"{plural(len(ambiguous), 'gold id')} with several stored prompts (records edited between runs): each "
            "was taken as the prompt the latest run used (--scored OUT.parquet maps them exactly)"
        )
    return [(record_id, record) for record_id, by_key in prompts.items() for record in by_key.values()]


def _latest_prompts(checkpoint: Checkpoint | None, ambiguous: dict[str, dict]) -> dict[str, str]:
    """Ambiguous id -> the key of its one prompt the latest run used (ids it does not settle are left out)."""
    if checkpoint is None or checkpoint.index is None:
        return {}
    index = checkpoint.index
    latest = index.latest_run()
    keys = [key for by_key in ambiguous.values() for key in by_key]
    last = index.last_runs(keys)
    chosen = {}
    for record_id, by_key in ambiguous.items():
        used = [key for key in by_key if latest is not None and last.get(key) == latest]
        if len(used) == 1:
            chosen[record_id] = used[0]
    return chosen
