"""`clef score --dry-run`: validate and plan every record, load no weights, change nothing."""

from __future__ import annotations

import contextlib
import math
import tempfile
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa

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
from clef_cli.job.lifecycle import job_ledger, key_prompt, with_remote_spool
from clef_cli.job.plan import JobPlan, Preflight, plan_job
from clef_cli.job.settings import ScoreSettings
from clef_cli.progress import Progress
from clef_cli.results import RunCounts
from clef_cli.store.checkpoint import MANIFEST, Checkpoint
from clef_cli.store.keep_policy import DROP, KEEP, SELECTIVE, measured_below, stored_fraction
from clef_cli.store.key_index import INDEX_FILE, KeyIndex
from clef_cli.store.ledger import Ledger, ToRun
from clef_cli.store.opening import open_existing_store
from clef_cli.store.record_key import MediaHasher

T = TypeVar("T")


@dataclass
class DryRunReport:
    records: int = 0
    """Every record of the job: valid (planned, already in the checkpoint, or a duplicate) plus failing."""
    valid: int = 0
    already_done: int = 0
    """Of `valid`: records whose result the checkpoint has (reused); not planned."""
    duplicates: int = 0
    """Of `valid`: later copies of a prompt earlier in this job; planned once, with the first."""
    states_cut: int = 0
    """Planned records whose state was cut to fit --max-length (`state_tokens_cut` above 0)."""
    failed_by_kind: dict[str, int] = field(default_factory=dict)
    """error_kind -> records that would fail, as a run would give them (a missing image: media)."""
    lengths: array[int] = field(default_factory=lambda: array("I"))
    """Every planned prompt's length (4 bytes a record: a 10M-record dry run holds 40 MB)."""
    batches: int = 0
    audio_in_video_batches: int = 0
    padded_tokens: int = 0
    first_errors: list[tuple[str, str]] = field(default_factory=list)
    """(error_kind, error) of the first failing records."""
    hidden_state_bytes: int = 0
    """Under the run's own policy (for `selective`, the low end of its range)."""
    hidden_state_bytes_by_policy: dict[str, tuple[int, int]] = field(default_factory=dict)
    """keep, selective, drop -> (low, high) bytes of hidden states this run would store; equal
    unless `selective` has no stored results to measure its share under the threshold from."""
    selective_measured: float | None = None
    """The share of the store's results under --keep-below, when it has results."""
    engine_limit: int | None = None
    """The engine's own prompt limit, where it has one (vLLM's max_model_len)."""
    over_engine_limit: int = 0
    """Planned prompts longer than `engine_limit`: the run refuses them (`overflow`)."""
    field_sources: list[str] = field(default_factory=list)
    """Per record field, the column it comes from and how its cells read (inputs/table_shape.py),
    for each input whose columns differ from the one before."""

    @property
    def invalid(self) -> int:
        return self.failed_by_kind.get("invalid", 0)

    @property
    def padding_waste(self) -> float:
        real = sum(self.lengths)
        return self.padded_tokens / real - 1 if real else 0.0

    def percentiles(self) -> dict[str, int]:
        if not self.lengths:
            return {}
        ordered = np.sort(np.frombuffer(self.lengths, dtype=np.uint32))

        def at(fraction: float) -> int:
            return int(ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)])

        return {"min": int(ordered[0]), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": int(ordered[-1])}


def plan_report(
    settings: ScoreSettings, progress: Progress | None = None, preflight: Preflight | None = None
) -> DryRunReport:
    """Every record encoded (media decoded, prompt built) and planned into batches, as a run
    would, after the same checks as the run (`preflight`: the engine's own)."""
    progress = progress or Progress()
    plan = plan_job(settings, preflight, with_weights=False, progress=progress)
    report = DryRunReport(field_sources=input_fields(plan))
    progress.start(count_records(plan.sources, plan.settings.limit), 0)
    with tempfile.TemporaryDirectory(prefix="clef-dry-run-") as scratch:
        # remote media fetched once, to key them, then planned from the spool, as a run does
        plan, _ = with_remote_spool(plan, Path(scratch))
        to_run, counts = _to_run(plan, Path(scratch))
        report.already_done, report.duplicates = counts.reused, counts.duplicates
        _plan(report, plan, to_run, progress)
    report.valid += report.already_done + report.duplicates
    report.records = report.valid + sum(report.failed_by_kind.values())
    unhidden = _from_store(plan, lambda checkpoint: _unhidden_tokens(plan, checkpoint)) or 0
    settings = plan.settings
    new = sum(report.lengths) - (unhidden if settings.hidden_states == KEEP else 0)
    _hidden_sizes(report, plan, new, unhidden, hidden_bytes_per_token(settings, plan.release.hidden_size))
    return report


def _plan(report: DryRunReport, plan: JobPlan, to_run: ToRun, progress: Progress) -> None:
    """Encode and plan the records a run would compute into `report`."""
    settings = plan.settings
    with encode_pool(settings, plan.release, worker_count(settings)) as pool:
        records = job_records(plan)
        for window in planned_windows(pool, records, settings.window, skip=to_run.stored):
            for failure in window.failures:
                report.failed_by_kind[failure.kind] = report.failed_by_kind.get(failure.kind, 0) + 1
            room = 10 - len(report.first_errors)
            report.first_errors.extend((failure.kind, failure.error) for failure in window.failures[:room])
            entries = [PlanEntry(p.record.index, p.length or 0, p.audio_in_video) for p in window.planned]
            batches = plan_batches(entries, settings.max_batch_tokens, settings.max_batch_size)
            report.valid += len(entries)
            report.states_cut += sum(bool(p.encoded and p.encoded.state_tokens_cut) for p in window.planned)
            report.lengths.extend(entry.length for entry in entries)
            report.batches += len(batches)
            report.audio_in_video_batches += sum(batch.entries[0].audio_in_video for batch in batches)
            report.padded_tokens += sum(batch.padded_tokens for batch in batches)
            progress.advance(len(window.planned) + len(window.failures), sum(e.length for e in entries), 0)


def input_fields(plan: JobPlan) -> list[str]:
    """How each record field is read, per input (the same lines once for inputs alike). A media
    field the input lacks and no --columns maps is left out: text-only input gets no media lines
    (a record further on that has the field is read as any other)."""
    from clef_cli.inputs.fields import MEDIA_FIELDS, RECORD_FIELDS
    from clef_cli.inputs.table_shape import field_sources, table_shape

    settings = plan.settings
    mapped = dict(settings.columns.fields) if settings.columns else {}
    lines: list[str] = []
    previous: list[str] | None = None
    for source in plan.sources:
        shape = table_shape(source)
        described = zip(RECORD_FIELDS, field_sources(settings.columns, shape), strict=True)
        absent = {name for name in MEDIA_FIELDS if name not in mapped and name not in shape.columns}
        fields = [line for name, line in described if name not in absent]
        if fields != previous:
            lines += [f"{source.name}:", *(f"  {line}" for line in fields)]
        previous = fields
    return lines


def _unhidden_tokens(plan: JobPlan, checkpoint: Checkpoint) -> int:
    """Prompt tokens of the job's stored results without hidden states (a `keep` run computes
    their states again: they are among its planned prompts, and no other policy's)."""
    ledger = job_ledger(plan, checkpoint, needs_hidden=True, dry_run=True)
    tokens = 0
    for shard, row in ledger.unhidden_rows():
        tokens += int(checkpoint.shard_table(shard).column("prompt_tokens")[row].as_py() or 0)
    return tokens


def _hidden_sizes(report: DryRunReport, plan: JobPlan, new: int, unhidden: int, per_token: float) -> None:
    """The states each policy's run would write: `keep` those of the new prompts and of the
    stored results without states (it computes them again), `selective` its share of the new
    prompts alone (from the share of the store's results under the threshold, the sample's share
    of the rest added; a range without results), `drop` none."""
    settings = plan.settings
    stored = _stored_results(plan)
    below = None if stored is None else measured_below(stored, settings.keep_below)
    report.selective_measured = below
    for policy in (KEEP, SELECTIVE, DROP):
        low, high = stored_fraction(policy, below, settings.keep_sample)
        tokens = new + unhidden if policy == KEEP else new
        report.hidden_state_bytes_by_policy[policy] = (int(tokens * per_token * low), int(tokens * per_token * high))
    report.hidden_state_bytes = report.hidden_state_bytes_by_policy[settings.hidden_states][0]


def _from_store(plan: JobPlan, read: Callable[[Checkpoint], T]) -> T | None:
    """`read(checkpoint)` on the job's existing checkpoint; None without one, with --restart, or
    when it cannot be opened (a dry run changes nothing and refuses nothing)."""
    location = plan.store
    if plan.settings.restart or not (location.remote or (location.folder / MANIFEST).exists()):
        return None
    with contextlib.suppress(ClefError):  # a bucket store: its cache brought up to date, the bucket only read
        checkpoint = open_existing_store(location, locked=False)
        try:
            return read(checkpoint)
        finally:
            checkpoint.close()
    return None


def _stored_results(plan: JobPlan) -> pa.Table | None:
    return _from_store(plan, lambda checkpoint: checkpoint.results())


def _to_run(plan: JobPlan, scratch: Path) -> tuple[ToRun, RunCounts]:
    """What a run would compute and why the rest is not planned, keyed as the run keys: against
    the job's checkpoint (its results stay as they are), or without one against an empty index in
    `scratch`, so the job's own duplicates are planned once either way."""
    settings = plan.settings
    needs_hidden = settings.hidden_states == KEEP

    def keyed(checkpoint: Checkpoint) -> tuple[ToRun, RunCounts]:
        ledger = job_ledger(plan, checkpoint, needs_hidden, dry_run=True)
        return ledger.to_run, ledger.counts

    stored = _from_store(plan, keyed)
    if stored is not None:
        return stored
    index = KeyIndex(scratch / INDEX_FILE)
    try:
        ledger = Ledger(index, run_seq=0)
        media = MediaHasher(settings.limits)
        ledger.build(job_records(plan), key_prompt(settings, plan.release), media, needs_hidden)
        return ledger.to_run, ledger.counts
    finally:
        index.close()
