"""A synthetic store of millions of keys for bench_scale.py, written directly in the store's
format (manifest, journal, results shards, keys.sqlite) without running anything: what
`clef checkpoint info` and `prune` cost on a store of that size.

The store holds `keys` results rows (no answers, no hidden states) in shards of `SHARD_ROWS`,
used by `RUNS` nightly runs: every key was last used by the latest run except `stale` of them
(1% by default), scattered over every shard, last used by the first run; so `prune --keep-runs 1`
drops them and rewrites every shard (its worst case: nothing to drop whole).
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SHARD_ROWS = 10_000
RUNS = 3
HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def random_keys(count: int, rng: np.random.Generator) -> pa.Array:
    """`count` distinct-looking 64-hex-digit keys, built without a Python string per key."""
    raw = rng.integers(0, 256, size=(count, 32), dtype=np.uint8)
    digits = np.empty((count, 64), dtype=np.uint8)
    digits[:, 0::2], digits[:, 1::2] = HEX[raw >> 4], HEX[raw & 15]
    offsets = np.arange(0, 64 * (count + 1), 64, dtype=np.int32)
    return pa.StringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(digits.tobytes()))


def shard_table(start: int, keys: pa.Array) -> pa.Table:
    from clef_cli.results import RESULT_SCHEMA

    count = len(keys)
    indices = pa.array(np.arange(start, start + count, dtype=np.int64))
    columns = {
        "id": pc.cast(indices, pa.string()),
        "record_index": indices,
        "prompt_tokens": pa.array(np.full(count, 100, dtype=np.int32)),
        "state_tokens_cut": pa.array(np.zeros(count, dtype=np.int32)),
        "error": pa.nulls(count, pa.string()),
        "error_kind": pa.nulls(count, pa.string()),
        "answers": pa.nulls(count, RESULT_SCHEMA.field("answers").type),
        "record_key": keys,
    }
    return pa.table(columns, schema=RESULT_SCHEMA)


def synthetic_store(path: Path, keys: int, stale: float = 0.01, seed: int = 0) -> float:
    """Write the store at `path`; returns the seconds it took."""
    from clef_cli.store.key_index import KeyIndex
    from clef_cli.store.manifest import write_manifest
    from clef_cli.store.shard_files import ipc_bytes, write_shard_file

    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    (path / "shards").mkdir(parents=True)
    write_manifest(path, {"model": {"id": "synthetic"}, "settings": {"dtype": "float32"}})
    index = KeyIndex(path / "keys.sqlite")
    runs = [index.begin_run(f"run{n}", started=time.time() - 86400 * (RUNS - n)) for n in range(RUNS)]
    for number in range(RUNS):
        index.finish_run(f"run{number}", {"run": keys, "reused": 0})
    index.close()
    db = sqlite3.connect(str(path / "keys.sqlite"), isolation_level=None)
    db.execute("PRAGMA synchronous=OFF")
    db.execute("BEGIN")
    lines = []
    for number, start in enumerate(range(0, keys, SHARD_ROWS), start=1):
        name = f"{number:08d}"
        table = shard_table(start, random_keys(min(SHARD_ROWS, keys - start), rng))
        described = write_shard_file(path / "shards", f"{name}.results.arrow", ipc_bytes(table), "sha256")
        lines.append(json.dumps({"name": name, "records": table.num_rows, "files": {"results": described},
                                 "run": "run0"}, sort_keys=True) + "\n")  # fmt: skip
        last = np.where(rng.random(table.num_rows) < stale, runs[0], runs[-1])
        rows = zip(table.column("record_key").to_pylist(), range(table.num_rows), last.tolist(), strict=True)
        db.executemany(
            "INSERT INTO keys(key, shard, seq, row, final, hidden, last_run) VALUES (?, ?, ?, ?, 1, 1, ?)",
            ((key, name, number, row, run) for key, row, run in rows),
        )
        db.execute("INSERT INTO shards(name, seq) VALUES (?, ?)", (name, number))
    db.execute("COMMIT")
    db.close()
    (path / "journal.jsonl").write_text("".join(lines), encoding="utf-8")
    return time.perf_counter() - started
