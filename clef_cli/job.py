"""The lifecycle every engine shares (local, Ray, rehead): settings checked and completed for the
release, the manifest, locks, the checkpoint, progress notes, and at the end provenance, the
output and the summary. An engine opens a job, does its own work on the checkpoint, and finishes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from clef_cli import __version__
from clef_cli.inputs.sources import expand_inputs, input_fingerprint
from clef_cli.output import OutputSpec, write_output
from clef_cli.progress import Progress
from clef_cli.release import HEAD_CONFIG, HEAD_WEIGHTS, Release, file_sha256, resolve_release, weights_fingerprint
from clef_cli.results import OutputCounts
from clef_cli.settings import JobSummary, ScoreSettings
from clef_cli.store.atomic import remove_stale_temporaries
from clef_cli.store.checkpoint import Checkpoint
from clef_cli.store.locks import job_locks


def job_manifest(settings: ScoreSettings, release: Release, dtype: str, head_dir: Path) -> dict[str, Any]:
    """Fingerprints and every setting that changes results: a checkpoint resumes only if they match."""
    questions_sha = file_sha256(settings.questions) if settings.questions else None
    return {
        "model": {
            "id": settings.model,
            "family": release.family,
            "config_sha256": file_sha256(release.path / "config.json"),
            "weights": weights_fingerprint(release),
            "head_sha256": file_sha256(head_dir / HEAD_WEIGHTS),
            "head_config_sha256": file_sha256(head_dir / HEAD_CONFIG),
        },
        "inputs": [input_fingerprint(source) for source in expand_inputs(settings.inputs)],
        "settings": {
            "max_length": settings.max_length,
            "overflow": settings.overflow.value,
            "struct_nulls": settings.struct_nulls.value,
            "dtype": dtype,
            "media_limits": settings.limits.as_dict(),
            "questions_sha256": questions_sha,
        },
    }


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


def write_job_output(
    settings: ScoreSettings, results: pa.Table, metadata: dict[str, str], passthrough: Any = None
) -> OutputCounts:
    """The job's Parquet output from its committed results (any engine), in input order. With
    --limit, records that an earlier, longer run committed stay in the checkpoint but not here."""
    from clef_cli.quality.calibrate import load_calibration

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


@dataclass
class Job:
    """An open job: its completed settings, release, manifest and checkpoint, under its locks."""

    settings: ScoreSettings
    release: Release
    manifest: dict[str, Any]
    checkpoint: Checkpoint
    progress: Progress
    summary: JobSummary
    started: float

    def finish(
        self,
        results: pa.Table,
        metadata: dict[str, str] | None = None,
        passthrough: Any = None,
        manifest: dict[str, Any] | None = None,
    ) -> JobSummary:
        """Write the output (provenance plus the engine's own `metadata`) and count it."""
        self.progress.note("writing the output")
        described = provenance(self.settings, self.release, manifest or self.checkpoint.manifest)
        counts = write_job_output(self.settings, results, described | (metadata or {}), passthrough)
        self.summary.count(counts)
        return self.stopped()

    def interrupted(self) -> JobSummary:
        """Stopped on request: everything committed stays for the next run."""
        self.summary.interrupted = True
        return self.stopped()

    def stopped(self) -> JobSummary:
        self.summary.seconds = time.monotonic() - self.started
        return self.summary


@contextmanager
def open_job(
    settings: ScoreSettings,
    progress: Progress,
    dtype: str,
    head_dir: Path | None = None,
    existing: bool = False,
) -> Iterator[Job]:
    """Check the settings, find the release, build the manifest, take the locks and open the
    checkpoint (`existing`: a finished job's, to read; else this job's, made or resumed)."""
    started = time.monotonic()
    settings.validate()
    release = resolve_release(settings.model, revision=settings.revision)
    settings = settings.for_release(release)
    manifest = job_manifest(settings, release, dtype, head_dir or release.path)
    path = settings.checkpoint_path
    with job_locks(settings.output, path) as lock:
        if lock.took_over:
            progress.note(f"took over a lock left by a stopped job (pid {lock.took_over.get('pid')})")
        if existing:
            checkpoint = Checkpoint.open_existing(path)
        else:
            checkpoint = Checkpoint.open(path, manifest, restart=settings.restart)
        damaged = sum(entry.records for entry in checkpoint.dropped)
        if checkpoint.dropped:
            shards = len(checkpoint.dropped)
            progress.note(f"{shards} damaged checkpoint shard(s): their {damaged} records will be computed again")
        summary = JobSummary(output=settings.output, resumed=checkpoint.done.count, damaged=damaged)
        yield Job(settings, release, manifest, checkpoint, progress, summary, started)
