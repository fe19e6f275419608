"""`clef checkpoint prune`: drop the keys no recent run used, and the rows no key points to.

Only completed runs that used keys count toward `--keep-runs` (`counts_as_run`), a prune that
would empty the store is refused unless forced, and a dry run reports what would go.

Crash-safe the way commits are: the kept rows of each shard that loses some are written to new
shard files first, then one atomic rewrite of the journal switches to them, and only then are
the old files deleted and the key index updated. A kill before the journal rewrite leaves new
files no journal line names (the next open deletes them); a kill after leaves old files no line
names (deleted likewise) and an index the next open reconciles with the journal (each moved key
keeping its last use, so the next prune keeps what this one kept).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from clef_cli.errors import UsageError
from clef_cli.sizes import plural
from clef_cli.store import durable
from clef_cli.store.checkpoint import (
    Checkpoint,
    ShardEntry,
    _ipc_bytes,
    require_folder,
    write_shard_file,
)
from clef_cli.store.key_index import counts_as_run
from clef_cli.store.locks import JobLock
from clef_cli.store.manifest import read_manifest


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


def _prune(
    checkpoint: Checkpoint, keep_runs: int | None, older_than_days: float | None, force: bool, apply: bool = True
) -> PruneReport:
    index = checkpoint.index
    assert index is not None
    runs = index.runs()
    seqs = sorted(kept_run_seqs(runs, keep_runs, older_than_days))
    report = PruneReport(dry_run=not apply)
    report.kept_runs = [run["run_id"] for run in runs if run["seq"] in seqs and counts_as_run(run)]
    report.keys_before, kept_keys = index.keys_kept(seqs)
    report.keys_dropped = report.keys_before - kept_keys
    report.drops_every_key = report.keys_before > 0 and kept_keys == 0
    if report.drops_every_key and not force:
        every = "the only key" if report.keys_before == 1 else f"all {report.keys_before:,} keys"
        raise UsageError(
            f"this prune would drop {every} of {checkpoint.path}: no kept run used any "
            f"({plural(len(report.kept_runs), 'completed run')} with keys kept); see `clef checkpoint prune "
            "--dry-run`, keep more runs, or add --force to drop them all"
        )
    # the shards that lose rows, found in one pass over the index (a shard's rows: its journal line)
    counts = index.live_counts(seqs)
    changed = [entry for entry in checkpoint.entries if counts.get(entry.name, 0) != entry.records]
    changes = [(entry, index.live_rows(entry.name, seqs)) for entry in changed]
    for entry, live in changes:
        report.rows_dropped += entry.records - len(live)
        report.shards_removed += not live
        report.shards_rewritten += bool(live)
    if not apply:
        report.bytes_freed = sum(_freed_estimate(checkpoint, entry, live) for entry, live in changes)
    elif changes:
        report.bytes_freed = _apply(checkpoint, changes)
    return report


def _freed_estimate(checkpoint: Checkpoint, entry: ShardEntry, live: list[int]) -> int:
    """What dropping all but the `live` rows of a shard frees: its files, or their share by the
    dropped rows (hidden states by prompt tokens, which they are made of)."""
    size = {kind: int(described["bytes"]) for kind, described in entry.files.items()}
    if not live:
        return sum(size.values())
    table = checkpoint.shard_table(entry.name)
    freed = size["results"] * (table.num_rows - len(live)) // table.num_rows
    if "hidden" in size:
        kept = set(live)
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


def _apply(checkpoint: Checkpoint, changes: list[tuple[ShardEntry, list[int]]]) -> int:
    """Rewrite or remove the changed shards (crash-safe, see the module's note); the bytes freed."""
    changed = {entry.name: live for entry, live in changes}
    entries, moves, obsolete = [], [], []
    for entry in checkpoint.entries:
        if entry.name not in changed:
            entries.append(entry)
            continue
        obsolete.append(entry)
        live = changed[entry.name]
        if not live:
            continue
        name = checkpoint._next_name_after(checkpoint.entries + entries)  # after every name on disk
        new_entry = _rewrite(checkpoint, entry, checkpoint.shard_table(entry.name), live, name)
        entries.append(new_entry)
        moves.append((entry.name, new_entry.name, live))
    old_entries = checkpoint.entries
    checkpoint.entries = entries
    checkpoint._rewrite_journal()  # the switch: from here the new shards count
    freed = 0
    for entry in obsolete:
        for described in entry.files.values():
            freed += int(described["bytes"])
            durable.unlink(checkpoint.shards_path / described["name"])
    freed -= sum(int(d["bytes"]) for e in entries if e not in old_entries for d in e.files.values())
    _update_index(checkpoint, obsolete, moves)
    return freed


def _rewrite(checkpoint: Checkpoint, entry: ShardEntry, table: pa.Table, live: list[int], name: str) -> ShardEntry:
    """A new shard with only the `live` rows (and their hidden states)."""
    kept = table.take(pa.array(live, pa.int64()))
    files = {"results": write_shard_file(checkpoint.shards_path, f"{name}.results.arrow", _ipc_bytes(kept), "sha256")}
    if entry.has_hidden:
        indices = {
            index
            for index, error in zip(
                kept.column("record_index").to_pylist(), kept.column("error").to_pylist(), strict=True
            )
            if error is None
        }
        data = _filtered_hidden(checkpoint.shards_path / entry.files["hidden"]["name"], indices)
        files["hidden"] = write_shard_file(checkpoint.shards_path, f"{name}.hidden.safetensors", data, "crc32")
    return ShardEntry(name=name, records=kept.num_rows, files=files, run=entry.run)


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


def _update_index(checkpoint: Checkpoint, obsolete: list[ShardEntry], moves: list[tuple[str, str, list[int]]]) -> None:
    """Point kept keys at their new rows and forget the rest (one transaction)."""
    index = checkpoint.index
    assert index is not None
    with index.transaction() as db:
        for old, new, live in moves:
            seq = int(new) if new.isdigit() else 0
            # by key (the primary key): an update by (shard, row) scans the shard's rows for each
            position = {row: number for number, row in enumerate(live)}
            stored = db.execute("SELECT key, row FROM keys WHERE shard = ?", (old,)).fetchall()
            db.executemany(
                "UPDATE keys SET shard = ?, seq = ?, row = ? WHERE key = ?",
                [(new, seq, position[row], key) for key, row in stored if row in position],
            )
            db.execute("INSERT OR REPLACE INTO shards(name, seq) VALUES (?, ?)", (new, seq))
        for entry in obsolete:
            db.execute("DELETE FROM keys WHERE shard = ?", (entry.name,))
            db.execute("DELETE FROM shards WHERE name = ?", (entry.name,))
