"""Running planned batches: the next few are encoded in the background while the model runs the
current one, each outcome is committed as it comes, and running out of GPU memory lowers the
token budget for the rest of the job instead of stopping it."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from functools import cached_property
from typing import Any

from clef_cli import faults
from clef_cli.encoding.batching import PlanEntry, PlannedBatch, plan_batches
from clef_cli.encoding.encoded import EncodedRecord
from clef_cli.engines.local.committer import BackgroundCommitter
from clef_cli.engines.local.workers import EncodePool, Planned
from clef_cli.job import Job
from clef_cli.model.scoring import BatchRunner, Scorer
from clef_cli.results import FailedRecord, ScoredRecord, results_table
from clef_cli.store.hidden_store import HIDDEN_DTYPES, hidden_payload

PREFETCH_BATCHES = 3


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

    @cached_property
    def runner(self) -> BatchRunner:
        """The model is loaded when the first batch needs it (a finished job never loads it)."""
        return BatchRunner(self.load_scorer(), self.batch_tokens, self._lower_budget, stats=self.stats)

    def _lower_budget(self, tokens: int) -> None:
        self.batch_tokens = tokens
        self.budget_lowered(tokens)
        self.job.progress.note(f"out of GPU memory: batch token budget lowered to {tokens}")

    def plan(self, planned: list[Planned]) -> list[PlannedBatch]:
        entries = [PlanEntry(p.record.index, p.length or 0, p.audio_in_video) for p in planned]
        return plan_batches(entries, self.batch_tokens, self.job.settings.max_batch_size)

    def run(self, batches: list[PlannedBatch], by_index: dict[int, Planned]) -> None:
        """Run batches in order while the next few are encoded in the background."""
        prepared: deque[tuple[PlannedBatch, list[EncodedRecord | Future]]] = deque()
        upcoming = iter(batches)

        def prepare() -> None:
            for batch in upcoming:
                items = []
                for index in batch.indices:
                    ready = by_index[index].ready()
                    items.append(ready if ready is not None else self.pool.encode(by_index[index].record))
                prepared.append((batch, items))
                if len(prepared) >= PREFETCH_BATCHES:
                    return

        with self.stats.stage("encode_wait"):
            prepare()
        while prepared:
            with self.stats.stage("encode_wait"):
                batch, items = prepared.popleft()
                prepare()
                encoded, failures = self._collect(batch, items, by_index)
            self.commit([], failures)
            if encoded:
                self._score_and_commit(encoded)
            for index in batch.indices:
                by_index.pop(index).discard()
            if self.stop.is_set():
                for _, pending in prepared:
                    for item in pending:
                        if isinstance(item, Future):
                            item.cancel()
                return

    @staticmethod
    def _collect(
        batch: PlannedBatch, items: list[Any], by_index: dict[int, Planned]
    ) -> tuple[list[EncodedRecord], list[FailedRecord]]:
        encoded: list[EncodedRecord] = []
        failures: list[FailedRecord] = []
        for index, item in zip(batch.indices, items, strict=True):
            value = item.result() if isinstance(item, Future) else item
            if isinstance(value, str):
                record = by_index[index].record
                failures.append(FailedRecord(record.id, record.index, value))
            else:
                encoded.append(value)
        return encoded, failures

    def _score_and_commit(self, records: list[EncodedRecord]) -> None:
        """Forward and head for one planned batch, each outcome committed as it comes."""
        settings = self.job.settings
        for outcome in self.runner.run(records):
            hidden = None
            if outcome.records and settings.hidden_states == "keep":
                assert outcome.hidden_states is not None
                hidden = hidden_payload(outcome.records, outcome.hidden_states, HIDDEN_DTYPES[settings.hidden_dtype])
            self.job.summary.forwarded += len(outcome.records)
            tokens = sum(record.length for record in outcome.records)
            self.commit(outcome.scored, outcome.failures, hidden, tokens)

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
            room = 5 - len(summary.first_errors)
            summary.first_errors.extend(failure.error for failure in failures[:room])
            progress.advance(len(scored) + len(failures), tokens, len(failures))

        table = results_table(scored, failures)
        with self.stats.stage("commit_wait"):
            self.committer.submit(table, hidden, committed)
