"""The lifecycle every engine shares (local, Ray, rehead): a job's plan (job/plan.py), the
manifest, locks, the checkpoint (a store keyed by record key), the job's ledger (what to run),
progress notes, and at the end provenance, the output and the summary. An engine plans a job,
opens it, runs the records its ledger marks, and finishes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from clef_cli import __version__
from clef_cli.encoding.remote_spool import RemoteSpool
from clef_cli.errors import JobStopped, UsageError
from clef_cli.inputs.readers import read_records
from clef_cli.inputs.records import InvalidRecord, Record
from clef_cli.job.output import OutputSpec, upload_staged, write_output
from clef_cli.job.plan import JobPlan
from clef_cli.job.settings import ScoreSettings
from clef_cli.job.summary import JobSummary
from clef_cli.locations.object_store import forget as forget_objects
from clef_cli.locations.uris import is_object_uri
from clef_cli.progress import Progress
from clef_cli.release import HEAD_CONFIG, HEAD_WEIGHTS, Release, file_sha256, weights_fingerprint
from clef_cli.results import OutputCounts
from clef_cli.sizes import plural
from clef_cli.store.atomic import remove_stale_temporaries
from clef_cli.store.checkpoint import Checkpoint, discard
from clef_cli.store.keep_policy import SELECTIVE, KeepPolicy
from clef_cli.store.ledger import Ledger
from clef_cli.store.location import lock_slot
from clef_cli.store.locks import JobLock, job_locks
from clef_cli.store.media_stats import MediaStats
from clef_cli.store.opening import open_existing_store, open_store
from clef_cli.store.record_key import KEY_VERSION, MediaHasher, PromptShape, prompt_digest

REMOTE_SPOOL = "remote-media"


def job_records(plan: JobPlan) -> Iterator[Record | InvalidRecord]:
    """The job's records in input order (with the `--questions` schema for those without one)."""
    settings = plan.settings
    return read_records(
        plan.sources,
        questions=plan.questions,
        limit=settings.limit,
        struct_nulls=settings.struct_nulls,
        columns=settings.columns,
        claimed=settings.keep_columns,
        limits=settings.read_limits,
    )


def job_manifest(settings: ScoreSettings, release: Release, dtype: str, head_dir: Path) -> dict[str, Any]:
    """The scoring fingerprint: what turns the same prompt into other results (the backbone, the
    head, the dtype), by content. A store is used only by runs with the same one; everything that
    shapes a prompt is in each record's key instead. `id` and `path` are for display only
    (`manifest.DISPLAY_ONLY`)."""
    return {
        "model": {
            "id": settings.model,
            "path": str(release.path),
            "family": release.family,
            "config_sha256": file_sha256(release.path / "config.json"),
            "weights": weights_fingerprint(release),
            "head_sha256": file_sha256(head_dir / HEAD_WEIGHTS),
            "head_config_sha256": file_sha256(head_dir / HEAD_CONFIG),
        },
        "settings": {"dtype": dtype} | engine_setting(settings),
    }


def engine_setting(settings: ScoreSettings) -> dict[str, str]:
    """The engine is part of the scoring fingerprint when it is not the HF engine: another
    backbone's kernels give other numbers (fp32 within 1e-5, bf16 further apart), so a store holds
    one engine's results; HF stores keep the fingerprint they had before there was a choice."""
    return {} if settings.engine == "hf" else {"engine": settings.engine}


def job_ledger(plan: JobPlan, checkpoint: Checkpoint, needs_hidden: bool, dry_run: bool = False) -> Ledger:
    """Key every record of the job (no media decoded) and mark what this run computes. Unchanged
    local media are keyed from the store's stat cache (all hashed again with --verify-media); a
    dry run reads the cache and writes nothing to it."""
    assert checkpoint.index is not None
    settings = plan.settings
    forget_objects()  # list object folders afresh: this night's stamps, this environment's credentials
    ledger = Ledger(checkpoint.index, checkpoint.run_seq)
    stats = MediaStats(checkpoint.index, writable=not dry_run, trusted=not settings.verify_media)
    media = MediaHasher(settings.limits, stats=stats)
    ledger.build(job_records(plan), key_prompt(settings, plan.release), media, needs_hidden)
    if not dry_run and checkpoint.set_aside_damaged():  # a bucket object found damaged: its records run again
        ledger._decide(len(ledger.to_run), needs_hidden)
    checkpoint.ledger = ledger
    return ledger


def key_prompt(settings: ScoreSettings, release: Release) -> PromptShape:
    """What shapes every record's prompt besides the record (the record key's `prompt`)."""
    assert settings.max_length is not None
    overflow, special_tokens = settings.overflow.value, settings.special_tokens.value
    return prompt_digest(release.path, release.family, settings.max_length, overflow, settings.limits, special_tokens)


def key_metadata(settings: ScoreSettings, release: Release) -> dict[str, str]:
    """`clef.key_prompt` and `clef.media_limits`: with the record itself, what its key hashes, so
    `clef review --records` can tell a record edited since it was scored (store/record_key.py)."""
    return {
        "clef.key_prompt": key_prompt(settings, release).as_metadata(),
        "clef.media_limits": json.dumps(settings.limits.as_metadata()),
    }


def with_remote_spool(plan: JobPlan, checkpoint_path: Path) -> tuple[JobPlan, RemoteSpool | None]:
    """With --allow-remote-media, an input in an object store or a --media-root URI, a fresh
    folder in the checkpoint for the media the job fetches while keying its records, named in the
    settings' limits: every encoding worker (and a Ray actor that can read the folder) decodes
    those bytes instead of fetching them again."""
    settings = plan.settings
    objects = settings.limits.object_roots or any(is_object_uri(str(item)) for item in settings.inputs)
    if not (settings.limits.allow_remote or objects):
        return plan, None
    spool = RemoteSpool.fresh(checkpoint_path / REMOTE_SPOOL)
    return plan.with_settings(replace(settings, limits=replace(settings.limits, remote_spool=spool.folder))), spool


def questions_metadata(plan: JobPlan) -> dict[str, str]:
    """`clef.questions`: the `--questions` schema as JSON, so `clef review` can show reviewers each
    question's instructions and each option's description."""
    if not plan.questions:
        return {}
    return {"clef.questions": json.dumps(plan.questions, ensure_ascii=False)}


def hidden_policy_metadata(settings: ScoreSettings) -> dict[str, str]:
    """`clef.hidden_states` (and for `selective` its threshold and sample): whose states the run
    stored, so a reader of the output knows which records train-head would compute again."""
    policy = {"clef.hidden_states": settings.hidden_states}
    if settings.hidden_states == SELECTIVE:
        policy |= {"clef.keep_below": str(settings.keep_below), "clef.keep_sample": str(settings.keep_sample)}
    return policy


def provenance(plan: JobPlan, manifest: dict[str, Any]) -> dict[str, str]:
    """Key-value metadata of the output: what produced it, so a result can be traced."""
    settings, release = plan.settings, plan.release
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
        "clef.special_tokens": settings.special_tokens.value,
        "clef.dtype": str(manifest.get("settings", {}).get("dtype", "")),
        "clef.layout": settings.layout,
        "clef.engine": settings.engine,
        **hidden_policy_metadata(settings),
        "clef.key_version": str(KEY_VERSION),
        "clef.created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **questions_metadata(plan),
        **key_metadata(settings, release),
        **({"clef.columns": settings.columns.as_metadata()} if settings.columns else {}),
    }


def write_job_output(
    plan: JobPlan, results: Iterable[pa.Table], metadata: dict[str, str], passthrough: Any = None
) -> OutputCounts:
    """The job's Parquet output from its committed results (any engine), in input order. With
    --limit, the ledger holds only the first records, so the rest of the store stays out of it."""
    settings, output = plan.settings, plan.output
    if output.upload is not None:
        output.path.parent.mkdir(exist_ok=True)  # the checkpoint's upload folder
    remove_stale_temporaries(output.path)
    spec = OutputSpec(
        path=output.path,
        layout=settings.layout,
        keep_columns=settings.keep_columns,
        row_group_size=settings.row_group_size,
        metadata=metadata,
        calibration=plan.calibration,
    )
    counts = write_output(spec, results, plan.sources, settings.limit, passthrough)
    if output.upload is not None:
        upload_staged(output.path, output.upload, keep=output.keep_staged)
    return counts


@dataclass
class Job:
    """An open job: its plan, manifest and checkpoint, under its locks."""

    plan: JobPlan
    manifest: dict[str, Any]
    checkpoint: Checkpoint
    ledger: Ledger
    progress: Progress
    summary: JobSummary
    started: float
    stop: threading.Event
    """Set by a stop request (Ctrl-C, SIGTERM): checked by the engine's loops and by `finish`."""

    @property
    def settings(self) -> ScoreSettings:
        return self.plan.settings

    @property
    def release(self) -> Release:
        return self.plan.release

    def keep_policy(self) -> KeepPolicy:
        """Whose hidden states this run stores (`--hidden-states`; the sample drawn from the ledger)."""
        settings = self.settings
        sampled = self.ledger.sampled(settings.keep_sample) if settings.hidden_states == SELECTIVE else b""
        return KeepPolicy(settings.hidden_states, settings.keep_below, settings.keep_sample, sampled)

    def results(self, store: Checkpoint | None = None) -> Iterator[pa.Table]:
        """The job's rows in input order, a chunk at a time, gathered by key from `store`
        (default: the job's checkpoint) as the output is written, so memory stays flat."""
        store = store or self.checkpoint
        assert store.index is not None
        return self.ledger.ordered(store.index, store.open_shard)

    def finish(
        self,
        results: Iterable[pa.Table],
        metadata: dict[str, str] | None = None,
        passthrough: Any = None,
        manifest: dict[str, Any] | None = None,
    ) -> JobSummary:
        """Write the output (provenance, this run's counts and the engine's own `metadata`) and
        count it; a stop request before or while it is written leaves the old output (the
        temporary goes) and the job interrupted: the rerun writes it from the store."""
        if self.stop.is_set():
            return self.interrupted()
        self.progress.phase("writing the output")
        described = provenance(self.plan, manifest or self.checkpoint.manifest)
        described |= {f"clef.records_{name}": str(value) for name, value in self.summary.run_counts().items()}
        try:
            rows = self._until_stopped(results)
            counts = write_job_output(self.plan, rows, described | (metadata or {}), passthrough)
        except JobStopped:
            return self.interrupted()
        self.summary.count(counts)
        if self.checkpoint.index is not None:
            self.checkpoint.index.finish_run(self.checkpoint.run_id, self.summary.run_counts())
        return self.stopped()

    def _until_stopped(self, results: Iterable[pa.Table]) -> Iterator[pa.Table]:
        """`results`, checked for a stop request before each chunk (and after the last)."""
        for chunk in results:
            if self.stop.is_set():
                raise JobStopped
            yield chunk
        if self.stop.is_set():
            raise JobStopped

    def interrupted(self) -> JobSummary:
        """Stopped on request: everything committed stays for the next run."""
        self.summary.interrupted = True
        record_interrupted(self.checkpoint, self.summary)
        return self.stopped()

    def stopped(self) -> JobSummary:
        self.summary.seconds = time.monotonic() - self.started
        return self.summary


def record_interrupted(checkpoint: Checkpoint, summary: JobSummary | None) -> None:
    """A stop request ended the run: its history says so, with its counts so far (`checkpoint
    info` tells it from a crash, which leaves the run unfinished)."""
    if checkpoint.index is not None:
        counts = summary.run_counts() | {"committed": summary.committed} if summary is not None else {}
        checkpoint.index.interrupt_run(checkpoint.run_id, counts)


def locked_slot(plan: JobPlan) -> tuple[JobPlan, JobLock | None]:
    """A bucket store's cache folder chosen and locked in one step (one another job on this
    machine holds is skipped: `lock_slot`), the plan moved into it (a remote -o's stage too); the
    lock is the caller's. A folder store: no lock (`job_locks` takes it)."""
    if not plan.store.remote:
        return plan, None
    chosen, lock = lock_slot(plan.store)
    return plan.in_store(chosen), lock


@contextmanager
def open_job(
    plan: JobPlan,
    progress: Progress,
    dtype: str,
    head_dir: Path | None = None,
    existing: bool = False,
    stop: threading.Event | None = None,
) -> Iterator[Job]:
    """The planned job (`plan_job`): its manifest built, the locks taken, the checkpoint open
    (`existing`: one that must exist, to read; else made or reused) and the job's records keyed
    against it. `stop`: the job's stop requests (cli/stopping.py)."""
    started = time.monotonic()
    manifest = job_manifest(plan.settings, plan.release, dtype, head_dir or plan.release.path)
    plan, slot = locked_slot(plan)  # a bucket store's cache folder: chosen and locked at once
    settings, path = plan.settings, plan.store.folder
    made_here = not existing and not path.exists()  # before the locks: a remote -o's is made inside it
    stop = stop or threading.Event()
    with job_locks(plan.output.path, path, slot) as lock:
        if lock.took_over:
            progress.note(f"took over a lock left by a stopped job (pid {lock.took_over.get('pid')})")
        opening = time.perf_counter()
        if existing:
            checkpoint = open_existing_store(plan.store)
        else:
            syncs = (settings.sync_every, progress.warn, settings.sync_failure_limit, stop, progress.syncs)
            checkpoint = open_store(plan.store, manifest, settings.restart, *syncs)  # failing syncs stop the job
        opening = time.perf_counter() - opening  # the summary's `opening the store` (stats.STAGES)
        spool: RemoteSpool | None = None
        summary: JobSummary | None = None
        failed = discarded = keep_logs = False
        try:
            damaged = sum(entry.records for entry in checkpoint.dropped)
            if checkpoint.dropped:
                shards = len(checkpoint.dropped)
                what = f"{plural(shards, 'damaged checkpoint shard')}: their {plural(damaged, 'record')}"
                progress.note(f"{what} will be computed again")
            checkpoint.begin_run(settings.inputs, plan.output.shown)  # a remote -o: its URI, not its stage
            plan, spool = with_remote_spool(plan, checkpoint.path)
            progress.phase("keying the records")
            needs_hidden = existing or settings.hidden_states == "keep"
            keying = time.perf_counter()
            ledger = job_ledger(plan, checkpoint, needs_hidden)
            summary = JobSummary(output=plan.output.shown, damaged=damaged)
            summary.stats.stages |= {"open_store": opening, "keying": time.perf_counter() - keying}
            summary.stats.special_tokens = settings.special_tokens.value
            summary.take_counts(ledger.counts)
            yield Job(plan, manifest, checkpoint, ledger, progress, summary, started, stop)
        except KeyboardInterrupt:  # a stop that ended the job inside a step (`JobStopped`) or at once
            failed = True
            record_interrupted(checkpoint, summary)
            raise
        except Exception as error:
            # refused by a check that needs the open store or the cluster (Ray's fit, its nodes'
            # view of the store), or failed before a commit (the store of the media refused the
            # job's credentials while keying): a store this run made, with nothing committed,
            # goes with it; a refused or failed job leaves no folder it made, but for the log a
            # failed engine's one-line error names
            failed, discarded = True, made_here and not checkpoint.entries
            keep_logs = not isinstance(error, UsageError)
            raise
        except BaseException:
            failed = True
            raise
        finally:
            if spool is not None:
                spool.remove()
            try:  # a bucket store's last sync; its failure is the job's unless one came first
                checkpoint.close(quiet=failed)
            finally:
                if summary is not None:
                    summary.stats.sync_failures = checkpoint.sync_failures
            if discarded:
                discard(path, keep_logs)
