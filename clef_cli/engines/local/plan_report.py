"""`clef score --dry-run`: validate and plan every record, load no weights, change nothing."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

from clef_cli.encoding.batching import PlanEntry, plan_batches
from clef_cli.engines.local.planning import (
    encode_pool,
    hidden_bytes_per_token,
    job_records,
    planned_windows,
    worker_count,
)
from clef_cli.errors import ClefError
from clef_cli.inputs.readers import count_records
from clef_cli.progress import Progress
from clef_cli.release import resolve_release
from clef_cli.settings import ScoreSettings
from clef_cli.store.checkpoint import MANIFEST, Checkpoint, DoneSet


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


def plan_report(settings: ScoreSettings, progress: Progress | None = None) -> DryRunReport:
    """Every record encoded (media decoded, prompt built) and planned into batches, as a run would."""
    progress = progress or Progress()
    settings.validate()
    release = resolve_release(settings.model, revision=settings.revision, with_weights=False)
    settings = settings.for_release(release)
    report = DryRunReport()
    progress.start(count_records(settings.inputs, settings.limit), 0)
    done = _already_done(settings)
    report.already_done = done.count
    with encode_pool(settings, release, worker_count(settings)) as pool:
        for window in planned_windows(pool, job_records(settings), settings.window, skip=done):
            report.invalid += len(window.failures)
            room = 10 - len(report.first_errors)
            report.first_errors.extend(failure.error for failure in window.failures[:room])
            entries = [PlanEntry(p.record.index, p.length or 0, p.audio_in_video) for p in window.planned]
            batches = plan_batches(entries, settings.max_batch_tokens, settings.max_batch_size)
            report.valid += len(entries)
            report.lengths.extend(entry.length for entry in entries)
            report.batches += len(batches)
            report.audio_in_video_batches += sum(batch.entries[0].audio_in_video for batch in batches)
            report.padded_tokens += sum(batch.padded_tokens for batch in batches)
            progress.advance(len(window.planned) + len(window.failures), sum(e.length for e in entries), 0)
    report.records = report.valid + report.invalid
    if settings.hidden_states == "keep":
        report.hidden_state_bytes = sum(report.lengths) * hidden_bytes_per_token(settings, release.hidden_size)
    return report


def _already_done(settings: ScoreSettings) -> DoneSet:
    """Records a rerun would skip (read from the checkpoint, which stays as it is)."""
    path = settings.checkpoint_path
    if settings.restart or not (path / MANIFEST).exists():
        return DoneSet()
    with contextlib.suppress(ClefError):
        return Checkpoint.open_existing(path).done
    return DoneSet()
