"""Stores in a bucket for tests that need no model: shards of made-up results (real tables of the
result schema, real hidden-state files) committed through the real checkpoint of a bucket store,
each `machine` with its own cache folder."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import torch

from clef_cli.results import RESULT_SCHEMA
from clef_cli.store.hidden_store import FORMAT_KEY, HIDDEN_FORMAT_VERSION, RECORDS_KEY, HiddenPayload
from clef_cli.store.location import StoreLocation, remote_location

FINGERPRINT = {
    "model": {"family": "omni", "weights": "w-test", "head_sha256": "h-test"},
    "settings": {"dtype": "float32"},
}
OTHER_MODEL = {
    "model": {"family": "omni", "weights": "w-other", "head_sha256": "h-test"},
    "settings": {"dtype": "float32"},
}


def key_of(number: int) -> str:
    return hashlib.sha256(f"record {number}".encode()).hexdigest()


def results(
    numbers: range | list[int],
    transient: set[int] = frozenset(),  # type: ignore[assignment]
    failed_for_good: set[int] = frozenset(),  # type: ignore[assignment]
) -> pa.Table:
    """One scored row per number (an error row for those in `transient`, and a final one, a
    missing image's, for those in `failed_for_good`), keyed by `key_of`."""
    rows = []
    for number in numbers:
        failed = number in transient or number in failed_for_good
        rows.append(
            {
                "id": f"r{number}",
                "record_index": number,
                "prompt_tokens": 10 + number % 7,
                "state_tokens_cut": None if failed else 0,
                "error": "the store kept failing" if failed else None,
                "error_kind": ("transient" if number in transient else "media") if failed else None,
                "answers": None
                if failed
                else [
                    {
                        "question_id": "urgent",
                        "type": "noul",
                        "answer": "no",
                        "confidence": 0.5,
                        "noul": 0.5,
                        "score": 0.5,
                        "labels": [{"label": "no", "probability": (number % 100) / 100, "logit": float(number)}],
                    }
                ],
                "record_key": key_of(number),
            }
        )
    return pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)


def hidden(numbers: range | list[int], width: int = 4) -> HiddenPayload:
    """A hidden-state shard of the records (their states: the number, repeated)."""
    tensors, described = {}, []
    for number in numbers:
        tensors[f"hidden.{number}"] = torch.full((3, width), float(number))
        tensors[f"input_ids.{number}"] = torch.tensor([1, 2, 3], dtype=torch.int32)
        described.append(
            {"index": number, "id": f"r{number}", "prompt_tokens": 3, "state_tokens_cut": 0, "questions": []}
        )
    import json

    return HiddenPayload(tensors, {FORMAT_KEY: str(HIDDEN_FORMAT_VERSION), RECORDS_KEY: json.dumps(described)})


def machine(uri: str, cache: Path) -> StoreLocation:
    """The store at `uri` as a machine whose cache folders live in `cache` sees it."""
    return remote_location(uri, cache)


def open_machine(uri: str, cache: Path, manifest: dict | None = None, sync_every: float | None = 3600.0):
    """The store opened as a job on that machine opens it (its sync turns far apart: tests sync by hand)."""
    from clef_cli.store.remote.store import RemoteCheckpoint

    return RemoteCheckpoint.open_remote(
        machine(uri, cache), FINGERPRINT if manifest is None else manifest, sync_every=sync_every, hold_lock=True
    )


@contextmanager
def fresh_machine(uri: str, cache: Path, manifest: dict | None = None) -> Iterator:
    """The store as a machine that never saw it opens it: nothing this process read of the store
    remembered, an empty cache folder, no sync of its own; closed after."""
    from clef_cli.store.remote import manifests

    manifests.forget()
    reader = open_machine(uri, cache, manifest=manifest, sync_every=None)
    try:
        yield reader
    finally:
        reader.close()


def commit(
    checkpoint,
    numbers: range | list[int],
    per_shard: int = 50,
    with_hidden: bool = False,
    failed_for_good: set[int] = frozenset(),  # type: ignore[assignment]
) -> None:
    """Commit the records' made-up results in shards of `per_shard` (the states of those not
    `failed_for_good`, `with_hidden`)."""
    numbers = list(numbers)
    for start in range(0, len(numbers), per_shard):
        chunk = numbers[start : start + per_shard]
        states = hidden([n for n in chunk if n not in failed_for_good]) if with_hidden else None
        checkpoint.commit(results(chunk, failed_for_good=failed_for_good), states)


def night(checkpoint, used: range, computed: range) -> None:
    """A run on the store: its records have the keys of `used` (a ledger, as a job keys them), it
    computes those of `computed`, and finishes."""
    from clef_cli.store.ledger import Ledger

    checkpoint.begin_run()
    ledger = Ledger(checkpoint.index, checkpoint.run_seq)
    with checkpoint.index.transaction() as db:
        db.executemany("INSERT INTO temp.job VALUES (?, ?, ?, NULL)", [(n, f"r{n}", key_of(n)) for n in used])
    checkpoint.ledger = ledger
    commit(checkpoint, computed)
    counts = {"run": len(computed), "reused": len(used) - len(computed)}
    checkpoint.index.finish_run(checkpoint.run_id, counts)


def reversed_rows(data: bytes) -> bytes:
    """A keys object rewritten valid: the same keys and parts, its `row` column reversed (bit rot
    or a bad copy tool that a hash check must catch)."""
    from pyarrow import ipc

    reader = ipc.open_file(pa.py_buffer(data))
    table = reader.read_all()
    table = table.set_column(2, "row", pa.array(table.column("row").to_pylist()[::-1], pa.uint32()))
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, reader.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


class Skewed:
    """The `time` module as a machine whose clock is `seconds` off sees it (monotonic untouched)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def time(self) -> float:
        import time

        return time.time() + self.seconds

    def __getattr__(self, name: str):
        import time

        return getattr(time, name)


MEMORY_ROOT = "s3://clef-memory"


def served_memory(monkeypatch, root: str = MEMORY_ROOT) -> Iterator:
    """A `memory` fixture's body: an empty obstore MemoryStore served as the bucket `root` (no
    retries), what this process read of stores forgotten either side; yields the MemoryStore."""
    from obstore.store import MemoryStore

    from clef_cli.locations import buckets, object_store
    from clef_cli.store.remote import manifests

    store = MemoryStore()
    monkeypatch.setattr(object_store, "RETRY_DELAYS", ())
    buckets.serve_from(root, store)
    manifests.forget()
    yield store
    buckets.serve_from(root, None)
    manifests.forget()
