"""`clef train-head`: fit the joint head to a user's gold labels from a checkpoint's stored hidden
states, and write it only when k-fold held-out proof says it beats the base head recalibrated to
the same labels.

Records are split into k folds (identical prompts share one); `cross_fit.py` gives every record
held-out predictions of the base head, the recalibrated base head, the trained head and a linear
probe, `train_report.py` turns them into the report and the gate's verdict (`gate.py`), and the
head written is trained on every gold record for the folds' median best epoch count.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from clef_cli import __version__
from clef_cli.errors import ClefError, ModelLoadError, UsageError
from clef_cli.model.head import JointSchemaHead, load_joint_head
from clef_cli.quality.labels.gold import GoldSet, gold_sha256, match_gold, read_gold_rows
from clef_cli.quality.train.cross_fit import cross_fit
from clef_cli.quality.train.fit import Example, FitSettings, fit
from clef_cli.quality.train.folds import assign_folds
from clef_cli.quality.train.report import held_out_report
from clef_cli.release import HEAD_CONFIG, HEAD_WEIGHTS, Release, file_sha256, resolve_release
from clef_cli.sizes import plural
from clef_cli.store.atomic import ensure_writable_folder, write_bytes, write_text
from clef_cli.store.checkpoint import MANIFEST, Checkpoint
from clef_cli.store.hidden_store import HiddenReader, load_states
from clef_cli.store.manifest import scored_model

REPORT_FILE = "training_report.json"
BOOTSTRAP_RESAMPLES = 2000


class GateRefused(ClefError):
    """The trained head did not prove itself on held-out records; nothing was written."""

    def __init__(self, report: dict[str, Any]) -> None:
        self.report = report
        numbers = report["held_out"]["log_loss_difference"]
        worse = report["gate"]["significantly_worse"]
        reason = f"; significantly worse on {', '.join(worse)}" if worse else ""
        super().__init__(
            f"the trained head did not beat the recalibrated base head on held-out records (log loss difference "
            f"{numbers['mean']:+.4f}, 95% CI [{numbers['ci95'][0]:+.4f}, {numbers['ci95'][1]:+.4f}]{reason}); "
            "nothing written (--force writes it anyway)"
        )


@dataclass
class TrainHeadSettings:
    checkpoint: Path | str
    """A checkpoint folder or a store in a bucket (s3://bucket/store/)."""
    gold: Path | str
    output: Path
    model: str | None = None
    """Release the checkpoint was scored with; default the id in its manifest."""
    base_head: Path | None = None
    """Head to start from and to beat; default the release's own."""
    scored: Path | str | None = None
    """A `clef score` output whose record_key maps its gold ids to stored states (`stored_gold`)."""
    revision: str | None = None
    fit: FitSettings = field(default_factory=FitSettings)
    folds: int = 5
    seed: int = 0
    device: str = "auto"
    force: bool = False
    bootstrap_resamples: int = BOOTSTRAP_RESAMPLES
    gold_format: str = "auto"
    """auto, table, label-studio or argilla (see quality/labels/exports.py)."""
    records: tuple[str | Path, ...] = ()
    """The records `clef score` took: gold records stored without hidden states (selective or drop)
    get them computed first (engines/on_demand.py), the thinker running on those only."""
    questions: Path | str | None = None
    """The `--questions` schema those records were scored with, when they carry none."""


class TrainProgress(Protocol):
    def stage(self, message: str) -> None: ...
    def epoch(self, run: str, epoch: int, epochs: int, loss: float) -> None: ...


class SilentTrainProgress:
    def stage(self, message: str) -> None:
        pass

    def epoch(self, run: str, epoch: int, epochs: int, loss: float) -> None:
        pass


@dataclass
class TrainHeadResult:
    report: dict[str, Any]
    head: JointSchemaHead
    """The head trained on every gold record (fp32, in memory)."""
    written: bool


# ----------------------------------------------------------------------------- inputs


def _check_output(settings: TrainHeadSettings, base_dir: Path) -> None:
    """HEAD_DIR is new, empty or an earlier train-head output: never a release or anything else."""
    output = settings.output
    if output.exists() and not output.is_dir():
        raise UsageError(f"-o {output} is a file; give a folder for the head")
    if output.resolve() == base_dir.resolve():
        raise UsageError(f"-o {output} is the base head's folder; write the trained head to a new folder")
    ours = {HEAD_CONFIG, HEAD_WEIGHTS, REPORT_FILE}
    if output.is_dir():
        others = sorted(path.name for path in output.iterdir() if path.name not in ours)
        if others:
            raise UsageError(f"-o {output} holds other files ({', '.join(others[:3])}); give a new or empty folder")


def gold_examples(
    reader: HiddenReader,
    gold_path: Path | str,
    gold_format: str = "auto",
    checkpoint: Checkpoint | None = None,
    scored: Path | str | None = None,
    notes: list[str] | None = None,
) -> tuple[list[Example], GoldSet]:
    """Stored records named in the gold file (headers only), with each question's gold position;
    with `scored`, gold ids reach the states through its record_key, else through the ids the
    states were stored under (`stored_gold`; how an ambiguous id was mapped goes to `notes`)."""
    from clef_cli.quality.labels.stored import gold_stored

    rows, found = read_gold_rows(gold_path, gold_format)
    stored = gold_stored(checkpoint, reader, {record_id for record_id, _ in rows}, scored, notes)
    options = {
        record_id: {question.id: (question.type, question.option_ids) for question in record.encoded.record.questions}
        for record_id, record in stored
    }
    gold = match_gold(rows, options, sha256=gold_sha256(gold_path), found=found)
    examples = []
    for record_id, record in stored:
        labels = gold.labels.get(record_id)
        if labels:
            targets = tuple(
                question.option_ids.index(labels[question.id]) if question.id in labels else -1
                for question in record.encoded.record.questions
            )
            examples.append(Example(record, targets))
    return examples, gold


def _check_records_questions(settings: TrainHeadSettings) -> None:
    """`--records` keys each record as `clef score` did; a record that carries no questions was
    read with a --questions file, and without it would be refused, so no state gets computed and
    the store then seems to lack --records. Checked on the first gold record (the records of one
    job carry their questions alike), before anything runs."""
    if not settings.records or settings.questions is not None:
        return
    from clef_cli.inputs.readers import read_records
    from clef_cli.inputs.records import NO_QUESTIONS, InvalidRecord

    rows, _ = read_gold_rows(settings.gold, settings.gold_format)
    wanted = {record_id for record_id, _ in rows}
    first = next((record for record in read_records(settings.records) if record.id in wanted), None)
    if isinstance(first, InvalidRecord) and NO_QUESTIONS in first.error:
        raise UsageError(
            f"--records: record {first.id!r} carries no questions; add --questions with the file "
            "its job was scored with"
        )


def _open_inputs(settings: TrainHeadSettings, checkpoint: Checkpoint) -> tuple[HiddenReader, Release, Path]:
    reader = checkpoint.hidden_reader()
    if reader.num_records == 0:  # refusals (exit 2): the store and the gold are read, nothing is written
        raise UsageError(
            f"checkpoint {settings.checkpoint} holds no hidden states (its job ran with --hidden-states drop); "
            "pass --records with the records it scored to compute the gold records' states"
        )
    manifest = checkpoint.manifest
    model = scored_model(manifest, settings.model)
    release = resolve_release(model, revision=settings.revision)
    if file_sha256(release.path / "config.json") != (manifest.get("model") or {}).get("config_sha256"):
        raise UsageError(
            f"checkpoint {settings.checkpoint} was scored with another backbone than {model} "
            "(config.json differs); pass --model with the release it was scored with"
        )
    return reader, release, settings.base_head or release.path


# ----------------------------------------------------------------------------- the job


def train_head(settings: TrainHeadSettings, progress: TrainProgress | None = None) -> TrainHeadResult:
    """Cross-fit, gate, train on everything, and write HEAD_DIR when the gate passes (or `force`).

    Raises `GateRefused` (with the report's numbers) when the gate fails and `force` is off. The
    checkpoint and HEAD_DIR are locked as a job's are, so no job writes them meanwhile."""
    from clef_cli.store.location import lock_slot, store_location
    from clef_cli.store.locks import job_locks
    from clef_cli.store.opening import open_existing_store

    if settings.folds < 2:
        raise UsageError("--folds must be at least 2")
    ensure_writable_folder(settings.output, "-o")
    progress = progress or SilentTrainProgress()
    computed = None
    _check_records_questions(settings)
    if settings.records:  # before the locks: the run that computes them takes the checkpoint's own
        from clef_cli.engines.on_demand import gold_states

        computed = gold_states(
            settings.checkpoint, settings.records, settings.gold, settings.gold_format, settings.model,
            settings.device, settings.questions,
        )  # fmt: skip
        progress.stage(computed.describe())
    location, slot = store_location(settings.checkpoint), None
    if location.remote:  # a bucket store's cache folder, chosen and locked in one step
        location, slot = lock_slot(location)
    with job_locks(settings.output, location.folder, slot):
        checkpoint = open_existing_store(location)
        try:
            return _train_head(settings, checkpoint, progress, computed)
        finally:  # closed on every way out: a refusal leaves the store as it was (no SQLite WAL)
            checkpoint.close()


def states_computed(computed: Any | None) -> dict[str, Any]:
    """training_report.json's `states_computed`: what running the thinker for `--records` cost
    (`computed`: engines.on_demand.OnDemandCost; zeros without --records)."""
    if computed is None:
        return {"records": 0, "tokens": 0, "seconds": 0.0, "summary": "no --records: the thinker did not run"}
    return {
        "records": computed.records, "tokens": computed.tokens, "seconds": round(computed.seconds, 3),
        "summary": computed.describe(),
    }  # fmt: skip


def _report(
    settings: TrainHeadSettings,
    checkpoint: Checkpoint,
    release: Release,
    base_dir: Path,
    gold: GoldSet,
    examples: Sequence[Example],
    device: str,
) -> dict[str, Any]:
    """What the run was given and did, for training_report.json (the held-out part is added after)."""
    return {
        "clef_version": __version__,
        "settings": {
            **asdict(settings.fit),
            "folds": settings.folds,
            "seed": settings.seed,
            "device": device,
            "force": settings.force,
            "bootstrap_resamples": settings.bootstrap_resamples,
        },
        "inputs": {
            "checkpoint": str(settings.checkpoint),
            "checkpoint_manifest_sha256": file_sha256(checkpoint.path / MANIFEST),
            "gold": str(settings.gold),
            "gold_sha256": gold.sha256,
            "model": str(release.path),
            "base_head": str(base_dir),
            "base_head_sha256": file_sha256(base_dir / HEAD_WEIGHTS),
            "base_head_config_sha256": file_sha256(base_dir / HEAD_CONFIG),
        },
        "gold": {
            "records": len(examples),
            "labels": gold.n_labels,
            "problems": len(gold.problems),
            "first_problems": [problem.message for problem in gold.problems[:20]],
        },
    }


def _prepare(settings: TrainHeadSettings, checkpoint: Checkpoint, progress: TrainProgress) -> tuple:
    """Check every input; returns (release, base dir, base head, examples, gold)."""
    reader, release, base_dir = _open_inputs(settings, checkpoint)
    _check_output(settings, base_dir)
    base = load_joint_head(base_dir)
    notes: list[str] = []
    examples, gold = gold_examples(reader, settings.gold, settings.gold_format, checkpoint, settings.scored, notes)
    for note in notes:
        progress.stage(note)
    if not examples:
        first = f" (first problem: {gold.problems[0].message})" if gold.problems else ""
        raise UsageError(f"gold file {settings.gold} matches no stored record of {settings.checkpoint}{first}")
    width = load_states([examples[0].stored])[0].shape[-1]
    if base.config.hidden_size != width or base.config.hidden_size != release.hidden_size:
        raise ModelLoadError(
            f"the head in {base_dir} expects hidden size {base.config.hidden_size}; the stored hidden states "
            f"have {width} and the backbone {release.hidden_size}"
        )
    if len(examples) < settings.folds:
        found = plural(len(examples), "gold record")
        raise UsageError(f"{found} with stored states: fewer than --folds {settings.folds}")
    used = {example.stored.shard for example in examples}  # the gold records' shards: no other is read
    progress.stage(f"verifying {plural(len(used), 'hidden-state shard')}")
    reader.verify(used)
    return release, base_dir, base, examples, gold


def _train_head(
    settings: TrainHeadSettings, checkpoint: Checkpoint, progress: TrainProgress, computed: Any | None
) -> TrainHeadResult:
    from clef_cli.families import family_of
    from clef_cli.model.backbone import resolve_device

    release, base_dir, base, examples, gold = _prepare(settings, checkpoint, progress)
    device = resolve_device(settings.device)
    lexical = family_of(release).lexical_rows(release).to(device)
    folds = assign_folds(examples, settings.folds, settings.seed)
    progress.stage(
        f"{plural(len(examples), 'gold record')}, {plural(gold.n_labels, 'label')}, {plural(settings.folds, 'fold')}"
    )
    crossed = cross_fit(
        base, lexical, examples, folds, settings.fit, settings.seed, device,
        lambda run, epoch, loss: progress.epoch(run, epoch, settings.fit.epochs, loss),
    )  # fmt: skip
    report = _report(settings, checkpoint, release, base_dir, gold, examples, str(device))
    report["folds"] = crossed.folds
    report["states_computed"] = states_computed(computed)
    report.update(held_out_report(examples, crossed, settings.bootstrap_resamples, settings.seed))
    report["gate"]["forced"] = settings.force and not report["gate"]["passed"]
    if not report["gate"]["passed"] and not settings.force:
        raise GateRefused(report)

    epochs = int(np.median(crossed.best_epochs))
    progress.stage(f"training on every gold record ({plural(epochs, 'epoch')}, the folds' median best)")
    final = copy.deepcopy(base)
    report["final_epochs"] = epochs
    report["loss_curve"] = fit(
        final, lexical, examples, settings.fit, settings.seed, device,
        lambda epoch, loss: progress.epoch("all records", epoch, epochs, loss), stop_after=epochs,
    ).curve  # fmt: skip
    final = final.cpu().eval()
    save_head(final, base_dir, settings.output, report)
    return TrainHeadResult(report=report, head=final, written=True)


def save_head(head: JointSchemaHead, base_dir: Path, output: Path, report: dict[str, Any]) -> None:
    """The release layout, in the base head's dtype: weights, the base's config bytes, the report."""
    from safetensors import safe_open
    from safetensors.torch import save

    with safe_open(str(base_dir / HEAD_WEIGHTS), framework="pt") as handle:
        dtype = handle.get_tensor("residual_gate").dtype
    state = {name: value.detach().to("cpu", dtype).contiguous() for name, value in head.state_dict().items()}
    weights = save(state)
    config = (base_dir / HEAD_CONFIG).read_bytes()
    report["new_head"] = {
        "sha256": hashlib.sha256(weights).hexdigest(),
        "dtype": str(dtype).removeprefix("torch."),
        "parameters": sum(value.numel() for value in state.values()),
    }
    report["created"] = time.time()
    output.mkdir(parents=True, exist_ok=True)
    write_bytes(output / HEAD_WEIGHTS, weights)
    write_bytes(output / HEAD_CONFIG, config)
    text = json.dumps(report, indent=2, sort_keys=True)
    write_text(output / REPORT_FILE, text)
