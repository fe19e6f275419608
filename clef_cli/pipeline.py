"""The scoring job: read -> plan -> encode -> forward -> head -> commit -> write.

Records stream in windows (in input order). Each window is planned (exact prompt lengths, in
background workers, while the previous window runs on the model), sorted longest first into
token-budget batches, and run; every batch is committed to the checkpoint as soon as it is
scored. Only small per-record plan data and one or two windows of records are ever in memory;
media tensors exist only for the batches being encoded or run. The output is written at the end
from the committed shards, in input order, atomically.
"""

from __future__ import annotations

import contextlib
import math
import queue
import shutil
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import torch

from clef_cli import __version__, faults
from clef_cli.batching import PlanEntry, PlannedBatch, plan_batches
from clef_cli.checkpoint import (
    Checkpoint,
    DoneSet,
    input_fingerprint,
)
from clef_cli.errors import ClefError, UsageError
from clef_cli.hidden_store import HIDDEN_DTYPES, hidden_payload
from clef_cli.locks import job_locks
from clef_cli.media import MediaLimits
from clef_cli.output import (
    OutputCounts,
    OutputSpec,
    passthrough_types,
    remove_stale_temporaries,
    write_output,
)
from clef_cli.parquet_rows import StructNulls
from clef_cli.progress import Progress
from clef_cli.prompt import EncodedRecord, OverflowPolicy
from clef_cli.quality.calibrate import load_calibration
from clef_cli.records import InvalidRecord, Record, count_records, load_questions_file, read_records
from clef_cli.release import DEFAULT_MODEL, Release, file_sha256, resolve_release, weights_fingerprint
from clef_cli.results import results_table
from clef_cli.scoring import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_BATCH_TOKENS,
    BatchRunner,
    FailedRecord,
    ScoredRecord,
    Scorer,
)
from clef_cli.sources import expand_inputs, local_path
from clef_cli.stats import JobStats, modality
from clef_cli.workers import (
    EncodePool,
    EncoderSpec,
    Planned,
    decode_threads_per_worker,
    default_workers,
    within_budget,
)

PREFETCH_BATCHES = 3


@dataclass
class ScoreSettings:
    """Everything `clef score` can be told; a library caller builds this directly."""

    inputs: Sequence[str | Path]
    """Local paths or URIs (resolved by `sources`)."""
    output: Path
    model: str = DEFAULT_MODEL
    revision: str | None = None
    questions: Path | None = None
    max_length: int | None = None
    """None: the model family's default (64000 for Clef-Omni, 16384 for the dense family)."""
    overflow: OverflowPolicy = OverflowPolicy.truncate
    struct_nulls: StructNulls = StructNulls.refuse
    """What a null inside a Parquet struct column of state/questions means (see parquet_rows)."""
    limits: MediaLimits = field(default_factory=MediaLimits)
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    device: str = "auto"
    dtype: str | None = None
    layout: str = "wide"
    keep_columns: tuple[str, ...] = ()
    limit: int | None = None
    workers: int | None = None
    """Background encoding processes; None: none on the CPU (the model already uses every core);
    beside a GPU every usable core but one, bounded by memory (`workers.default_workers`)."""
    window: int = 8192
    checkpoint: Path | None = None
    hidden_states: str = "keep"
    hidden_dtype: str = "bfloat16"
    restart: bool = False
    row_group_size: int = 16384
    rehead: Path | None = None
    calibration: Path | None = None
    """A `clef calibrate` file applied when the output is written; not part of the checkpoint's
    settings, so a finished job can be recalibrated without running the model."""
    media_spool_bytes: int = 32 << 30
    """Disk for media tensors kept from planning (beside the checkpoint, a quarter of the free
    space at most), so that media are decoded once, not twice."""

    def for_release(self, release: Release) -> ScoreSettings:
        """These settings with the defaults that depend on the model family filled in."""
        if self.max_length is not None:
            return self
        from clef_cli.families import family_of

        return replace(self, max_length=family_of(release).default_max_length)

    @property
    def checkpoint_path(self) -> Path:
        return self.checkpoint or self.output.with_name(self.output.name + ".ckpt")

    def validate(self) -> None:
        try:
            self.struct_nulls = StructNulls(self.struct_nulls)  # a library caller may pass the name
        except ValueError:
            raise UsageError(f"--struct-nulls must be refuse, absent or null, not {self.struct_nulls!r}") from None
        if self.layout not in ("wide", "long"):
            raise UsageError(f"--layout must be 'wide' or 'long', not {self.layout!r}")
        if self.hidden_states not in ("keep", "drop"):
            raise UsageError(f"--hidden-states must be 'keep' or 'drop', not {self.hidden_states!r}")
        if self.hidden_dtype not in HIDDEN_DTYPES:
            raise UsageError(f"--hidden-dtype must be one of {', '.join(HIDDEN_DTYPES)}")
        if self.output.suffix.lower() not in (".parquet", ".pq"):
            raise UsageError(f"output {self.output} must end in .parquet")
        if self.output.exists() and self.output.is_dir():
            raise UsageError(f"output {self.output} is a folder")
        if not self.output.parent.exists():
            raise UsageError(f"output folder {self.output.parent} does not exist")
        if self.calibration is not None:
            load_calibration(self.calibration)
        local_inputs = (local_path(location) for location in self.inputs)
        if self.output.resolve() in {path.resolve() for path in local_inputs if path is not None}:
            raise UsageError("the output would overwrite an input")


@dataclass
class JobSummary:
    output: Path | None
    records: int = 0
    scored: int = 0
    failed: int = 0
    resumed: int = 0
    forwarded: int = 0
    """Records run through the thinker in this run."""
    committed: int = 0
    """Records committed to the checkpoint in this run (scored or failed)."""
    tokens: int = 0
    seconds: float = 0.0
    interrupted: bool = False
    first_errors: list[str] = field(default_factory=list)
    stats: JobStats = field(default_factory=JobStats)
    """Where the time went (stage times are measured by the local engine only)."""

    def final_stats(self) -> JobStats:
        """The stats with the run's totals: wall time, output records, tokens run this time."""
        self.stats.wall_seconds = self.seconds
        self.stats.records = self.records
        self.stats.tokens = self.tokens
        return self.stats

    def count(self, written: OutputCounts) -> None:
        """Totals from the written output (which also holds records resumed from the checkpoint)."""
        self.records = written.records
        self.failed = written.failed
        self.scored = written.records - written.failed


@dataclass
class DryRunReport:
    records: int = 0
    valid: int = 0
    invalid: int = 0
    already_done: int = 0
    lengths: list[int] = field(default_factory=list)
    batches: int = 0
    audio_in_video_batches: int = 0
    padded_tokens: int = 0
    first_errors: list[str] = field(default_factory=list)
    hidden_state_bytes: int = 0

    @property
    def padding_waste(self) -> float:
        real = sum(self.lengths)
        return self.padded_tokens / real - 1 if real else 0.0

    def percentiles(self) -> dict[str, int]:
        if not self.lengths:
            return {}
        ordered = sorted(self.lengths)

        def at(fraction: float) -> int:
            return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)]

        return {"min": ordered[0], "p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": ordered[-1]}


# ----------------------------------------------------------------------------- planning


@dataclass
class Window:
    """A slice of the input in order: planned records and records that failed before planning."""

    planned: list[Planned]
    failures: list[FailedRecord]


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def planned_windows(
    pool: EncodePool,
    records: Iterable[Record | InvalidRecord],
    window: int,
    skip: Any = (),
    media_budget: int = 0,
) -> Iterator[Window]:
    """Windows in input order; the next one is planned in the background while the caller runs
    the current one. Each window keeps at most `media_budget` bytes of spooled media tensors
    from planning; the rest are decoded again when their batch runs."""

    def submit(chunk: list[Record | InvalidRecord]) -> tuple[list[FailedRecord], list[Future]]:
        failures = [FailedRecord(item.id, item.index, item.error) for item in chunk if isinstance(item, InvalidRecord)]
        futures = [pool.plan(item) for item in chunk if isinstance(item, Record)]
        return failures, futures

    pending = (record for record in records if record.index not in skip)
    chunks = _chunks(pending, window)
    current = next((submit(chunk) for chunk in chunks), None)
    while current is not None:
        upcoming = next((submit(chunk) for chunk in chunks), None)
        failures, futures = current
        planned: list[Planned] = []
        budget = [media_budget]
        for future in futures:
            result: Planned = future.result()
            if result.error is not None:
                failures.append(FailedRecord(result.record.id, result.record.index, result.error))
            else:
                planned.append(within_budget(result, budget))
        yield Window(planned, failures)
        current = upcoming


# ----------------------------------------------------------------------------- manifest


def job_manifest(settings: ScoreSettings, release: Release, dtype: torch.dtype, head_dir: Path) -> dict[str, Any]:
    """Fingerprints and every setting that changes results: a checkpoint resumes only if they match."""
    questions_sha = file_sha256(settings.questions) if settings.questions else None
    return {
        "model": {
            "id": settings.model,
            "family": release.family,
            "config_sha256": file_sha256(release.path / "config.json"),
            "weights": weights_fingerprint(release),
            "head_sha256": file_sha256(head_dir / "joint_head.safetensors"),
            "head_config_sha256": file_sha256(head_dir / "joint_head_config.json"),
        },
        "inputs": [input_fingerprint(source) for source in expand_inputs(settings.inputs)],
        "settings": {
            "max_length": settings.max_length,
            "overflow": settings.overflow.value,
            "struct_nulls": settings.struct_nulls.value,
            "dtype": str(dtype).removeprefix("torch."),
            "media_limits": settings.limits.as_dict(),
            "questions_sha256": questions_sha,
        },
    }


# ----------------------------------------------------------------------------- committing


class BackgroundCommitter:
    """Commits shards on a thread, so writing hidden states to disk overlaps the next forward.

    At most `depth` commits wait; a failed commit is raised on the next `submit` or on `drain`.
    Commits land in submission order, so the journal reads as if they were made inline.
    """

    def __init__(self, checkpoint: Checkpoint, depth: int = 2) -> None:
        self.checkpoint = checkpoint
        self._queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="clef-commit", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            results, hidden, committed = item
            try:
                if self._error is None:
                    self.checkpoint.commit(results, hidden)
                    committed()
            except BaseException as error:
                self._error = error
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def submit(self, results: Any, hidden: Any, committed: Callable[[], None]) -> None:
        self._raise()
        self._queue.put((results, hidden, committed))

    def drain(self) -> None:
        self._queue.join()
        self._raise()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


# ----------------------------------------------------------------------------- the job


class ScoreJob:
    """One `clef score` run; `run()` returns its summary, `dry_run()` its plan."""

    def __init__(
        self,
        settings: ScoreSettings,
        progress: Progress | None = None,
        stop: threading.Event | None = None,
        scorer: Scorer | None = None,
    ) -> None:
        settings.validate()
        self.settings = settings
        self.progress = progress or Progress()
        self.stop = stop or threading.Event()
        self._scorer = scorer
        self.batch_tokens = settings.max_batch_tokens
        self.summary = JobSummary(output=settings.output)
        self.stats = self.summary.stats
        self._passthrough: Any = None
        self._runner: BatchRunner | None = None
        self._committer: BackgroundCommitter | None = None

    # ------------------------------------------------------------------ shared set-up

    def _release(self, with_weights: bool) -> Release:
        release = resolve_release(self.settings.model, revision=self.settings.revision, with_weights=with_weights)
        self.settings = self.settings.for_release(release)
        return release

    def _records(self) -> Iterator[Record | InvalidRecord]:
        schema = load_questions_file(self.settings.questions) if self.settings.questions else None
        settings = self.settings
        return read_records(settings.inputs, questions=schema, limit=settings.limit, struct_nulls=settings.struct_nulls)

    def _pool(self, release: Release, spool: Path | None = None) -> EncodePool:
        settings = self.settings
        workers = self.stats.workers = self._workers()
        threads = decode_threads_per_worker(workers)
        spec = EncoderSpec(
            release.path, settings.max_length, settings.overflow, settings.limits, spool, release.family, threads
        )
        return EncodePool(spec, workers)

    def _spool(self, checkpoint: Checkpoint) -> tuple[Path, int]:
        """A fresh spool folder in the checkpoint and its budget per window (two windows are
        planned at once)."""
        spool = checkpoint.path / "spool"
        shutil.rmtree(spool, ignore_errors=True)  # left by a killed run
        spool.mkdir()
        budget = min(self.settings.media_spool_bytes, shutil.disk_usage(spool).free // 4)
        return spool, budget // 2

    def _workers(self) -> int:
        if self.settings.workers is not None:
            return self.settings.workers
        from clef_cli.backbone import resolve_device

        if resolve_device(self.settings.device).type == "cpu":
            return 0
        return default_workers(self.settings.limits)

    def _dtype(self) -> torch.dtype:
        """The compute dtype this run will use (it is part of the checkpoint's settings)."""
        from clef_cli.backbone import resolve_device, resolve_dtype

        return resolve_dtype(self.settings.dtype, resolve_device(self.settings.device))

    def _scorer_for(self, release: Release) -> Scorer:
        if self._scorer is None:
            from clef_cli.scoring import load_scorer

            self.progress.note("loading the model")
            with self.stats.stage("load"):
                self._scorer = load_scorer(release, device=self.settings.device, dtype=self.settings.dtype)
        return self._scorer

    # ------------------------------------------------------------------ dry run

    def dry_run(self) -> DryRunReport:
        """Validate and plan everything without loading weights."""
        release = self._release(with_weights=False)
        report = DryRunReport()
        total = count_records(self.settings.inputs, self.settings.limit)
        self.progress.start(total, 0)
        done = self._existing_done()
        report.already_done = done.count
        hidden_size = release.hidden_size
        with self._pool(release) as pool:
            records = self._records()
            for window in planned_windows(pool, records, self.settings.window, skip=done):
                report.invalid += len(window.failures)
                room = 10 - len(report.first_errors)
                report.first_errors.extend(failure.error for failure in window.failures[:room])
                entries = [PlanEntry(p.record.index, p.length or 0, p.audio_in_video) for p in window.planned]
                batches = plan_batches(entries, self.batch_tokens, self.settings.max_batch_size)
                report.valid += len(entries)
                report.lengths.extend(entry.length for entry in entries)
                report.batches += len(batches)
                report.audio_in_video_batches += sum(batch.entries[0].audio_in_video for batch in batches)
                report.padded_tokens += sum(batch.padded_tokens for batch in batches)
                self.progress.advance(len(window.planned) + len(window.failures), sum(e.length for e in entries), 0)
        report.records = report.valid + report.invalid
        if self.settings.hidden_states == "keep":
            report.hidden_state_bytes = sum(report.lengths) * self._bytes_per_token(hidden_size)
        return report

    def _existing_done(self) -> DoneSet:
        """Records a rerun would skip (the dry run only reads the checkpoint, never changes it)."""
        path = self.settings.checkpoint_path
        if self.settings.restart or not (path / "manifest.json").exists():
            return DoneSet()
        with contextlib.suppress(ClefError):
            return Checkpoint.open_existing(path).done
        return DoneSet()

    def _bytes_per_token(self, hidden_size: int) -> int:
        return hidden_size * HIDDEN_DTYPES[self.settings.hidden_dtype].itemsize + 4

    # ------------------------------------------------------------------ run

    def run(self) -> JobSummary:
        started = time.monotonic()
        release = self._release(with_weights=True)
        settings = self.settings
        dtype = self._dtype()
        self._passthrough = (
            passthrough_types(settings.inputs, settings.keep_columns, settings.limit) if settings.keep_columns else None
        )
        manifest = job_manifest(settings, release, dtype, release.path)
        checkpoint_path = settings.checkpoint_path
        with job_locks(settings.output, checkpoint_path) as lock:
            if lock.took_over:
                self.progress.note(f"took over a lock left by a stopped job (pid {lock.took_over.get('pid')})")
            checkpoint = Checkpoint.open(checkpoint_path, manifest, restart=settings.restart)
            if checkpoint.dropped:
                self.progress.note(f"{len(checkpoint.dropped)} damaged checkpoint shard(s) will be recomputed")
            self.summary.resumed = checkpoint.done.count
            total = count_records(settings.inputs, settings.limit)
            self.progress.start(total, checkpoint.done.count)
            spool, spool_budget = self._spool(checkpoint)
            self._committer = BackgroundCommitter(checkpoint)
            scoring = self.stats.scoring_started = time.perf_counter()
            try:
                with self._pool(release, spool) as pool:
                    self._run_windows(pool, release, checkpoint, total, spool_budget)
                    with self.stats.stage("commit_wait"):
                        self._committer.drain()
                    self.stats.scoring_seconds = time.perf_counter() - scoring - self.stats.stages["load"]
            finally:
                self._committer.close()
                shutil.rmtree(spool, ignore_errors=True)
            self.summary.seconds = time.monotonic() - started
            if self.stop.is_set():
                self.summary.interrupted = True
                return self.summary
            with self.stats.stage("output_write"):
                self._finish(checkpoint, release)
        self.summary.seconds = time.monotonic() - started
        return self.summary

    def _run_windows(
        self, pool: EncodePool, release: Release, checkpoint: Checkpoint, total: int | None, spool_budget: int
    ) -> None:
        checked_disk = False
        windows = planned_windows(
            pool, self._records(), self.settings.window, skip=checkpoint.done, media_budget=spool_budget
        )
        while True:
            with self.stats.stage("encode_wait"):
                window = next(windows, None)
            if window is None:
                return
            for planned in window.planned:
                record = planned.record
                kind = modality(len(record.images), len(record.audio), len(record.videos))
                self.stats.encoded(kind, planned.length or 0, planned.seconds)
            if window.failures:
                self._commit([], window.failures)
            if self.stop.is_set():
                return
            if not window.planned:
                continue
            if not checked_disk:
                self._check_disk(checkpoint, release, window, total)
                checked_disk = True
            entries = [PlanEntry(p.record.index, p.length or 0, p.audio_in_video) for p in window.planned]
            batches = plan_batches(entries, self.batch_tokens, self.settings.max_batch_size)
            by_index = {planned.record.index: planned for planned in window.planned}
            self._run_batches(pool, release, batches, by_index)
            if self.stop.is_set():
                return

    def _check_disk(self, checkpoint: Checkpoint, release: Release, window: Window, total: int | None) -> None:
        """Refuse to start when the hidden states would not fit (estimated from the first window)."""
        if self.settings.hidden_states != "keep":
            return
        lengths = [p.length or 0 for p in window.planned]
        remaining = max(len(lengths), (total or 0) - checkpoint.done.count)
        needed = int(statistics.fmean(lengths) * remaining * self._bytes_per_token(release.hidden_size))
        free = shutil.disk_usage(checkpoint.path).free
        if needed > free:
            raise ClefError(
                f"the hidden states of this job need about {human_size(needed)} but only {human_size(free)} are free "
                f"under {checkpoint.path}; use --hidden-states drop to keep only the results, or --checkpoint "
                "on a larger disk"
            )

    def _run_batches(
        self,
        pool: EncodePool,
        release: Release,
        batches: list[PlannedBatch],
        by_index: dict[int, Planned],
    ) -> None:
        """Run batches in order while the next few are encoded in the background."""
        prepared: deque[tuple[PlannedBatch, list[EncodedRecord | Future]]] = deque()
        upcoming = iter(batches)

        def prepare() -> None:
            for batch in upcoming:
                items = []
                for index in batch.indices:
                    planned = by_index[index]
                    ready = planned.ready()
                    items.append(ready if ready is not None else pool.encode(planned.record))
                prepared.append((batch, items))
                if len(prepared) >= PREFETCH_BATCHES:
                    return

        with self.stats.stage("encode_wait"):
            prepare()
        while prepared:
            encoded: list[EncodedRecord] = []
            failures: list[FailedRecord] = []
            with self.stats.stage("encode_wait"):
                batch, items = prepared.popleft()
                prepare()
                for index, item in zip(batch.indices, items, strict=True):
                    value = item.result() if isinstance(item, Future) else item
                    if isinstance(value, str):
                        record = by_index[index].record
                        failures.append(FailedRecord(record.id, record.index, value))
                    else:
                        encoded.append(value)
            self._commit([], failures)
            if encoded:
                self._score_and_commit(self._runner_for(release), encoded)
            for index in batch.indices:
                by_index.pop(index).discard()
            if self.stop.is_set():
                for _, pending in prepared:
                    for item in pending:
                        if isinstance(item, Future):
                            item.cancel()
                return

    def _runner_for(self, release: Release) -> BatchRunner:
        if self._runner is None:
            scorer = self._scorer_for(release)
            self._runner = BatchRunner(scorer, self.batch_tokens, self._lower_budget, stats=self.stats)
        return self._runner

    def _lower_budget(self, tokens: int) -> None:
        self.batch_tokens = tokens
        self.progress.note(f"out of GPU memory: batch token budget lowered to {tokens}")

    def _score_and_commit(self, runner: BatchRunner, records: list[EncodedRecord]) -> None:
        """Forward and head for one planned batch, each outcome committed as it comes."""
        for outcome in runner.run(records):
            hidden = None
            if outcome.records and self.settings.hidden_states == "keep":
                assert outcome.hidden_states is not None
                dtype = HIDDEN_DTYPES[self.settings.hidden_dtype]
                hidden = hidden_payload(outcome.records, outcome.hidden_states, dtype)
            self.summary.forwarded += len(outcome.records)
            tokens = sum(record.length for record in outcome.records)
            self._commit(outcome.scored, outcome.failures, hidden, tokens)

    def _commit(
        self, scored: list[ScoredRecord], failures: list[FailedRecord], hidden: Any = None, tokens: int = 0
    ) -> None:
        if not scored and not failures:
            return

        def committed() -> None:
            faults.after_commit()
            self.summary.committed += len(scored) + len(failures)
            self.summary.tokens += tokens
            self.summary.failed += len(failures)
            room = 5 - len(self.summary.first_errors)
            self.summary.first_errors.extend(failure.error for failure in failures[:room])
            self.progress.advance(len(scored) + len(failures), tokens, len(failures))

        assert self._committer is not None
        table = results_table(scored, failures)
        with self.stats.stage("commit_wait"):
            self._committer.submit(table, hidden, committed)

    # ------------------------------------------------------------------ finish

    def _finish(self, checkpoint: Checkpoint, release: Release) -> None:
        self.progress.note("writing the output")
        metadata = provenance(self.settings, release, checkpoint.manifest)
        counts = write_job_output(self.settings, checkpoint.results(), metadata, self._passthrough)
        self.summary.count(counts)


def write_job_output(
    settings: ScoreSettings, results: Any, metadata: dict[str, str], passthrough: Any = None
) -> OutputCounts:
    """The job's Parquet output from its committed results (any engine), in input order. With
    --limit, records that an earlier, longer run committed stay in the checkpoint but not here."""
    if settings.limit is not None:
        results = results.filter(pc.less(results.column("record_index"), settings.limit))
    remove_stale_temporaries(settings.output)
    spec = OutputSpec(
        path=settings.output,
        layout=settings.layout,
        keep_columns=settings.keep_columns,
        row_group_size=settings.row_group_size,
        metadata=metadata,
        calibration=load_calibration(settings.calibration) if settings.calibration else None,
    )
    return write_output(spec, results, settings.inputs, settings.limit, passthrough)


def provenance(settings: ScoreSettings, release: Release, manifest: dict[str, Any]) -> dict[str, str]:
    """Key-value metadata of the output: what produced it, so a result can be traced."""
    model = manifest.get("model", {})
    return {
        "clef.version": __version__,
        "clef.model": settings.model,
        "clef.model_revision": release.revision or "",
        "clef.model_family": release.family,
        "clef.model_config_sha256": model.get("config_sha256", ""),
        "clef.weights_fingerprint": model.get("weights", ""),
        "clef.head_sha256": model.get("head_sha256", ""),
        "clef.max_length": str(settings.max_length),
        "clef.overflow": settings.overflow.value,
        "clef.struct_nulls": settings.struct_nulls.value,
        "clef.dtype": str(manifest.get("settings", {}).get("dtype", "")),
        "clef.layout": settings.layout,
        "clef.created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def human_size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count:.1f} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1024
    return f"{count:.1f} TiB"
