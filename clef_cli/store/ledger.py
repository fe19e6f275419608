"""A job's ledger: every input record's place, id and key, read once before anything runs, and
what that means against the store: which records must run (new or retried prompts, first copy
only), which are reused and which are duplicates. Resuming an interrupted job and scoring a
grown table are the same operation: what the store holds is not run again.

The ledger is a temporary SQLite table beside the key index, so a job of millions of records
keeps only a byte per record in memory (`ToRun`). At the end, the output's rows are gathered from
the store by key, a chunk of positions at a time in input order, and given the current id and
record_index (`ordered`: no table of the whole job is ever held).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from itertools import repeat

import pyarrow as pa
import pyarrow.compute as pc

from clef_cli.errors import ClefError, error_of_copy
from clef_cli.inputs.record_chunks import record_chunks
from clef_cli.inputs.records import InvalidRecord, Record
from clef_cli.results import RESULT_SCHEMA, FailedRecord, RunCounts, results_table
from clef_cli.store.key_index import LOOKUP_CHUNK, KeyIndex
from clef_cli.store.record_key import MediaHasher, PromptShape, record_key

READ_CHUNK = 4096
SHARD_CACHE = 16 << 20
"""Bytes of result shards the output keeps in memory at once."""
SHARD_CACHE_COUNT = 64
"""Result shards the output keeps at once: each costs a fixed overhead beyond its bytes (its
batches' buffers and arrays), so many small shards must not fill the byte budget."""


RUN, INVALID = 1, 2


class ToRun:
    """One byte per record: RUN when this run must compute it, INVALID for a record without a
    prompt (its row comes from the ledger), 0 when the store or an earlier copy has it.
    `index in to_run.skip` is what the planner asks."""

    def __init__(self, total: int) -> None:
        self.flags = bytearray(total)

    def __len__(self) -> int:
        return len(self.flags)

    @property
    def count(self) -> int:
        return self.flags.count(RUN)

    @property
    def skip(self) -> _Skip:
        """Every record but those to run."""
        return _Skip(self.flags, (RUN,))

    @property
    def stored(self) -> _Skip:
        """The records the store (or an earlier copy) has: what a dry run does not plan."""
        return _Skip(self.flags, (RUN, INVALID))

    def done_bytes(self) -> bytes:
        """1 for every record not to run (Ray's read tasks take this)."""
        return bytes(self.flags.translate(bytes([1, 0, 1]) + bytes([1]) * 253))


class _Skip:
    def __init__(self, flags: bytearray, kept: tuple[int, ...]) -> None:
        self.flags = flags
        self.kept = kept

    def __contains__(self, index: int) -> bool:
        return not (index < len(self.flags) and self.flags[index] in self.kept)


class Ledger:
    """The job's records in a temporary table of the index's database."""

    def __init__(self, index: KeyIndex, run_seq: int) -> None:
        self.index = index
        self.run_seq = run_seq
        self.counts = RunCounts()
        self.to_run = ToRun(0)
        with index.lock:
            index.db.execute("DROP TABLE IF EXISTS temp.job")
            index.db.execute("CREATE TEMP TABLE job (position INTEGER PRIMARY KEY, id TEXT, key TEXT, error TEXT)")

    def build(
        self, records: Iterable[Record | InvalidRecord], prompt: PromptShape, media: MediaHasher, needs_hidden: bool
    ) -> Ledger:
        """Key every record (no media decoded; remote media fetched), then decide what runs."""
        flags = bytearray()  # a byte per record: INVALID for those without a key
        for chunk in record_chunks(records, repeat(READ_CHUNK)):  # ended early by inline media bytes
            media.prefetch(item for item in chunk if isinstance(item, Record))
            rows = [
                (item.index, item.id, None, item.error)
                if isinstance(item, InvalidRecord)
                else (item.index, item.id, record_key(item, prompt, media), None)
                for item in chunk
            ]
            with self.index.transaction() as db:
                db.executemany("INSERT OR REPLACE INTO temp.job VALUES (?, ?, ?, ?)", rows)
            media.flush()
            flags.extend(bytes(max(0, max(row[0] for row in rows) + 1 - len(flags))))
            for row in rows:
                if row[2] is None:
                    flags[row[0]] = INVALID
        with self.index.lock:
            self.index.db.execute("CREATE INDEX temp.job_by_key ON job(key)")
        self.to_run = ToRun(0)
        self.to_run.flags = flags
        self._decide(len(flags), needs_hidden)
        return self

    def _decide(self, total: int, needs_hidden: bool) -> None:
        counts = self.counts = RunCounts(records=total)
        with self.index.lock:
            groups = self.index.db.execute(
                "SELECT MIN(j.position), COUNT(*), k.final, k.hidden, k.key IS NOT NULL FROM job j "
                "LEFT JOIN keys k ON k.key = j.key WHERE j.key IS NOT NULL GROUP BY j.key"
            )
            keyed = 0
            for first, copies, final, hidden, stored in groups:
                keyed += copies
                counts.duplicates += copies - 1
                if not stored or not final:
                    counts.retried += int(bool(stored))
                    self.to_run.flags[first] = RUN
                elif needs_hidden and not hidden:
                    counts.unhidden += 1
                    self.to_run.flags[first] = RUN
                else:
                    counts.reused += 1
            self.index.db.execute(
                "UPDATE keys SET last_run = MAX(last_run, ?) WHERE key IN (SELECT key FROM temp.job)", (self.run_seq,)
            )
        counts.invalid = total - keyed
        counts.run = self.to_run.count

    def unhidden_rows(self) -> list[tuple[str, int]]:
        """(shard, row) of this job's stored final results that have no hidden states (errors
        need none): what a `keep` run computes again, and a `selective` or `drop` one does not."""
        with self.index.lock:
            query = (
                "SELECT shard, row FROM keys WHERE key IN (SELECT key FROM temp.job) AND final = 1 AND hidden = 0 "
                "ORDER BY shard, row"
            )
            return list(self.index.db.execute(query))

    def stored_rows(self) -> dict[str, list[int]]:
        """shard -> the rows that hold this job's keys (what `--rehead` reads, and no more)."""
        rows: dict[str, list[int]] = {}
        with self.index.lock:
            query = "SELECT shard, row FROM keys WHERE key IN (SELECT key FROM temp.job) ORDER BY shard, row"
            for shard, row in self.index.db.execute(query):
                rows.setdefault(shard, []).append(row)
        return rows

    # ------------------------------------------------------------------ committing

    def keyed(self, table: pa.Table) -> pa.Table:
        """`table` (rows of this job) with each row's record_key from the ledger."""
        positions = table.column("record_index").to_pylist()
        keys = self.keys_of(positions)
        column = pa.array([keys.get(position) for position in positions], pa.string())
        return table.set_column(table.schema.get_field_index("record_key"), "record_key", column)

    def sampled(self, fraction: float) -> bytes:
        """One byte per record position, 1 when its key is in `--keep-sample`'s sample
        (store/keep_policy.py), so every engine chooses the same records without the keys."""
        from clef_cli.store.keep_policy import sample_flags

        with self.index.lock:
            rows = self.index.db.execute("SELECT position, key FROM temp.job WHERE key IS NOT NULL")
            return sample_flags(rows, len(self.to_run), fraction)

    def restrict(self, ids: set[str]) -> int:
        """Run only the marked records whose id is in `ids` (train-head computes the states of its
        gold records, no others); returns how many stay marked."""
        with self.index.lock:
            for position, record_id in self.index.db.execute("SELECT position, id FROM temp.job"):
                if record_id not in ids and self.to_run.flags[position] == RUN:
                    self.to_run.flags[position] = 0
        self.counts.run = self.to_run.count
        return self.counts.run

    def keys_of(self, positions: list[int]) -> dict[int, str]:
        """position -> record key, for the given positions of this job that have one."""
        keys: dict[int, str] = {}
        with self.index.lock:
            for start in range(0, len(positions), LOOKUP_CHUNK):
                chunk = positions[start : start + LOOKUP_CHUNK]
                marks = ",".join("?" * len(chunk))
                query = f"SELECT position, key FROM temp.job WHERE position IN ({marks})"
                keys.update(self.index.db.execute(query, chunk))
        return keys

    # ------------------------------------------------------------------ the output

    def _rows(self, chunk: int = 8192) -> Iterator[list[tuple[int, str, str | None, str | None]]]:
        with self.index.lock:
            cursor = self.index.db.execute("SELECT position, id, key, error FROM temp.job ORDER BY position")
            while rows := cursor.fetchmany(chunk):
                yield rows

    def ordered(self, index: KeyIndex, open_shard: Callable[[str], pa.Table]) -> Iterator[pa.Table]:
        """One row per record of this job, in input order, a chunk of positions at a time: its
        key's stored row under its own id and index; invalid records from the ledger.
        `index`/`open_shard`: the store to gather from (at most SHARD_CACHE bytes and
        SHARD_CACHE_COUNT of its shards held at once, so memory stays flat however many the job
        reads)."""
        shards = ShardCache(open_shard, SHARD_CACHE, SHARD_CACHE_COUNT)
        for rows in self._rows():
            pieces = list(self._gathered(rows, index, shards))
            table = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
            yield table.take(pc.sort_indices(table.column("record_index")))

    def _gathered(
        self, rows: list[tuple[int, str, str | None, str | None]], index: KeyIndex, shards: ShardCache
    ) -> Iterator[pa.Table]:
        """The rows of one chunk of positions: the invalid ones, then the stored ones shard by shard."""
        found = index.locate(sorted({key for _, _, key, _ in rows if key is not None}))
        invalid = [FailedRecord(rid, pos, err or "", kind="invalid") for pos, rid, key, err in rows if key is None]
        if invalid:
            yield results_table([], invalid)
        by_shard: dict[str, list[tuple[int, int, str]]] = {}
        for position, record_id, key, _ in rows:
            if key is None:
                continue
            if key not in found:
                raise ClefError(
                    f"the checkpoint holds no result for record {record_id!r} (key {key[:12]}); rerun the job"
                )
            shard, row = found[key]
            by_shard.setdefault(shard, []).append((row, position, record_id))
        for shard, wanted in by_shard.items():
            taken = shards.take(shard, [row for row, _, _ in wanted])
            if taken.column("error").null_count < len(taken):  # a failed prompt: each copy names itself
                errors = zip(taken.column("error").to_pylist(), taken.column("id").to_pylist(), wanted, strict=True)
                named = [error and error_of_copy(error, stored, rid) for error, stored, (_, _, rid) in errors]
                taken = taken.set_column(taken.schema.get_field_index("error"), "error", pa.array(named, pa.string()))
            taken = taken.set_column(0, "id", pa.array([rid for _, _, rid in wanted], pa.string()))
            taken = taken.set_column(1, "record_index", pa.array([pos for _, pos, _ in wanted], pa.int64()))
            yield taken.cast(RESULT_SCHEMA)


class ShardCache:
    """Committed shards' results, the least recently used dropped beyond `budget` bytes or
    `count` shards. A shard is copied out of its map into one batch when opened: a mapped shard
    of many batches costs several times its bytes (the pages `take` touches, and its arrays),
    and every shard kept mapped counts in the process's memory until it is closed."""

    def __init__(self, open_shard: Callable[[str], pa.Table], budget: int, count: int = SHARD_CACHE_COUNT) -> None:
        self.open_shard = open_shard
        self.budget = budget
        self.count = count
        self.tables: OrderedDict[str, pa.Table] = OrderedDict()
        self.bytes = 0

    def take(self, shard: str, rows: list[int]) -> pa.Table:
        table = self.tables.get(shard)
        if table is None:
            table = self.tables[shard] = self.open_shard(shard).combine_chunks()
            self.bytes += table.nbytes
            while (self.bytes > self.budget or len(self.tables) > self.count) and len(self.tables) > 1:
                _, dropped = self.tables.popitem(last=False)
                self.bytes -= dropped.nbytes
        self.tables.move_to_end(shard)
        return table.take(pa.array(rows, pa.int64()))
