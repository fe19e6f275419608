"""Re-scoring a finished job with another joint head, from the hidden states in its checkpoint.

The thinker is never loaded: the stored final hidden states are what the head reads, and the
only other backbone tensor the head needs (the lm_head rows) is read from its weight shard.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from clef_cli.encoding.batching import PlanEntry, plan_batches
from clef_cli.engines.on_demand import OnDemandCost, compute_missing_states
from clef_cli.errors import ClefError, ModelLoadError, UsageError
from clef_cli.families import family_of
from clef_cli.job.lifecycle import Job, open_job
from clef_cli.job.plan import plan_job, store_of
from clef_cli.job.settings import ScoreSettings
from clef_cli.job.summary import JobSummary
from clef_cli.model.backbone import resolve_device
from clef_cli.model.head import JointSchemaHead, load_joint_head
from clef_cli.model.scoring import head_logits, non_finite_failure, scored_record
from clef_cli.progress import Progress
from clef_cli.release import DEFAULT_MODEL, HEAD_CONFIG, HEAD_FILES, HEAD_WEIGHTS
from clef_cli.results import FailedRecord, ScoredRecord, results_table
from clef_cli.store import durable
from clef_cli.store.checkpoint import Checkpoint
from clef_cli.store.hidden_store import HiddenShardFile, StoredRecord, check_shard, pad_states, read_shard
from clef_cli.store.manifest import describe_differences, scored_model, stored_engine
from clef_cli.store.opening import stored_manifest

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


def _check_same_backbone(source: Checkpoint, current: dict[str, Any]) -> None:
    """The stored hidden states must come from this backbone (the head may differ)."""
    keep = lambda manifest: {  # noqa: E731
        "backbone": {k: (manifest.get("model") or {}).get(k) for k in ("config_sha256", "weights")},
    }
    differences = describe_differences(keep(source.manifest), keep(current))
    if differences:
        raise ClefError(f"checkpoint {source.where} was scored with another backbone: " + "; ".join(differences))


def _check_complete(job: Job) -> None:
    """Every record of the job must have its result, and a score its hidden states, in the store
    (those it lacked were computed just before, `on_demand.py`; a record that failed to encode
    then is still without)."""
    counts, source = job.ledger.counts, job.checkpoint
    missing = counts.run - counts.unhidden - counts.retried  # a retried key has its stored (error) row
    if missing:
        raise ClefError(
            f"checkpoint {source.where} holds {counts.records - counts.invalid - missing} of "
            f"{counts.records - counts.invalid} records of this job; finish the job before --rehead"
        )
    if counts.unhidden:
        raise ClefError(
            f"{counts.unhidden} scored records in {source.where} have no stored hidden states and computing "
            "them failed; rerun the job with --hidden-states keep"
        )


def check_head_folder(path: Path) -> None:
    """`--rehead` names a head folder (what train-head's -o writes); a file, an empty folder or a
    wrong path is the user's slip, answered naming the option (exit 2)."""
    if not path.exists() or path.is_file():
        what = "is a file" if path.exists() else "does not exist"
    else:
        missing = [name for name in HEAD_FILES if not (path / name).is_file()]
        if not missing:
            return
        what = f"has no {' and no '.join(missing)}"
    raise UsageError(
        f"--rehead {path} {what}: give a head folder holding {HEAD_CONFIG} and {HEAD_WEIGHTS} "
        "(what `clef train-head -o` writes)"
    )


def rehead(
    settings: ScoreSettings, progress: Progress | None = None, stop: threading.Event | None = None
) -> JobSummary:
    """Score the job's stored hidden states with the head in `settings.rehead`; write the output.
    Without a model (`settings.model` None) the release is the one the store's manifest names.
    A stop request (`stop`) ends it interrupted, between shards or while the output is written."""
    assert settings.rehead is not None
    progress = progress or Progress()
    head_dir = Path(settings.rehead)
    check_head_folder(head_dir)
    store = store_of(settings)
    manifest = stored_manifest(store)
    if manifest is None:
        raise UsageError(f"no checkpoint at {store}; --rehead re-scores a finished job's checkpoint (see --checkpoint)")
    settings = replace(settings, model=scored_model(manifest, settings.model) or DEFAULT_MODEL)
    settings = replace(settings, engine=stored_engine(manifest))  # the store's own: its states, its metadata
    head = load_joint_head(head_dir)
    computed: OnDemandCost | None = None
    plan = plan_job(settings, progress=progress)
    while True:
        with open_job(plan, progress, "float32", head_dir=head_dir, existing=True, stop=stop) as job:
            if not job.ledger.counts.unhidden or computed is not None:
                return _rehead_job(job, head, head_dir, computed or OnDemandCost(0, 0, 0.0))
        # states missing (a store kept under `selective` or `drop`): the thinker runs on those
        # records only (its own job, under the locks), then the store is read again, once
        computed = compute_missing_states(settings, progress, stop=stop)


def _rehead_job(job: Job, head: JointSchemaHead, head_dir: Path, computed: OnDemandCost) -> JobSummary:
    """The open job's stored states through `head`, the output written."""
    release, source, progress = job.release, job.checkpoint, job.progress
    if head.config.hidden_size != release.hidden_size:
        raise ModelLoadError(
            f"the head in {head_dir} expects hidden size {head.config.hidden_size}; "
            f"the backbone has {release.hidden_size}"
        )
    _check_same_backbone(source, job.manifest)
    _check_complete(job)
    progress.start(job.ledger.counts.records, 0)
    device = resolve_device(job.settings.device)
    workdir = job.plan.output.path.with_name(f".{job.plan.output.path.name}.rehead")
    durable.rmtree(workdir, ignore_errors=True)
    target = Checkpoint.open(workdir, job.manifest)
    try:
        target.begin_run()
        _rescore(job, head.to(device), family_of(release).lexical_rows(release).to(device), target, device)
        manifest = job.manifest | {"settings": source.manifest["settings"]}
        if computed.records:
            job.summary.notes.append(computed.describe())
        # the summary's time is the whole command's, the states computed first included
        job.summary.rehead_states_computed = computed.records
        job.started -= computed.seconds
        described = {"clef.rehead_from": source.where, "clef.rehead_states_computed": str(computed.records)}
        return job.finish(job.results(target), described, manifest=manifest)
    finally:
        target.close()
        durable.rmtree(workdir, ignore_errors=True)


def _rescore(job: Job, head: JointSchemaHead, lexical: torch.Tensor, target: Checkpoint, device: torch.device) -> None:
    """The job's stored keys (each once, and no other record of the store) through the new head,
    shard by shard, keyed as in the store; final errors stay errors."""
    source = job.checkpoint
    entries = {entry.name: entry for entry in source.entries}
    hidden_files = {shard.path.name: shard for shard in source.hidden_shards()}
    for name, rows in job.ledger.stored_rows().items():
        if job.stop.is_set():
            return  # `finish` then reports the job interrupted
        table = source.shard_table(name).take(pa.array(rows, pa.int64()))
        failed = table.filter(table.column("error").is_valid())
        if failed.num_rows:
            target.commit(failed)
        wanted = table.filter(table.column("error").is_null())
        if wanted.num_rows:
            shard = hidden_files[entries[name].files["hidden"]["name"]]
            _rescore_rows(job, head, lexical, target, device, shard, wanted)


def _rescore_rows(
    job: Job,
    head: JointSchemaHead,
    lexical: torch.Tensor,
    target: Checkpoint,
    device: torch.device,
    shard: HiddenShardFile,
    wanted: pa.Table,
) -> None:
    """The `wanted` rows' stored states (read from their one shard) through the head, committed.
    Their tokens are the records' real prompt tokens, as a scoring run counts them."""
    check_shard(shard)
    indices, stored_keys = wanted.column("record_index").to_pylist(), wanted.column("record_key").to_pylist()
    key_of = dict(zip(indices, stored_keys, strict=True))
    stored = read_shard(shard.path, only=key_of.keys())
    lengths = {record.encoded.record.index: record.length for record in stored}
    checked = [
        non_finite_failure(result, lengths[result.index]) or result
        for result in _score_stored(head, lexical, stored, device)
    ]
    rows = results_table(
        [result for result in checked if isinstance(result, ScoredRecord)],
        [result for result in checked if isinstance(result, FailedRecord)],
    )
    keys = pa.array([key_of.get(index) for index in rows.column("record_index").to_pylist()], pa.string())
    target.commit(rows.set_column(rows.schema.get_field_index("record_key"), "record_key", keys))
    tokens = sum(record.length for record in stored)
    job.summary.tokens += tokens
    job.progress.advance(len(checked), tokens, len(rows) - rows.column("error").null_count)
