"""`clef train-head`: fit the joint head to a user's gold labels from a checkpoint's stored hidden
states, and write it only when k-fold held-out proof says it beats the head it started from.

The gate: records are split into k folds (exact duplicate prompts, hence duplicate states, share
a fold); for each fold a copy of the base head is trained on the other folds and both heads
predict the held-out fold. The head is written when the mean per-record held-out log loss of the
trained heads is lower than the base head's and the bootstrap 95% interval of the paired
difference lies below zero; the written head is then trained once on every gold record.
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
import torch

from clef_cli import __version__
from clef_cli.errors import ClefError, ModelLoadError, UsageError
from clef_cli.model.head import JointSchemaHead, load_joint_head
from clef_cli.quality.gold import GoldSet, match_gold, read_gold_rows
from clef_cli.quality.head_training import Example, FitSettings, fit, predict
from clef_cli.quality.metrics import percentile_interval
from clef_cli.release import HEAD_CONFIG, HEAD_WEIGHTS, Release, file_sha256, resolve_release
from clef_cli.store.atomic import ensure_writable_folder, write_bytes, write_text
from clef_cli.store.checkpoint import MANIFEST, Checkpoint
from clef_cli.store.hidden_store import HiddenReader, load_states

REPORT_FILE = "training_report.json"
BOOTSTRAP_RESAMPLES = 2000
GATE_RULE = "held-out log loss lower than the base head's, bootstrap 95% interval of the difference below zero"


class GateRefused(ClefError):
    """The trained head did not prove itself on held-out records; nothing was written."""

    def __init__(self, report: dict[str, Any]) -> None:
        self.report = report
        numbers = report["held_out"]["log_loss_difference"]
        super().__init__(
            f"the trained head did not beat the base head on held-out records (log loss difference "
            f"{numbers['mean']:+.4f}, 95% CI [{numbers['ci95'][0]:+.4f}, {numbers['ci95'][1]:+.4f}]); "
            "nothing written (--force writes it anyway)"
        )


@dataclass
class TrainHeadSettings:
    checkpoint: Path
    gold: Path
    output: Path
    model: str | None = None
    """Release the checkpoint was scored with; default the id in its manifest."""
    base_head: Path | None = None
    """Head to start from and to beat; default the release's own."""
    revision: str | None = None
    fit: FitSettings = field(default_factory=FitSettings)
    folds: int = 5
    seed: int = 0
    device: str = "auto"
    force: bool = False
    bootstrap_resamples: int = BOOTSTRAP_RESAMPLES
    gold_format: str = "auto"
    """auto, table, label-studio or argilla (see quality/gold_exports.py)."""


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


def gold_examples(reader: HiddenReader, gold_path: Path, gold_format: str = "auto") -> tuple[list[Example], GoldSet]:
    """Stored records named in the gold file (headers only), with each question's gold position."""
    rows, found = read_gold_rows(gold_path, gold_format)
    wanted = {record_id for record_id, _ in rows}
    stored = [record for record in reader.records(states=False, verify=False) if record.id in wanted]
    options = {
        record.id: {
            question.id: (question.type, question.option_ids) for question in record.encoded.record.questions
        }
        for record in stored
    }
    gold = match_gold(rows, options, sha256=file_sha256(gold_path), found=found)
    examples = []
    for record in stored:
        labels = gold.labels.get(record.id)
        if labels:
            targets = tuple(
                question.option_ids.index(labels[question.id]) if question.id in labels else -1
                for question in record.encoded.record.questions
            )
            examples.append(Example(record, targets))
    return examples, gold


def _open_inputs(settings: TrainHeadSettings) -> tuple[Checkpoint, HiddenReader, Release, Path]:
    checkpoint = Checkpoint.open_existing(settings.checkpoint)
    reader = checkpoint.hidden_reader()
    if reader.num_records == 0:
        raise ClefError(
            f"checkpoint {settings.checkpoint} holds no hidden states (its job ran with --hidden-states drop); "
            "score the records again with --hidden-states keep (the default) to train a head on them"
        )
    manifest = checkpoint.manifest
    model = settings.model or (manifest.get("model") or {}).get("id")
    release = resolve_release(model, revision=settings.revision)
    if file_sha256(release.path / "config.json") != (manifest.get("model") or {}).get("config_sha256"):
        raise ClefError(
            f"checkpoint {settings.checkpoint} was scored with another backbone than {model} "
            "(config.json differs); pass --model with the release it was scored with"
        )
    return checkpoint, reader, release, settings.base_head or release.path


# ----------------------------------------------------------------------------- folds and metrics


def assign_folds(examples: Sequence[Example], folds: int, seed: int) -> list[int]:
    """Fold of each example: groups of identical input ids (identical states) are shuffled with
    `seed` and dealt, largest first, to the fold with the fewest records."""
    groups: dict[str, list[int]] = {}
    for position, example in enumerate(examples):
        key = hashlib.sha256(np.asarray(example.stored.input_ids, dtype=np.int64).tobytes()).hexdigest()
        groups.setdefault(key, []).append(position)
    members = list(groups.values())
    order = np.random.default_rng(seed).permutation(len(members))
    order = sorted(order.tolist(), key=lambda group: -len(members[group]))  # stable: shuffled among equals
    assignment = [0] * len(examples)
    sizes = [0] * folds
    for group in order:
        fold = min(range(folds), key=lambda number: (sizes[number], number))
        sizes[fold] += len(members[group])
        for position in members[group]:
            assignment[position] = fold
    return assignment


def per_record_metrics(examples: Sequence[Example], probabilities: Sequence[Sequence[torch.Tensor]]) -> dict:
    """Per record: mean over its labelled questions of -ln p(gold), of the Brier score
    sum_o (p_o - y_o)^2, and of top-1 correctness (ties: first option in head order)."""
    log_loss, brier, correct, question_ids = [], [], [], []
    for example, probs in zip(examples, probabilities, strict=True):
        record_ll, record_brier = [], []
        for question, target, p in zip(example.stored.encoded.record.questions, example.targets, probs, strict=True):
            if target < 0:
                continue
            onehot = torch.zeros_like(p)
            onehot[target] = 1.0
            record_ll.append(-float(torch.log(p[target].clamp(min=1e-300))))
            record_brier.append(float(((p - onehot) ** 2).sum()))
            correct.append(int(torch.argmax(p)) == target)
            question_ids.append(question.id)
        log_loss.append(float(np.mean(record_ll)))
        brier.append(float(np.mean(record_brier)))
    return {
        "log_loss": np.array(log_loss),
        "brier": np.array(brier),
        "correct": np.array(correct, dtype=float),
        "question_ids": question_ids,
    }


def paired_bootstrap(values: np.ndarray, resamples: int, seed: int) -> tuple[float, float]:
    """Percentile 95% interval of the mean of `values` (records resampled with replacement)."""
    rng = np.random.default_rng(seed)
    means = []
    for start in range(0, resamples, 256):
        rows = min(256, resamples - start)
        means.append(values[rng.integers(0, len(values), size=(rows, len(values)))].mean(axis=1))
    low, high = percentile_interval(np.concatenate(means))
    return low, high


def _summary(metrics: dict, resamples: int, seed: int) -> dict[str, Any]:
    by_question: dict[str, list[float]] = {}
    for question_id, value in zip(metrics["question_ids"], metrics["correct"], strict=True):
        by_question.setdefault(question_id, []).append(value)
    return {
        "log_loss": float(metrics["log_loss"].mean()),
        "log_loss_ci95": paired_bootstrap(metrics["log_loss"], resamples, seed),
        "brier": float(metrics["brier"].mean()),
        "brier_ci95": paired_bootstrap(metrics["brier"], resamples, seed),
        "accuracy": float(metrics["correct"].mean()),
        "accuracy_by_question": {qid: float(np.mean(values)) for qid, values in sorted(by_question.items())},
    }


# ----------------------------------------------------------------------------- the job


def train_head(settings: TrainHeadSettings, progress: TrainProgress | None = None) -> TrainHeadResult:
    """Cross-fit, gate, train on everything, and write HEAD_DIR when the gate passes (or `force`).

    Raises `GateRefused` (with the report's numbers) when the gate fails and `force` is off. The
    checkpoint and HEAD_DIR are locked as a job's are, so no job writes them meanwhile."""
    from clef_cli.store.locks import job_locks

    if settings.folds < 2:
        raise UsageError("--folds must be at least 2")
    ensure_writable_folder(settings.output, "-o")
    with job_locks(settings.output, settings.checkpoint):
        return _train_head(settings, progress or SilentTrainProgress())


def _report(
    settings: TrainHeadSettings,
    checkpoint: Checkpoint,
    release: Release,
    base_dir: Path,
    gold: GoldSet,
    examples: Sequence[Example],
    device: str,
    fold_reports: list[dict[str, Any]],
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
        "folds": fold_reports,
    }


def _train_head(settings: TrainHeadSettings, progress: TrainProgress) -> TrainHeadResult:
    from clef_cli.families import family_of
    from clef_cli.model.backbone import resolve_device

    checkpoint, reader, release, base_dir = _open_inputs(settings)
    _check_output(settings, base_dir)
    base = load_joint_head(base_dir)
    examples, gold = gold_examples(reader, settings.gold, settings.gold_format)
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
        raise UsageError(f"{len(examples)} gold records with stored states are fewer than --folds {settings.folds}")
    progress.stage(f"verifying {len(reader.shards)} hidden-state shards")
    reader.verify()
    device = resolve_device(settings.device)
    lexical = family_of(release).lexical_rows(release).to(device)
    tokens = settings.fit.batch_tokens
    folds = assign_folds(examples, settings.folds, settings.seed)
    progress.stage(f"{len(examples)} gold records, {gold.n_labels} labels, {settings.folds} folds")

    base_probs = predict(base, lexical, examples, tokens, device)
    trained_probs: list[list[torch.Tensor]] = [[] for _ in examples]
    fold_reports = []
    for fold in range(settings.folds):
        train = [example for example, number in zip(examples, folds, strict=True) if number != fold]
        held = [position for position, number in enumerate(folds) if number == fold]
        head = copy.deepcopy(base)
        name = f"fold {fold + 1}/{settings.folds}"
        curve = fit(
            head, lexical, train, settings.fit, settings.seed + fold + 1, device,
            lambda epoch, loss, name=name: progress.epoch(name, epoch, settings.fit.epochs, loss),
        )  # fmt: skip
        held_examples = [examples[position] for position in held]
        for position, probs in zip(held, predict(head, lexical, held_examples, tokens, device), strict=True):
            trained_probs[position] = probs
        after = per_record_metrics(held_examples, [trained_probs[p] for p in held])
        before = per_record_metrics(held_examples, [base_probs[p] for p in held])
        fold_reports.append(
            {
                "fold": fold,
                "records": len(held),
                "base": {"log_loss": float(before["log_loss"].mean()), "accuracy": float(before["correct"].mean())},
                "trained": {"log_loss": float(after["log_loss"].mean()), "accuracy": float(after["correct"].mean())},
                "loss_curve": curve,
            }
        )

    resamples, seed = settings.bootstrap_resamples, settings.seed
    after, before = per_record_metrics(examples, trained_probs), per_record_metrics(examples, base_probs)
    difference = after["log_loss"] - before["log_loss"]
    low, high = paired_bootstrap(difference, resamples, seed)
    passed = bool(difference.mean() < 0 and high < 0)
    report = _report(settings, checkpoint, release, base_dir, gold, examples, str(device), fold_reports)
    report["held_out"] = {
        "base": _summary(before, resamples, seed),
        "trained": _summary(after, resamples, seed),
        "log_loss_difference": {"mean": float(difference.mean()), "ci95": [low, high]},
    }
    report["gate"] = {"passed": passed, "forced": settings.force and not passed, "rule": GATE_RULE}
    if not passed and not settings.force:
        raise GateRefused(report)

    progress.stage("training on every gold record")
    final = copy.deepcopy(base)
    report["loss_curve"] = fit(
        final, lexical, examples, settings.fit, settings.seed, device,
        lambda epoch, loss: progress.epoch("all records", epoch, settings.fit.epochs, loss),
    )  # fmt: skip
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
