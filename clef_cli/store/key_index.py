"""The checkpoint's index of record keys: which committed row holds each key's result, whether
that result is final, and which run last used it. SQLite (stdlib, WAL) in the checkpoint folder,
so a store of millions of keys is looked up on disk, never loaded into a Python dict.

The index is derived: the journal and its shards are the truth. Opening a checkpoint reconciles
the index with the journal (shards no longer journaled are forgotten, journaled shards not yet
indexed are indexed), so a kill between a journal line and its index rows, or a lost or damaged
`keys.sqlite`, costs a rebuild and never a wrong answer. Run history (for `checkpoint info` and
`prune`) lives only here: a rebuilt index dates each key by the run that computed it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import sqlite3
import threading
import time
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from clef_cli.errors import RETRIED_KINDS
from clef_cli.store import durable

INDEX_FILE = "keys.sqlite"
LOOKUP_CHUNK = 500
"""Keys per `IN (...)` query (SQLite's parameter limit is far above)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    key TEXT PRIMARY KEY,
    shard TEXT NOT NULL,
    seq INTEGER NOT NULL,
    row INTEGER NOT NULL,
    final INTEGER NOT NULL,
    hidden INTEGER NOT NULL,  -- 1: its hidden states are stored, or it needs none (an error)
    last_run INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS keys_by_shard ON keys(shard);
CREATE TABLE IF NOT EXISTS shards (
    name TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    file TEXT  -- its results file (a prune rewrites a shard under its name); NULL in older stores
);
CREATE TABLE IF NOT EXISTS runs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT UNIQUE NOT NULL,
    started REAL NOT NULL,
    finished REAL,
    counts TEXT,
    inputs TEXT,  -- JSON list of the run's inputs (absent in stores made before it was recorded)
    output TEXT,
    interrupted REAL  -- when a stop request ended it (Ctrl-C, SIGTERM: exit 130); NULL otherwise
);
"""
RUN_COLUMNS = ("seq", "run_id", "started", "finished", "counts", "inputs", "output", "interrupted")
ADDED_COLUMNS = (("runs", "inputs", "TEXT"), ("runs", "output", "TEXT"), ("shards", "file", "TEXT"))
ADDED_COLUMNS += (("runs", "interrupted", "REAL"),)
"""Columns a store made by an earlier version lacks, added when it is opened."""


class KeyIndex:
    """One connection, shared by the job's threads under a lock (the committer adds rows while
    the main thread reads)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.RLock()
        try:
            self.db = self._connect()
        except sqlite3.DatabaseError:  # damaged: it is only an index, so it is rebuilt
            for suffix in ("", "-wal", "-shm"):
                durable.unlink(Path(str(path) + suffix))
            self.db = self._connect()

    def _connect(self) -> sqlite3.Connection:
        durable.sqlite_opened(self.path, self.lock)
        db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        # FULL, not NORMAL: WAL with NORMAL may lose the last transactions to a power loss, and the
        # run history (`runs`, each key's `last_run`, what prune decides by) exists only here: the
        # journal rebuilds the keys, never when they were last used. One fsync per commit.
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA temp_store=FILE")
        db.executescript(_SCHEMA)
        # a store made before runs named their files or their interruption, or before shards
        # named their results file
        for table, column, kind in ADDED_COLUMNS:
            if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        return db

    def close(self) -> None:
        with self.lock:
            self.db.close()
            durable.sqlite_closed(self.path)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One transaction. A full disk (SQLITE_FULL) is raised as the OSError it is, so that a
        commit treats the index like every other file of the store."""
        with self.lock:
            durable.sqlite_transaction(self.path, self.db)
            try:
                self.db.execute("BEGIN")
                try:
                    yield self.db
                except BaseException:
                    if self.db.in_transaction:  # SQLite may have rolled back already
                        self.db.execute("ROLLBACK")
                    raise
                self.db.execute("COMMIT")
            except sqlite3.OperationalError as error:
                if getattr(error, "sqlite_errorcode", None) != sqlite3.SQLITE_FULL:
                    raise
                raise OSError(errno.ENOSPC, "No space left on device", str(self.path)) from error

    # ------------------------------------------------------------------ runs

    def begin_run(
        self, run_id: str, started: float | None = None, inputs: Sequence[str] = (), output: str | None = None
    ) -> int:
        """Record a run as it starts, with the files it reads and writes (for `checkpoint info`)."""
        with self.transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO runs(run_id, started, inputs, output) VALUES (?, ?, ?, ?)",
                (run_id, started or time.time(), json.dumps(list(inputs)) if inputs else None, output),
            )
            return int(db.execute("SELECT seq FROM runs WHERE run_id = ?", (run_id,)).fetchone()[0])

    def finish_run(self, run_id: str, counts: dict[str, int]) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE runs SET finished = ?, counts = ? WHERE run_id = ?", (time.time(), json.dumps(counts), run_id)
            )

    def interrupt_run(self, run_id: str, counts: dict[str, int]) -> None:
        """A stop request ended the run: when, and its counts so far (it stays unfinished, so
        `prune --keep-runs` does not count it)."""
        with self.transaction() as db:
            db.execute(
                "UPDATE runs SET interrupted = ?, counts = ? WHERE run_id = ? AND finished IS NULL",
                (time.time(), json.dumps(counts), run_id),
            )

    def runs(self, count_keys: bool = True) -> list[dict[str, Any]]:
        """Every run in order: its counts (None until it finished or was interrupted), inputs (a list, empty when not
        recorded), output, whether `prune --keep-runs` counts it, and how many keys it was the
        last to use (0 without `count_keys`: a scan of every key, which prune does without)."""
        with self.lock:
            rows = self.db.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs ORDER BY seq").fetchall()
            # counted here over one scan: SQLite's GROUP BY sorts every key (10M keys: 6.8 s, not 8.1 s)
            keys = self.db.execute("SELECT last_run FROM keys") if count_keys else ()
            used = Counter(last_run for (last_run,) in keys)
        runs = []
        for row in rows:
            run = dict(zip(RUN_COLUMNS, row, strict=True))
            run["counts"] = _json_or(run["counts"], None)
            run["inputs"] = _json_or(run["inputs"], [])
            runs.append(run | {"counted": counts_as_run(run), "keys_last_used": used.get(run["seq"], 0)})
        return runs

    # ------------------------------------------------------------------ shards

    def indexed_shards(self, journaled: dict[str, str]) -> dict[str, str | None]:
        """Shard name -> the results file indexed. A shard indexed before the store recorded its
        file gets the one `journaled` names (shard -> file): no prune has rewritten it since, and
        from now on a prune killed after rewriting it under its name is noticed at the next open."""
        with self.lock:
            indexed = dict(self.db.execute("SELECT name, file FROM shards"))
        unnamed = [(file, name) for name, file in journaled.items() if name in indexed and indexed[name] is None]
        if unnamed:
            with self.transaction() as db:
                db.executemany("UPDATE shards SET file = ? WHERE name = ?", unnamed)
            indexed |= {name: file for file, name in unnamed}
        return indexed

    def add_shard(self, name: str, table: pa.Table, has_hidden: bool, run_seq: int, file: str | None = None) -> None:
        """Index one committed shard's rows (`file`: its results file): a later shard's row wins,
        and a final result is never replaced by a transient one."""
        with self.transaction() as db:
            _insert_shard(db, name, table, has_hidden, run_seq, file)

    def add_keys(self, shards: Sequence[tuple[str, str]], rows: Iterable[tuple[str, str, int, int, int, int]]) -> None:
        """Index shards from their keys alone, in one transaction: `shards` (name, results file),
        `rows` (key, shard, row, final, hidden, run seq); the parts of a store's segments
        (store/remote/cache.py), whose results are downloaded only when read."""
        with self.transaction() as db:
            _upsert(db, ((key, shard, 0, row, final, hidden, run) for key, shard, row, final, hidden, run in rows))
            db.executemany("INSERT OR REPLACE INTO shards(name, seq, file) VALUES (?, 0, ?)", shards)

    def merge_runs(self, runs: dict[str, dict[str, Any]]) -> dict[str, int]:
        """Runs other machines recorded in the store's manifest (run id -> its record), added to
        this index's history or completed in it; run id -> seq."""
        seqs = {}
        with self.transaction() as db:
            for run_id, run in runs.items():
                started = run.get("started") or 0
                db.execute("INSERT OR IGNORE INTO runs(run_id, started) VALUES (?, ?)", (run_id, started))
                fields = {name: run.get(name) for name in ("finished", "interrupted", "output") if run.get(name)}
                fields |= {name: json.dumps(run[name]) for name in ("counts", "inputs") if run.get(name)}
                if fields:
                    sets = ", ".join(f"{name} = ?" for name in fields)
                    db.execute(f"UPDATE runs SET {sets} WHERE run_id = ?", (*fields.values(), run_id))
                seqs[run_id] = int(db.execute("SELECT seq FROM runs WHERE run_id = ?", (run_id,)).fetchone()[0])
        return seqs

    def reconcile(self, stale: set[str], missing: Sequence[tuple[str, pa.Table, bool, int, str | None]]) -> None:
        """In one transaction: forget the `stale` shards (no longer journaled: pruned, damaged;
        or rewritten by a prune) and index the `missing` ones (name, table, has_hidden, run seq,
        results file). A key found again in a
        missing shard keeps when it was last used: a prune killed after its journal switch moved
        kept keys to new shards, and their run history exists only here (without it the next
        prune would drop keys the last one kept)."""
        marks = ",".join("?" * len(stale)) or "NULL"
        with self.transaction() as db:
            db.execute("CREATE TEMP TABLE IF NOT EXISTS used (key TEXT PRIMARY KEY, last_run INTEGER NOT NULL)")
            db.execute("DELETE FROM temp.used")
            db.execute(f"INSERT INTO temp.used SELECT key, last_run FROM keys WHERE shard IN ({marks})", list(stale))
            db.execute(f"DELETE FROM keys WHERE shard IN ({marks})", list(stale))
            db.execute(f"DELETE FROM shards WHERE name IN ({marks})", list(stale))
            for name, table, has_hidden, run_seq, file in missing:
                _insert_shard(db, name, table, has_hidden, run_seq, file)
            db.execute(
                "UPDATE keys SET last_run = MAX(last_run, (SELECT u.last_run FROM temp.used u WHERE u.key = keys.key)) "
                "WHERE key IN (SELECT key FROM temp.used)"
            )
            db.execute("DELETE FROM temp.used")

    # ------------------------------------------------------------------ keys

    def count(self) -> int:
        with self.lock:
            return int(self.db.execute("SELECT COUNT(*) FROM keys WHERE final = 1").fetchone()[0])

    def locate(self, keys: Sequence[str]) -> dict[str, tuple[str, int]]:
        """key -> (shard, row) for the given keys that are indexed (a chunk at a time)."""
        found: dict[str, tuple[str, int]] = {}
        with self.lock:
            for start in range(0, len(keys), LOOKUP_CHUNK):
                chunk = list(keys[start : start + LOOKUP_CHUNK])
                marks = ",".join("?" * len(chunk))
                for key, shard, row in self.db.execute(
                    f"SELECT key, shard, row FROM keys WHERE key IN ({marks})", chunk
                ):
                    found[key] = (shard, row)
        return found

    def last_runs(self, keys: Sequence[str]) -> dict[str, int]:
        """key -> the seq of the latest run that used it, for the given keys that are indexed
        (read-only; train-head tells an edited record's old and new prompt apart with it)."""
        found: dict[str, int] = {}
        with self.lock:
            for start in range(0, len(keys), LOOKUP_CHUNK):
                chunk = list(keys[start : start + LOOKUP_CHUNK])
                marks = ",".join("?" * len(chunk))
                found.update(self.db.execute(f"SELECT key, last_run FROM keys WHERE key IN ({marks})", chunk))
        return found

    def latest_run(self) -> int | None:
        """The seq of the latest run that used a stored key (None for an empty store; read-only)."""
        with self.lock:
            return self.db.execute("SELECT MAX(last_run) FROM keys").fetchone()[0]

    def shard_counts(self) -> dict[str, int]:
        """shard -> keys the index points into it (a walk of the shard index, no key read)."""
        with self.lock:
            return dict(self.db.execute("SELECT shard, COUNT(*) FROM keys GROUP BY shard"))

    def unused_rows(self, kept_runs: Sequence[int]) -> dict[str, array]:
        """shard -> rows (unsorted, 8 bytes each) of the keys no run of `kept_runs` used last: what a
        prune drops, found by SQLite in one pass (only those rows come back to Python)."""
        query = "SELECT shard, row FROM keys"  # NOT IN (NULL) would be NULL: no key, not every key
        if kept_runs:
            query += f" WHERE last_run NOT IN ({','.join('?' * len(kept_runs))})"
        found: dict[str, array] = {}
        with self.lock:
            for shard, row in self.db.execute(query, list(kept_runs)):
                rows = found.get(shard)
                if rows is None:
                    rows = found[shard] = array("q")
                rows.append(row)
        return found

    def live_rows(self, shard: str, kept_runs: Sequence[int] | None = None) -> list[int]:
        """Rows of `shard` the index points to (used by a kept run, when `kept_runs` is given)."""
        query, params = "SELECT row FROM keys WHERE shard = ?", [shard]
        if kept_runs is not None:
            query += f" AND last_run IN ({','.join('?' * len(kept_runs)) or 'NULL'})"
            params += list(kept_runs)
        with self.lock:
            return sorted(row[0] for row in self.db.execute(query, params))


def _insert_shard(
    db: sqlite3.Connection, name: str, table: pa.Table, has_hidden: bool, run_seq: int, file: str | None
) -> None:
    """`add_shard`'s rows, inside the caller's transaction."""
    keys = table.column("record_key").to_pylist()
    kinds = table.column("error_kind").to_pylist()
    errors = table.column("error").to_pylist()
    seq = int(name) if name.isdigit() else 0
    rows = (
        (key, name, seq, row, int(kind not in RETRIED_KINDS), int(has_hidden or error is not None), run_seq)
        for row, (key, kind, error) in enumerate(zip(keys, kinds, errors, strict=True))
        if key is not None
    )
    _upsert(db, rows)
    db.execute("INSERT OR REPLACE INTO shards(name, seq, file) VALUES (?, ?, ?)", (name, seq, file))


def _upsert(db: sqlite3.Connection, rows: Iterable[tuple[str, str, int, int, int, int, int]]) -> None:
    """Index (key, shard, seq, row, final, hidden, run seq) rows: a later shard's row wins, and a
    final result is never replaced by a transient one, nor one with hidden states by one without."""
    db.executemany(
        "INSERT INTO keys(key, shard, seq, row, final, hidden, last_run) VALUES (?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT(key) DO UPDATE SET shard = excluded.shard, seq = excluded.seq, row = excluded.row, "
        "final = excluded.final, hidden = excluded.hidden, last_run = MAX(keys.last_run, excluded.last_run) "
        "WHERE excluded.seq >= keys.seq AND (excluded.final = 1 OR keys.final = 0) "
        "AND (excluded.hidden = 1 OR keys.hidden = 0 OR keys.final = 0)",
        rows,
    )


def _json_or(text: str | None, default: Any) -> Any:
    """A JSON column's value; `default` when empty or unreadable (an index is only derived data)."""
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def counts_as_run(run: dict[str, Any]) -> bool:
    """A run `prune --keep-runs` counts: it finished and used keys (its records' prompts were run
    or reused). A night over a broken export (every record invalid) and a run stopped before its
    end do not count, so they cannot push the runs that hold the store's keys out of the last N."""
    counts = run.get("counts") or {}
    return run.get("finished") is not None and counts.get("run", 0) + counts.get("reused", 0) > 0
