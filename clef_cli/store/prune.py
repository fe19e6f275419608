"""`clef checkpoint prune`: drop the keys no recent run used, and the rows no key points to.

Crash-safe the way commits are: the kept rows of each shard that loses some are written to new
shard files first, then one atomic rewrite of the journal switches to them, and only then are
the old files deleted and the key index updated. A kill before the journal rewrite leaves new
files no journal line names (the next open deletes them); a kill after leaves old files no line
names (deleted likewise) and an index the next open reconciles with the journal.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from clef_cli.errors import UsageError
from clef_cli.store.checkpoint import (
    Checkpoint,
    ShardEntry,
    _ipc_bytes,
    read_manifest,
    require_folder,
    write_shard_file,
)
from clef_cli.store.locks import JobLock


@dataclass
class PruneReport:
    kept_runs: list[str] = field(default_factory=list)
    keys_dropped: int = 0
    rows_dropped: int = 0
    shards_rewritten: int = 0
    shards_removed: int = 0
    bytes_freed: int = 0


def recent_runs(runs: list[dict], keep_runs: int | None, older_than_days: float | None) -> list[dict]:
    """The runs that count as recent: among the last `keep_runs` and started within the days
    (every condition given must hold)."""
    kept = list(runs)
    if keep_runs is not None:
        kept = kept[-keep_runs:] if keep_runs > 0 else []
    if older_than_days is not None:
        cutoff = time.time() - older_than_days * 86400
        kept = [run for run in kept if run["started"] >= cutoff]
    return kept


def prune(path: Path, keep_runs: int | None = None, older_than_days: float | None = None) -> PruneReport:
    if keep_runs is None and older_than_days is None:
        raise UsageError("give --keep-runs N and/or --older-than DAYS")
    require_folder(path)
    manifest = read_manifest(path)
    if manifest is None:
        raise UsageError(f"{path} is not a clef checkpoint")
    with JobLock(path.with_name(path.name + ".lock"), f"checkpoint {path}"):
        checkpoint = Checkpoint.open(path, manifest)
        try:
            return _prune(checkpoint, keep_runs, older_than_days)
        finally:
            checkpoint.close()


def _prune(checkpoint: Checkpoint, keep_runs: int | None, older_than_days: float | None) -> PruneReport:
    index = checkpoint.index
    assert index is not None
    kept = recent_runs(index.runs(), keep_runs, older_than_days)
    report = PruneReport(kept_runs=[run["run_id"] for run in kept])
    seqs = [run["seq"] for run in kept]
    before = index.count()
    entries, moves, obsolete = [], [], []
    for entry in checkpoint.entries:
        table = checkpoint.shard_table(entry.name)
        live = index.live_rows(entry.name, seqs)
        if len(live) == table.num_rows:
            entries.append(entry)
            continue
        obsolete.append(entry)
        report.rows_dropped += table.num_rows - len(live)
        if not live:
            report.shards_removed += 1
            continue
        report.shards_rewritten += 1
        name = checkpoint._next_name_after(checkpoint.entries + entries)  # after every name on disk
        new_entry = _rewrite(checkpoint, entry, table, live, name)
        entries.append(new_entry)
        moves.append((entry.name, new_entry.name, live))
    if not obsolete:
        return report
    old_entries = checkpoint.entries
    checkpoint.entries = entries
    checkpoint._rewrite_journal()  # the switch: from here the new shards count
    for entry in obsolete:
        for described in entry.files.values():
            target = checkpoint.shards_path / described["name"]
            report.bytes_freed += int(described["bytes"])
            target.unlink(missing_ok=True)
    report.bytes_freed -= sum(int(d["bytes"]) for e in entries if e not in old_entries for d in e.files.values())
    _update_index(checkpoint, obsolete, moves)
    report.keys_dropped = before - index.count()
    return report


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
            db.executemany(
                "UPDATE keys SET shard = ?, seq = ?, row = ? WHERE shard = ? AND row = ?",
                [(new, seq, position, old, row) for position, row in enumerate(live)],
            )
            db.execute("INSERT OR REPLACE INTO shards(name, seq) VALUES (?, ?)", (new, seq))
        for entry in obsolete:
            db.execute("DELETE FROM keys WHERE shard = ?", (entry.name,))
            db.execute("DELETE FROM shards WHERE name = ?", (entry.name,))
