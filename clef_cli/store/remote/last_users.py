"""Which run used each key of a store in a bucket last, for `checkpoint info`'s "last user of N
keys": as a folder store counts it (docs/scoring.md), every key a run's records had, computed or
reused, so the same nights read the same on either kind of store, and on every machine.

A machine's key index knows only who computed a key (a part names its run) and what its own runs
used; what every run used is in the bucket (`runs/RUN.keys`, the keys its records had). The runs
are read newest first, and only while some key has no later user yet: on a nightly job over a
growing table the last night used nearly every key, so one or two lists are downloaded, not all.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from clef_cli.store import durable
from clef_cli.store.remote.manifests import Manifest
from clef_cli.store.remote.segments import read_keys

Checkpoint = Any
"""A `store.remote.store.RemoteCheckpoint` (not imported: that module imports this one)."""


def in_use_order(manifest: Manifest) -> list[str]:
    """The manifest's run ids, the first started first (the order `prune` keeps runs by)."""
    return [
        run_id for run_id, _ in sorted(manifest.runs.items(), key=lambda item: (item[1].get("started") or 0, item[0]))
    ]


def last_users(checkpoint: Checkpoint) -> dict[str, int]:
    """run id -> how many of the store's keys it used last (runs that are no key's last user are left out)."""
    index, manifest = checkpoint.index, checkpoint.chain.known
    assert index is not None
    order = in_use_order(manifest) if manifest is not None else []
    with index.lock:
        db = index.db
        db.execute("DROP TABLE IF EXISTS temp.last_user")
        db.execute("CREATE TEMP TABLE last_user (key TEXT PRIMARY KEY, rank INTEGER) WITHOUT ROWID")
        db.execute("INSERT INTO temp.last_user SELECT key, NULL FROM keys")
    try:
        for rank in range(len(order) - 1, -1, -1):
            name = manifest.runs[order[rank]].get("keys") if manifest is not None else None
            if name and _open_keys(index):
                _mark(checkpoint, name, rank)
        return _counted(index, order)
    finally:
        with index.lock:
            index.db.execute("DROP TABLE IF EXISTS temp.last_user")


def _open_keys(index: Any) -> bool:
    """Whether a key still has no user found (one a run read earlier may have used)."""
    with index.lock:
        return index.db.execute("SELECT 1 FROM temp.last_user WHERE rank IS NULL LIMIT 1").fetchone() is not None


def _mark(checkpoint: Checkpoint, name: str, rank: int) -> None:
    """The keys a run's records had (`runs/RUN.keys`) that no later run used: this run's."""
    index, chain = checkpoint.index, checkpoint.chain
    target = Path(checkpoint.path) / f".{rank}.last-user.keys.tmp"
    try:
        chain.bucket.download(chain.key(name), target)
        for batch in read_keys(target):
            rows = [(rank, key.hex()) for key in batch.column(0).to_pylist()]
            with index.lock:
                index.db.executemany("UPDATE temp.last_user SET rank = ? WHERE key = ? AND rank IS NULL", rows)
    finally:
        durable.unlink(target)


def _counted(index: Any, order: list[str]) -> dict[str, int]:
    """run id -> keys it used last: found in a run's list, else the index's own last run (the run
    whose part computed the key, or a run of this machine: a store whose runs kept no list)."""
    with index.lock:
        seqs = dict(index.db.execute("SELECT seq, run_id FROM runs"))
        found = index.db.execute(
            "SELECT u.rank, k.last_run, COUNT(*) FROM temp.last_user u JOIN keys k ON k.key = u.key "
            "GROUP BY u.rank, CASE WHEN u.rank IS NULL THEN k.last_run END"
        ).fetchall()
    counts: Counter[str] = Counter()
    for rank, last_run, count in found:
        run_id = order[rank] if rank is not None else seqs.get(last_run)
        if run_id is not None:
            counts[run_id] += count
    return dict(counts)
