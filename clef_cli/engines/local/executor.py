"""Running planned batches: a feeder thread has the next few made ready in the background while
the model runs the current one, each outcome is committed as it comes, and running out of GPU
memory lowers the token budget for the rest of the job instead of stopping it."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

from clef_cli import faults
from clef_cli.encoding.batching import ModelBatch, PlanEntry, PlannedBatch, plan_batches
from clef_cli.encoding.encoded import EncodedRecord
from clef_cli.engines.local.batch_feed import BatchFeed
from clef_cli.engines.local.batch_prep import BatchOrder, PreparedBatch, prepare_batch, preparing_crashed
from clef_cli.engines.local.batch_slots import BatchSlots, Slot
from clef_cli.engines.local.committer import BackgroundCommitter
from clef_cli.engines.local.encode_pool import EncodePool
from clef_cli.engines.local.workers import Planned
from clef_cli.job.lifecycle import Job
from clef_cli.model.backbone import resolve_device
from clef_cli.model.scoring import BatchRunner, Scorer
from clef_cli.results import FailedRecord, ScoredRecord
from clef_cli.stats import record_modality
from clef_cli.store.hidden_store import HIDDEN_DTYPES
from clef_cli.store.keep_policy import KeepPolicy, split_outcome

PREFETCH_BATCHES = 3
W = TypeVar("W")

Pending = Future | list[EncodedRecord | Future]
"""A batch being made ready: one worker's whole batch, or its records one by one."""


@dataclass
class Launched:
    """A batch made ready and handed to the backbone, waiting for its forward's outcome."""

    batch: PlannedBatch
    encoded: list[EncodedRecord]
    model_batch: ModelBatch | None
    failures: list[FailedRecord]
    slot: Slot | None
    slot_bytes: int


def _failed(planned: Planned, error: str, kind: str = "media") -> FailedRecord:
    return FailedRecord(planned.record.id, planned.record.index, error, kind=kind)


def _pinned(future: Future) -> PreparedBatch | None:
    """On the helper thread: the worker's batch copied once into page-locked memory, while the
    main thread runs the forward before it (the copy releases the GIL)."""
    ready: PreparedBatch | None = future.result()
    if ready is not None and ready.batch is not None:
        ready.batch = ready.batch.pinned()
    return ready


class BatchExecutor:
    def __init__(
        self,
        job: Job,
        pool: EncodePool,
        committer: BackgroundCommitter,
        scorer: Callable[[], Scorer],
        stop: threading.Event,
        budget_lowered: Callable[[int], None] = lambda tokens: None,
    ) -> None:
        self.job = job
        self.pool = pool
        self.committer = committer
        self.load_scorer = scorer
        self.stop = stop
        self.stats = job.summary.stats
        self.batch_tokens = job.settings.max_batch_tokens
        self.budget_lowered = budget_lowered
        self.slots = BatchSlots()

    @cached_property
    def runner(self) -> BatchRunner:
        """The model is loaded when the first batch needs it (a finished job never loads it)."""
        return BatchRunner(self.load_scorer(), self.batch_tokens, self._lower_budget, stats=self.stats)

    @property
    def depth(self) -> int:
        """Batches in flight at once: the backbone's, once loaded (a job whose batches all failed
        to encode never loads it)."""
        runner: BatchRunner | None = self.__dict__.get("runner")
        return runner.scorer.backbone.in_flight if runner is not None else 1

    def _lower_budget(self, tokens: int) -> None:
        self.batch_tokens = tokens
        self.budget_lowered(tokens)
        self.job.progress.note(f"out of GPU memory: batch token budget lowered to {tokens}")

    def plan(self, planned: list[Planned]) -> list[PlannedBatch]:
        entries = [PlanEntry(p.record.index, p.length or 0, p.audio_in_video) for p in planned]
        return plan_batches(entries, self.batch_tokens, self.job.settings.max_batch_size)

    def run(
        self, stream: Iterable[PlannedBatch | W], by_index: dict[int, Planned], on_other: Callable[[W], None]
    ) -> None:
        """Run the stream's batches in order while a feeder thread has the next few made ready in
        the background; its other items (planned windows) go to `on_other`, on this thread, before
        their batches. `by_index` holds the planned records of the batches drawn so far."""
        on_gpu = resolve_device(self.job.settings.device).type == "cuda"
        pinner = ThreadPoolExecutor(1, "clef-pin") if on_gpu else None
        feed: BatchFeed[tuple[Pending, Slot | None]] = BatchFeed(
            stream, lambda batch: self._prepare(batch, by_index, pinner), PREFETCH_BATCHES
        )
        launched: deque[Launched | W] = deque()
        try:
            while not self.stop.is_set():
                with self.stats.stage("encode_wait"):
                    item = feed.next()
                if item is None:
                    break
                launched.append(item if not isinstance(item, tuple) else self._launch(*item, by_index))
                self._finish_ready(launched, by_index, on_other)
            while launched:  # the batches in flight run to their commit, a stop request or not
                self._finish(launched.popleft(), by_index, on_other)
        finally:
            for _, (pending, _) in feed.close():
                for waiting in pending if isinstance(pending, list) else [pending]:
                    if isinstance(waiting, Future):
                        waiting.cancel()
            if pinner is not None:
                pinner.shutdown(wait=False, cancel_futures=True)

    def _launch(
        self, batch: PlannedBatch, prepared: tuple[Pending, Slot | None], by_index: dict[int, Planned]
    ) -> Launched:
        """A batch made ready (its failures committed) and, where the backbone runs ahead, started."""
        pending, slot = prepared
        with self.stats.stage("encode_wait"):
            encoded, model_batch, failures, slot_bytes = self._collect(batch, pending, by_index)
        if encoded:
            self.runner.submit(encoded)
        return Launched(batch, encoded, model_batch, failures, slot, slot_bytes)

    def _finish_ready(self, launched: deque[Launched | W], by_index: dict[int, Planned], on_other: Callable) -> None:
        """Finish, in order, what need not wait: windows at the front, and batches beyond the
        backbone's depth in flight (with an in-process backbone, each batch at once)."""
        while launched and (
            not isinstance(launched[0], Launched) or sum(isinstance(item, Launched) for item in launched) >= self.depth
        ):
            self._finish(launched.popleft(), by_index, on_other)

    def _finish(self, item: Launched | W, by_index: dict[int, Planned], on_other: Callable[[W], None]) -> None:
        """A planned window's bookkeeping, or a batch's forward, head and commits, in stream order."""
        if not isinstance(item, Launched):
            on_other(item)
            return
        self.commit([], item.failures)
        if item.encoded:
            self._score_and_commit(item.encoded, item.model_batch)
            self.runner.scorer.backbone.release_states()
        if item.slot is not None:  # the batch has run: its slot can take another
            self.slots.give_back(item.slot, item.slot_bytes)
        for index in item.batch.indices:
            by_index.pop(index).discard()

    def _prepare(
        self, batch: PlannedBatch, by_index: dict[int, Planned], pinner: ThreadPoolExecutor | None
    ) -> tuple[Pending, Slot | None]:
        """A batch with media is collated by an encoding worker into a shared-memory slot (Future
        of a PreparedBatch, pinned on a helper thread for a GPU); a text batch is collated here,
        from its planned encodings."""
        planned = [by_index[index] for index in batch.indices]
        if not any(item.record.has_media for item in planned):
            return [item.ready() or self.pool.encode(item.record) for item in planned], None
        slot = self.slots.take() if self.pool.workers else None
        future = self.pool.urgent(prepare_batch, BatchOrder(planned, slot), preparing_crashed)
        return (future if pinner is None else pinner.submit(_pinned, future)), slot

    def _collect(
        self, batch: PlannedBatch, pending: Pending, by_index: dict[int, Planned]
    ) -> tuple[list[EncodedRecord], ModelBatch | None, list[FailedRecord], int]:
        """The batch's encodings (and the worker's collated batch, and the bytes it took)."""
        if isinstance(pending, Future):
            ready: PreparedBatch | None = pending.result()
            if ready is None:  # a worker crashed on it: encode its records one by one
                pending = [self.pool.encode(by_index[index].record) for index in batch.indices]
            else:
                for index, seconds in ready.encode_seconds.items():
                    self.stats.encoding_time(record_modality(by_index[index].record), seconds)
                failures = [_failed(by_index[index], error, kind) for index, error, kind in ready.failures]
                model_batch = ready.received()
                encoded = model_batch.records if model_batch is not None else []
                return encoded, model_batch, failures, ready.slot_bytes
        encoded: list[EncodedRecord] = []
        failures = []
        for index, item in zip(batch.indices, pending, strict=True):
            value = item.result() if isinstance(item, Future) else item
            if isinstance(value, tuple):  # (the error, its kind)
                failures.append(_failed(by_index[index], *value))
            else:
                encoded.append(value)
        return encoded, None, failures, 0

    @cached_property
    def keep(self) -> KeepPolicy:
        return self.job.keep_policy()

    def _score_and_commit(self, records: list[EncodedRecord], batch: ModelBatch | None) -> None:
        """Forward and head for one planned batch, each outcome committed as it comes: the records
        whose states the policy keeps in one shard with them, the others in one without."""
        dtype = HIDDEN_DTYPES[self.job.settings.hidden_dtype]
        for outcome in self.runner.run(records, batch):
            split = split_outcome(self.keep, outcome, dtype)
            self.job.summary.forwarded += len(outcome.records)
            tokens = sum(record.length for record in outcome.records)
            first = bool(split.kept or outcome.failures)  # the tokens count with whichever commit is made
            self.commit(split.kept, outcome.failures, split.hidden, tokens if first else 0)
            self.commit(split.rest, [], tokens=0 if first else tokens)

    def commit(
        self, scored: list[ScoredRecord], failures: list[FailedRecord], hidden: Any = None, tokens: int = 0
    ) -> None:
        if not scored and not failures:
            return
        summary, progress = self.job.summary, self.job.progress

        def committed() -> None:
            faults.after_commit()
            summary.committed += len(scored) + len(failures)
            summary.tokens += tokens
            summary.failed += len(failures)
            progress.advance(len(scored) + len(failures), tokens, len(failures))

        with self.stats.stage("commit_wait"):
            self.committer.submit(scored, failures, hidden, committed)
