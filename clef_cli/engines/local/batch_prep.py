"""Batches with media are made ready for the model in an encoding worker, not on the main thread.

A 720p image is about 22 MB of float32 patches. Reading them back from the spool and joining
them into one batch tensor on the main process cost about a third of a simulated H200's time
(issue 24). The worker that prepares a batch decodes its image records (planned from their
headers), reads its other records' media from the spool (or encodes them again), casts floating
media to the model's dtype, and writes the batch once into the order's shared-memory slot; the
main process maps the slot (only a file descriptor is pickled, once) and hands the tensors to
the model as they are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from clef_cli.encoding.batching import ModelBatch, collate
from clef_cli.engines.local.batch_slots import Slot, allocator_for
from clef_cli.engines.local.workers import (
    Planned,
    complete_record,
    in_pool_worker,
    pad_token_id,
    worker_media_dtype,
)


@dataclass
class BatchOrder:
    """What a worker gets to make one batch: its planned records and the slot to write it into."""

    items: list[Planned]
    slot: Slot | None = None


@dataclass
class PreparedBatch:
    """A planned batch, collated; `failures` are (record index, error, error kind) of records that
    failed to encode."""

    batch: ModelBatch | None
    failures: list[tuple[int, str, str]]
    sent: bool = False
    """Made in a worker: the records' media travel only inside the batch's tensors."""
    encode_seconds: dict[int, float] = field(default_factory=dict)
    """Per record index, the time its media took to decode here (for records planned from headers)."""
    slot_bytes: int = 0
    """The bytes the batch's tensors took (its slot grows to this when it was smaller)."""

    def received(self) -> ModelBatch | None:
        """The batch, its records' media views of its tensors again (no copy)."""
        return self.batch.with_record_views() if self.sent and self.batch is not None else self.batch


def prepare_batch(order: BatchOrder) -> PreparedBatch:
    """Run in a worker: each record's media from the spool (or encoded now), then one collate,
    written into the order's slot."""
    encoded, failures, seconds = [], [], {}
    for planned in order.items:
        value = planned.ready()
        if value is None:
            started = time.perf_counter()
            value = complete_record(planned)
            seconds[planned.record.index] = time.perf_counter() - started
        if isinstance(value, tuple):
            failures.append((planned.record.index, *value))
        else:
            encoded.append(value)
    if not encoded:
        return PreparedBatch(None, failures, encode_seconds=seconds)
    if not in_pool_worker():
        batch = collate(encoded, pad_token_id(), media_dtype=worker_media_dtype())
        return PreparedBatch(batch, failures, encode_seconds=seconds)
    allocate = allocator_for(order.slot)
    batch = collate(encoded, pad_token_id(), allocate, worker_media_dtype())
    return PreparedBatch(batch.without_record_media(), failures, True, seconds, allocate.needed)


def preparing_crashed(order: BatchOrder) -> None:
    """A worker died preparing this batch: None tells the caller to encode its records one by
    one, so that the record that crashes it is told apart from the others."""
    return None
