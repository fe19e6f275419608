"""The local scoring engine: read -> plan -> encode -> forward -> head -> commit -> write.

Records stream in windows (in input order). Each window is planned (exact prompt lengths, in
background workers, while the previous window runs on the model), sorted longest first into
token-budget batches, and run; every batch is committed to the checkpoint as soon as it is
scored. Only small per-record plan data and one or two windows of records are ever in memory;
media tensors exist only for the batches being encoded or run. The output is written at the end
from the committed shards, in input order, atomically. The lifecycle around this (release,
manifest, locks, checkpoint, output) is `job.open_job`, shared with the other engines.
"""

from __future__ import annotations

import shutil
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from clef_cli.encoding.batching import PlannedBatch
from clef_cli.engines.local.committer import BackgroundCommitter
from clef_cli.engines.local.executor import BatchExecutor
from clef_cli.engines.local.plan_report import DryRunReport, plan_report
from clef_cli.engines.local.planning import (
    Window,
    encode_pool,
    hidden_bytes_per_token,
    job_records,
    planned_windows,
    worker_count,
)
from clef_cli.engines.local.workers import Planned
from clef_cli.errors import ClefError, JobStopped
from clef_cli.job.lifecycle import Job, open_job
from clef_cli.job.output import passthrough_types
from clef_cli.job.plan import plan_job
from clef_cli.job.settings import ScoreSettings
from clef_cli.job.summary import JobSummary
from clef_cli.model.scoring import Scorer
from clef_cli.progress import Progress
from clef_cli.release import Release
from clef_cli.results import FailedRecord
from clef_cli.sizes import human_size
from clef_cli.stats import record_modality
from clef_cli.store.keep_policy import selective_share

__all__ = ["JobSummary", "ScoreJob", "ScoreSettings"]


def compute_dtype(settings: ScoreSettings) -> str:
    """The dtype this run computes in (part of the checkpoint's settings)."""
    from clef_cli.model.backbone import resolve_device, resolve_dtype

    return str(resolve_dtype(settings.dtype, resolve_device(settings.device))).removeprefix("torch.")


def _on_cpu(settings: ScoreSettings) -> bool:
    """Whether the backbone runs on the CPU, sharing its cores with the encoding workers."""
    from clef_cli.model.backbone import resolve_device

    return resolve_device(settings.device).type == "cpu"


class ScoreJob:
    """One `clef score` run; `run()` returns its summary, `dry_run()` its plan."""

    def __init__(
        self,
        settings: ScoreSettings,
        progress: Progress | None = None,
        stop: threading.Event | None = None,
        scorer: Scorer | None = None,
    ) -> None:
        self.settings = settings
        self.progress = progress or Progress()
        self.stop = stop or threading.Event()
        self.scorer = scorer
        self.batch_tokens = settings.max_batch_tokens
        """The token budget per batch, lowered for the rest of the job when the GPU runs out of memory."""

    def dry_run(self) -> DryRunReport:
        """Validate and plan everything without loading weights, refusing what the run would."""
        return plan_report(self.settings, self.progress, self.preflight)

    def preflight(self, settings: ScoreSettings, release: Release) -> None:
        """The engine's own start-up checks, before anything is written (the HF engine has none
        beyond the settings' and the device's)."""

    def engine_refusal(self, length: int) -> tuple[str, str] | None:
        """(error_kind, message) for a prompt this engine cannot run (asked at planning, and by a
        Ray actor for each record it encodes); the HF engine runs every prompt planning let through."""
        return None

    def start_scorer(self, release: Release, settings: ScoreSettings, folder: Path) -> Scorer:
        """This engine's scorer, loaded (HF: the model in this process); `folder` takes an engine's
        own log. A local run and each Ray actor load their scorer through this one call."""
        from clef_cli.model.scoring import load_scorer

        self.scorer = load_scorer(release, device=settings.device, dtype=settings.dtype)
        return self.scorer

    def actor_env(self) -> dict[str, str]:
        """The environment a process running this engine elsewhere (a Ray actor) needs from ours."""
        return {}

    def close(self) -> None:
        """End what the scorer runs outside this process (the vLLM worker); in process, nothing."""
        if self.scorer is not None:
            self.scorer.backbone.close()

    def refuse_for_engine(self, window: Window) -> Window:
        """The window with the records its engine cannot run moved to its failures, at planning,
        so no batch (and no model load) is spent on them."""
        kept: list[Planned] = []
        failures = list(window.failures)
        for item in window.planned:
            refusal = self.engine_refusal(item.length or 0)
            if refusal is None:
                kept.append(item)
                continue
            kind, message = refusal
            failures.append(FailedRecord(item.record.id, item.record.index, message, item.length or 0, kind))
            item.discard()
        return Window(kept, failures) if len(kept) < len(window.planned) else window

    def run(self) -> JobSummary:
        dtype = compute_dtype(self.settings)
        plan = plan_job(self.settings, self.preflight, progress=self.progress)
        with open_job(plan, self.progress, dtype, stop=self.stop) as job:
            settings = job.settings
            passthrough = (
                passthrough_types(job.plan.sources, settings.keep_columns, settings.limit)
                if settings.keep_columns
                else None
            )
            total = len(job.ledger.to_run)
            self.progress.start(total, total - job.ledger.counts.run)
            if job.ledger.counts.run:
                try:
                    self._score(job)
                except JobStopped:  # a stop while the model loads: nothing of this run is lost
                    return job.interrupted()
            with job.summary.stats.stage("output_write"):  # a stop before or during it: interrupted
                return job.finish(job.results(), self.engine_metadata(), passthrough=passthrough)

    def engine_metadata(self) -> dict[str, str]:
        """The engine's own provenance (the vLLM engine adds its version)."""
        return {}

    def score_marked(self, job: Job) -> None:
        """Compute and commit the records `job`'s ledger marks, writing no output (on_demand.py)."""
        self._score(job)

    def _score(self, job: Job) -> None:
        stats = job.summary.stats
        spool, spool_budget = _fresh_spool(job)
        committer = BackgroundCommitter(job.checkpoint)
        scoring = stats.scoring_started = time.perf_counter()
        try:
            with stats.stage("startup"):  # imports, the processor, starting the encoding processes
                workers = stats.workers = worker_count(job.settings)
                stats.backbone_on_cpu = _on_cpu(job.settings)
                dtype = compute_dtype(job.settings)
                media_dtype = None if dtype == "float32" else dtype
                pool = encode_pool(
                    job.settings, job.release, workers, spool, media_dtype, images_from_headers=True, stop=job.stop
                )
            with pool:
                executor = BatchExecutor(
                    job, pool, committer, lambda: self._load_scorer(job), self.stop, self._budget_lowered
                )
                self._run_windows(job, executor, spool_budget)
                with stats.stage("commit_wait"):
                    committer.drain()
                stats.scoring_seconds = time.perf_counter() - scoring - stats.stages["load"]
        finally:
            committer.close()
            shutil.rmtree(spool, ignore_errors=True)
        job.stopped()

    def _budget_lowered(self, tokens: int) -> None:
        self.batch_tokens = tokens

    def _load_scorer(self, job: Job) -> Scorer:
        if self.scorer is None:
            self.progress.note("loading the model")
            with job.summary.stats.stage("load"):
                self.start_scorer(job.release, job.settings, job.checkpoint.path)
        assert self.scorer is not None
        return self.scorer

    def _run_windows(self, job: Job, executor: BatchExecutor, spool_budget: int) -> None:
        """The records the ledger marks (new or retried prompts, first copies), in windows; the
        next window's first batches are made ready while this window's last ones run."""
        by_index: dict[int, Planned] = {}
        checked_disk = False

        def planned(window: Window) -> None:
            """On the main thread, before the window's batches: its counts, its failures, and
            (once) whether the hidden states will fit."""
            nonlocal checked_disk
            for item in window.planned:
                job.summary.stats.encoded(record_modality(item.record), item.length or 0, item.seconds)
            executor.commit([], window.failures)
            if window.planned and not checked_disk:
                _check_disk(job, window)
                checked_disk = True

        executor.run(self._stream(job, executor, spool_budget, by_index), by_index, planned)

    def _stream(
        self, job: Job, executor: BatchExecutor, spool_budget: int, by_index: dict[int, Planned]
    ) -> Iterator[Window | PlannedBatch]:
        """Each planned window, then its batches (on the executor's feeder thread)."""
        records = job_records(job.plan)
        skip = job.ledger.to_run.skip
        for window in planned_windows(executor.pool, records, job.settings.window, skip, spool_budget):
            window = self.refuse_for_engine(window)
            yield window
            if self.stop.is_set():
                return
            by_index.update((item.record.index, item) for item in window.planned)
            yield from executor.plan(window.planned)


def _fresh_spool(job: Job) -> tuple[Path, int]:
    """A fresh spool folder in the checkpoint and its budget per window (two windows are planned
    at once), so media decoded while planning are not decoded again when their batch runs."""
    spool = job.checkpoint.path / "spool"
    shutil.rmtree(spool, ignore_errors=True)  # left by a killed run
    spool.mkdir()
    budget = min(job.settings.media_spool_bytes, shutil.disk_usage(spool).free // 4)
    return spool, budget // 2


def _check_disk(job: Job, window: Window) -> None:
    """Refuse to start when the hidden states would not fit (estimated from the first window and,
    for `selective`, the share the policy stores: `selective_share`)."""
    settings, checkpoint = job.settings, job.checkpoint
    if settings.hidden_states == "drop":
        return
    share, how = selective_share(settings.hidden_states, settings.keep_below, settings.keep_sample, checkpoint.results)
    lengths = [p.length or 0 for p in window.planned]
    remaining = max(len(lengths), job.ledger.counts.run)
    per_token = hidden_bytes_per_token(settings, job.release.hidden_size)
    needed = int(statistics.fmean(lengths) * remaining * per_token * share)
    free = shutil.disk_usage(checkpoint.path).free
    if needed > free:
        raise ClefError(
            f"the hidden states of this job need about {human_size(needed)}{how} but only {human_size(free)} are "
            f"free under {checkpoint.path}; use --hidden-states selective (states of the uncertain records and a "
            "sample) or --hidden-states drop (results only), or --checkpoint on a larger disk"
        )
