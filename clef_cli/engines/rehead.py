"""Re-scoring a finished job with another joint head, from the hidden states in its checkpoint.

The thinker is never loaded: the stored final hidden states are what the head reads, and the
only other backbone tensor the head needs (the lm_head rows) is read from its weight shard.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from clef_cli.encoding.batching import PlanEntry, plan_batches
from clef_cli.errors import ClefError, ModelLoadError
from clef_cli.families import family_of
from clef_cli.inputs.readers import count_records
from clef_cli.job import Job, open_job
from clef_cli.model.backbone import resolve_device
from clef_cli.model.head import JointSchemaHead, load_joint_head
from clef_cli.model.scoring import head_logits, non_finite_failure, scored_record
from clef_cli.progress import Progress
from clef_cli.results import FailedRecord, ScoredRecord, results_table
from clef_cli.settings import JobSummary, ScoreSettings
from clef_cli.store.checkpoint import MANIFEST, Checkpoint, describe_differences
from clef_cli.store.hidden_store import StoredRecord, pad_states

REHEAD_BATCH_TOKENS = 65536


def _score_stored(
    head: JointSchemaHead, lexical: torch.Tensor, stored: list[StoredRecord], device: torch.device
) -> list[Any]:
    """Right-pad the stored states into length-sorted batches (the job's own planner) for the head."""
    scored = []
    entries = [PlanEntry(position, record.length) for position, record in enumerate(stored)]
    for batch in plan_batches(entries, REHEAD_BATCH_TOKENS, max_batch_size=len(entries)):
        chosen = [stored[position] for position in batch.indices]
        hidden = pad_states([record.hidden for record in chosen], batch.padded_length)
        records = [record.encoded for record in chosen]
        logits = head_logits(head, hidden.to(device), lexical, records)
        pairs = zip(records, logits, strict=True)
        scored.extend(scored_record(record, record_logits) for record, record_logits in pairs)
    return scored


def _check_same_job(source: Checkpoint, current: dict[str, Any]) -> None:
    """The inputs and encoding settings must be those of the job that filled the checkpoint."""
    stored = source.manifest
    keep = lambda manifest: {  # noqa: E731
        "inputs": manifest.get("inputs"),
        "settings": {k: v for k, v in (manifest.get("settings") or {}).items() if k != "dtype"},
        "backbone": {k: (manifest.get("model") or {}).get(k) for k in ("config_sha256", "weights")},
    }
    differences = describe_differences(keep(stored), keep(current))
    if differences:
        raise ClefError(f"checkpoint {source.path} does not belong to this job: " + "; ".join(differences))


def rehead(settings: ScoreSettings, progress: Progress | None = None) -> JobSummary:
    """Score the job's stored hidden states with the head in `settings.rehead`; write the output."""
    assert settings.rehead is not None
    progress = progress or Progress()
    head_dir = Path(settings.rehead)
    head = load_joint_head(head_dir)
    if not (settings.checkpoint_path / MANIFEST).exists():
        raise ClefError(
            f"no checkpoint at {settings.checkpoint_path}; --rehead re-scores a finished job's checkpoint "
            "(see --checkpoint)"
        )
    with open_job(settings, progress, "float32", head_dir=head_dir, existing=True) as job:
        release, source = job.release, job.checkpoint
        if head.config.hidden_size != release.hidden_size:
            raise ModelLoadError(
                f"the head in {head_dir} expects hidden size {head.config.hidden_size}; "
                f"the backbone has {release.hidden_size}"
            )
        _check_same_job(source, job.manifest)
        total = count_records(job.settings.inputs, job.settings.limit)
        if total is not None and source.done.count < total:
            raise ClefError(
                f"checkpoint {source.path} holds {source.done.count} of {total} records; finish the job before --rehead"
            )
        progress.start(source.done.count, 0)
        device = resolve_device(job.settings.device)
        workdir = job.settings.output.with_name(f".{job.settings.output.name}.rehead")
        shutil.rmtree(workdir, ignore_errors=True)
        target = Checkpoint.open(workdir, job.manifest)
        try:
            _rescore(job, head.to(device), family_of(release).lexical_rows(release).to(device), target, device)
            manifest = job.manifest | {"settings": source.manifest["settings"]}
            summary = job.finish(target.results(), {"clef.rehead_from": str(source.path)}, manifest=manifest)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    summary.resumed = summary.scored
    return summary


def _rescore(job: Job, head: JointSchemaHead, lexical: torch.Tensor, target: Checkpoint, device: torch.device) -> None:
    """Every stored record through the new head, shard by shard; failed records stay failed."""
    source = job.checkpoint
    failures = _failures(source)
    if failures:
        target.commit(results_table([], failures))
    reader = source.hidden_reader()
    missing = source.done.count - len(failures) - reader.num_records
    if missing > 0:
        raise ClefError(
            f"{missing} scored records in {source.path} have no stored hidden states "
            "(the job ran with --hidden-states drop); rerun it with --hidden-states keep"
        )
    for _, stored in reader.by_shard():
        results = _score_stored(head, lexical, stored, device)
        lengths = {record.encoded.record.index: record.length for record in stored}
        checked = [non_finite_failure(result, lengths[result.index]) or result for result in results]
        scored = [result for result in checked if isinstance(result, ScoredRecord)]
        failed = [result for result in checked if isinstance(result, FailedRecord)]
        target.commit(results_table(scored, failed))
        tokens = sum(record.length for record in stored)
        job.summary.tokens += tokens
        job.progress.advance(len(checked), tokens, len(failed))


def _failures(source: Checkpoint) -> list[FailedRecord]:
    table = source.results().select(["id", "record_index", "error", "prompt_tokens"])
    failed = table.filter(table.column("error").is_valid())
    return [
        FailedRecord(row["id"], row["record_index"], row["error"], row["prompt_tokens"]) for row in failed.to_pylist()
    ]
