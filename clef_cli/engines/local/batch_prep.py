"""Batches with media are made ready for the model in an encoding worker, not on the main thread.

A 720p image is about 31 MB of float32 patches. Reading them back from the spool and joining
them into one batch tensor on the main process cost about a third of a simulated H200's time
(issue 24). The worker that prepares a batch reads or encodes its records, casts their media to
the model's dtype and writes them once into tensors in shared memory; the main process maps
those tensors (only a file descriptor is pickled) and hands them to the model as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from clef_cli.encoding.batching import ModelBatch, collate
from clef_cli.engines.local.workers import Planned, encode_record, in_pool_worker, pad_token_id, worker_media_dtype


@dataclass
class PreparedBatch:
    """A planned batch, collated; `failures` are (record index, error) of records that failed to encode."""

    batch: ModelBatch | None
    failures: list[tuple[int, str]]
    sent: bool = False
    """Made in a worker: the records' media travel only inside the batch's tensors."""

    def received(self) -> ModelBatch | None:
        """The batch, its records' media views of its tensors again (no copy)."""
        return self.batch.with_record_views() if self.sent and self.batch is not None else self.batch


def _shared(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Allocated in shared memory, so that sending it to the main process copies nothing."""
    return torch.empty(shape, dtype=dtype).share_memory_()


def prepare_batch(items: list[Planned]) -> PreparedBatch:
    """Run in a worker: each record's media from the spool (or encoded again), then one collate."""
    encoded, failures = [], []
    for planned in items:
        value = planned.ready() or encode_record(planned.record)
        if isinstance(value, str):
            failures.append((planned.record.index, value))
        else:
            encoded.append(value)
    if not encoded:
        return PreparedBatch(None, failures)
    if not in_pool_worker():
        return PreparedBatch(collate(encoded, pad_token_id(), media_dtype=worker_media_dtype()), failures)
    batch = collate(encoded, pad_token_id(), _shared, worker_media_dtype())
    return PreparedBatch(batch.without_record_media(), failures, sent=True)


def preparing_crashed(items: list[Planned]) -> None:
    """A worker died preparing this batch: None tells the caller to encode its records one by
    one, so that the record that crashes it is told apart from the others."""
    return None
