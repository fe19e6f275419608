"""`clef checkpoint prune`: drop the keys no recent run used, and the rows no key points to.

Only completed runs that used keys count toward `--keep-runs` (`counts_as_run`), a prune that
would empty the store is refused unless forced, and a dry run reports what would go.

Crash-safe the way commits are: the kept rows of each shard that loses some are written to new
files first (under the shard's own name: its keys keep their shard, and only their row changes,
index_compaction.py), then one atomic rewrite of the journal switches to them, and only then are
the old files deleted and the key index updated. A kill before the journal rewrite leaves new
files no journal line names (the next open deletes them); a kill after leaves old files no line
names (deleted likewise) and an index whose shards name other results files than the journal's,
which the next open reconciles (each moved key keeping its last use, so the next prune keeps
what this one kept).
"""

from __future__ import annotations

import json
import time
import uuid
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from clef_cli.errors import UsageError
from clef_cli.sizes import plural
from clef_cli.store import durable
from clef_cli.store.checkpoint import Checkpoint, ShardEntry, require_folder
from clef_cli.store.index_compaction import Rewritten, compact
from clef_cli.store.key_index import KeyIndex, counts_as_run
from clef_cli.store.locks import JobLock
from clef_cli.store.manifest import read_manifest
from clef_cli.store.shard_files import described_file, ipc_bytes

if TYPE_CHECKING:
    from clef_cli.store.remote.cache_prune import CachePruned


@dataclass
class PruneReport:
    kept_runs: list[str] = field(default_factory=list)
    """The counted runs (completed, with keys) whose keys are kept."""
    keys_before: int = 0
    keys_dropped: int = 0
    rows_dropped: int = 0
    shards_rewritten: int = 0
    shards_removed: int = 0
    bytes_freed: int = 0
    """With `dry_run`, an estimate (a rewritten shard's share by its rows' prompt tokens)."""
    dry_run: bool = False
    drops_every_key: bool = False
    """Every key would go (refused unless forced; a dry run only says so)."""
    objects_deleted: int = 0
    """A store in a bucket: objects no manifest names any more, deleted after the grace period."""
    cache: CachePruned | None = None
    """A store in a bucket: what pruning this machine's cache folders of it did (`remote/cache_prune.py`)."""


def check_limits(keep_runs: int | None, older_than_days: float | None) -> None:
    """Refuse what cannot be meant: no limit, or one that keeps nothing (`--keep-runs 0`,
    `--older-than 0`; to empty a store, delete its folder)."""
    if keep_runs is None and older_than_days is None:
        raise UsageError("give --keep-runs N and/or --older-than DAYS")
    if keep_runs is not None and keep_runs < 1:
        raise UsageError(f"--keep-runs must be at least 1, not {keep_runs}: 0 would drop every key")
    if older_than_days is not None and not older_than_days > 0:
        raise UsageError(f"--older-than must be above 0 days, not {older_than_days:g}: 0 would drop every key")


def kept_run_seqs(
    runs: list[dict], keep_runs: int | None, older_than_days: float | None, now: float | None = None
) -> set[int]:
    """The runs whose keys stay (a key goes with the run that used it last; every condition
    given must hold). `--keep-runs N`: the last N counted runs and every run since the earliest
    of them (an interrupted run keeps what it touched), all runs while fewer than N count.
    `--older-than DAYS`: the runs started within the last DAYS."""
    kept = list(runs)
    if keep_runs is not None:
        counted = [run["seq"] for run in runs if counts_as_run(run)]
        if len(counted) >= keep_runs:
            kept = [run for run in kept if run["seq"] >= counted[-keep_runs]]
    if older_than_days is not None:
        cutoff = (now or time.time()) - older_than_days * 86400
        kept = [run for run in kept if run["started"] >= cutoff]
    return {run["seq"] for run in kept}


def prune(
    path: Path,
    keep_runs: int | None = None,
    older_than_days: float | None = None,
    force: bool = False,
    dry_run: bool = False,
) -> PruneReport:
    """Drop the keys no kept run used. A prune that would drop every key is refused unless
    `force`; `dry_run` says what would go and changes nothing."""
    check_limits(keep_runs, older_than_days)
    if dry_run:
        checkpoint = Checkpoint.open_existing(path)
        try:
            return _prune(checkpoint, keep_runs, older_than_days, force=True, apply=False)
        finally:
            checkpoint.close()
    require_folder(path)
    manifest = read_manifest(path)
    if manifest is None:
        raise UsageError(f"{path} is not a clef checkpoint")
    with JobLock(path.with_name(path.name + ".lock"), f"checkpoint {path}"):
        checkpoint = Checkpoint.open(path, manifest)
        try:
            return _prune(checkpoint, keep_runs, older_than_days, force)
        finally:
            checkpoint.close()


@dataclass(frozen=True)
class _Change:
    """A shard that loses rows: which (sorted)."""

    entry: ShardEntry
    gone: np.ndarray

    def live(self) -> np.ndarray:
        return np.setdiff1d(np.arange(self.entry.records, dtype=np.int64), self.gone, assume_unique=True)


def _prune(
    checkpoint: Checkpoint, keep_runs: int | None, older_than_days: float | None, force: bool, apply: bool = True
) -> PruneReport:
    index = checkpoint.index
    assert index is not None
    runs = index.runs(count_keys=False)
    seqs = sorted(kept_run_seqs(runs, keep_runs, older_than_days))
    report = PruneReport(dry_run=not apply)
    report.kept_runs = [run["run_id"] for run in runs if run["seq"] in seqs and counts_as_run(run)]
    counts, unused = index.shard_counts(), index.unused_rows(seqs)
    report.keys_before = sum(counts.values())
    kept_keys = report.keys_before - sum(len(rows) for rows in unused.values())
    report.keys_dropped = report.keys_before - kept_keys
    report.drops_every_key = report.keys_before > 0 and kept_keys == 0
    if report.drops_every_key and not force:
        every = "the only key" if report.keys_before == 1 else f"all {report.keys_before:,} keys"
        raise UsageError(
            f"this prune would drop {every} of {checkpoint.path}: no kept run used any "
            f"({plural(len(report.kept_runs), 'completed run')} with keys kept); see `clef checkpoint prune "
            "--dry-run`, keep more runs, or add --force to drop them all"
        )
    changes = _changes(index, checkpoint.entries, counts, unused, seqs)
    for change in changes:
        report.rows_dropped += len(change.gone)
        report.shards_removed += len(change.gone) == change.entry.records
        report.shards_rewritten += len(change.gone) < change.entry.records
    if not apply:
        report.bytes_freed = sum(_freed_estimate(checkpoint, change.entry, change.live()) for change in changes)
    elif changes:
        report.bytes_freed = _apply(checkpoint, changes, report.keys_before)
    return report


def _changes(
    index: KeyIndex,
    entries: list[ShardEntry],
    counts: dict[str, int],
    unused: dict[str, array],
    kept_runs: list[int],
) -> list[_Change]:
    """The shards that lose rows: those with keys no kept run used, and those holding rows no key
    points to (a later shard's row won, or the record had no key)."""
    changes = []
    for entry in entries:
        pointed, dropped = counts.get(entry.name, 0), unused.get(entry.name, array("q"))
        if pointed - len(dropped) == entry.records:
            continue
        if pointed == entry.records:  # every row has its key: all go but the dropped ones
            gone = np.sort(np.frombuffer(dropped, dtype=np.int64))
        else:
            live = np.array(index.live_rows(entry.name, kept_runs), dtype=np.int64)
            gone = np.setdiff1d(np.arange(entry.records, dtype=np.int64), live, assume_unique=True)
        changes.append(_Change(entry, gone))
    return changes


def _freed_estimate(checkpoint: Checkpoint, entry: ShardEntry, live: np.ndarray) -> int:
    """What dropping all but the `live` rows of a shard frees: its files, or their share by the
    dropped rows (hidden states by prompt tokens, which they are made of)."""
    size = {kind: int(described["bytes"]) for kind, described in entry.files.items()}
    if len(live) == 0:
        return sum(size.values())
    table = checkpoint.shard_table(entry.name)
    freed = size["results"] * (table.num_rows - len(live)) // table.num_rows
    if "hidden" in size:
        kept = set(live.tolist())
        tokens = [
            (row in kept, value or 0)
            for row, (value, error) in enumerate(
                zip(table.column("prompt_tokens").to_pylist(), table.column("error").to_pylist(), strict=True)
            )
            if error is None
        ]
        total = sum(value for _, value in tokens)
        dropped = sum(value for is_kept, value in tokens if not is_kept)
        freed += size["hidden"] * dropped // total if total else 0
    return freed


def _apply(checkpoint: Checkpoint, changes: list[_Change], keys_before: int) -> int:
    """Rewrite or remove the changed shards (crash-safe, see the module's note); the bytes freed."""
    changed = {change.entry.name: change for change in changes}
    entries, rewritten, removed = [], [], []
    for entry in checkpoint.entries:
        change = changed.get(entry.name)
        if change is None:
            entries.append(entry)
        elif len(change.gone) == entry.records:
            removed.append(entry.name)
        else:
            # not kept mapped: the whole store's pages would count in the prune's memory
            new_entry = _rewrite(checkpoint, entry, checkpoint.open_shard(entry.name), change.live())
            entries.append(new_entry)
            results = new_entry.files["results"]["name"]
            rewritten.append(Rewritten(entry.name, results, change.gone.tolist()))
    durable.fsync_dir(checkpoint.shards_path)  # the new files' names, before the journal names them
    checkpoint.entries = entries
    checkpoint._tables.clear()  # the old files' tables, cached by shard name
    checkpoint._rewrite_journal()  # the switch: from here the new files count
    freed = 0
    for change in changes:
        for described in change.entry.files.values():
            freed += int(described["bytes"])
            durable.unlink(checkpoint.shards_path / described["name"])
    kept_names = {shard.name for shard in rewritten}
    freed -= sum(int(d["bytes"]) for e in entries if e.name in kept_names for d in e.files.values())
    _update_index(checkpoint, rewritten, removed, keys_before)
    return freed


def _rewrite(checkpoint: Checkpoint, entry: ShardEntry, table: pa.Table, live: np.ndarray) -> ShardEntry:
    """The shard with only the `live` rows (and their hidden states), in new files under its name
    (a token apart from every file the store has or had: the journal switch picks them)."""
    kept = table.take(pa.array(live, pa.int64()))
    stem = f"{entry.name}.{uuid.uuid4().hex[:8]}"
    files = {"results": _write_new(checkpoint.shards_path / f"{stem}.results.arrow", ipc_bytes(kept), "sha256")}
    if entry.has_hidden:
        indices = {
            index
            for index, error in zip(
                kept.column("record_index").to_pylist(), kept.column("error").to_pylist(), strict=True
            )
            if error is None
        }
        data = _filtered_hidden(checkpoint.shards_path / entry.files["hidden"]["name"], indices)
        files["hidden"] = _write_new(checkpoint.shards_path / f"{stem}.hidden.safetensors", data, "crc32")
    return ShardEntry(name=entry.name, records=kept.num_rows, files=files, run=entry.run)


def _write_new(path: Path, data: bytes, checksum: str) -> dict[str, Any]:
    """A new file under a name nothing reads until the journal switch: written and fsynced in
    place (no temporary and rename), its folder fsynced once for all of them (`_apply`); a
    kill leaves a file no journal line names, which the next open deletes."""
    with durable.create(path) as handle:
        handle.write(data)
        durable.wrote(path, handle)
        durable.fsync(handle, path)
    return described_file(path.name, [data], checksum)


def _filtered_hidden(path: Path, indices: set[int]) -> bytes:
    from safetensors import safe_open
    from safetensors.torch import save

    from clef_cli.store.hidden_store import RECORDS_KEY

    with safe_open(str(path), framework="pt") as handle:
        metadata = dict(handle.metadata() or {})
        described = [record for record in json.loads(metadata[RECORDS_KEY]) if record["index"] in indices]
        tensors = {
            f"{kind}.{record['index']}": handle.get_tensor(f"{kind}.{record['index']}")
            for record in described
            for kind in ("hidden", "input_ids")
        }
    metadata[RECORDS_KEY] = json.dumps(described, ensure_ascii=False)
    return save(tensors, metadata)


def _update_index(checkpoint: Checkpoint, rewritten: list[Rewritten], removed: list[str], keys: int) -> None:
    """Drop the keys that went, point the kept ones at their new rows (one transaction)."""
    assert checkpoint.index is not None
    compact(checkpoint.index, rewritten, removed, keys)
