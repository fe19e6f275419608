"""k-fold cross-fitting for `clef train-head`: every gold record gets held-out predictions from
four models fitted on the other folds only: the base head as it is, the base head recalibrated
(`gate.fit_recalibration`), the trained head, and the linear probe (`probe.py`)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from clef_cli.model.head import JointSchemaHead
from clef_cli.quality.train.fit import Example, FitSettings, fit, predict
from clef_cli.quality.train.folds import inner_split
from clef_cli.quality.train.gate import CalibrationItem, fit_recalibration
from clef_cli.quality.train.probe import fit_probe, pooled_features
from clef_cli.store.hidden_store import load_states

Probabilities = list[list[torch.Tensor]]
"""Per example, per question (head order): option probabilities, float64."""
POOL_BATCH = 64


@dataclass
class CrossFit:
    base: Probabilities
    calibrated: Probabilities
    trained: Probabilities
    probe: list[list[torch.Tensor | None]]
    """None where the question has no probe (options differ between records, or no gold)."""
    folds: list[dict] = field(default_factory=list)
    best_epochs: list[int] = field(default_factory=list)


def _labelled(examples: Sequence[Example], positions: Sequence[int] | None = None) -> Iterator[tuple]:
    """(position, question number, question, gold position) of every labelled question."""
    for position in range(len(examples)) if positions is None else positions:
        example = examples[position]
        questions = example.stored.encoded.record.questions
        for number, (question, target) in enumerate(zip(questions, example.targets, strict=True)):
            if target >= 0:
                yield position, number, question, target


def _recalibrated(examples: Sequence[Example], base: Probabilities, train: list[int], held: list[int]) -> dict:
    """Held-out recalibrated probabilities {(position, question number): tensor}."""
    as_log = lambda p: np.log(np.clip(p.numpy(), 1e-300, None))  # noqa: E731
    items = [
        CalibrationItem(question.id, tuple(question.option_ids), as_log(base[position][number]), target)
        for position, number, question, target in _labelled(examples, train)
    ]
    calibration = fit_recalibration(items)
    out = {}
    for position in held:
        for number, question in enumerate(examples[position].stored.encoded.record.questions):
            log_p = calibration.apply(question.id, question.option_ids, as_log(base[position][number]))
            out[position, number] = torch.from_numpy(np.exp(log_p))
    return out


def probe_options(examples: Sequence[Example]) -> dict[str, tuple[str, ...]]:
    """Questions a probe can answer: those whose options are the same in every gold record."""
    seen: dict[str, set[tuple[str, ...]]] = {}
    for _, _, question, _ in _labelled(examples):
        seen.setdefault(question.id, set()).add(tuple(question.option_ids))
    return {question_id: next(iter(options)) for question_id, options in seen.items() if len(options) == 1}


def _probed(examples: Sequence[Example], features: np.ndarray, train: list[int], held: list[int]) -> dict:
    """Held-out probe probabilities {(position, question number): tensor}, fitted on `train`."""
    options = probe_options(examples)
    rows: dict[str, tuple[list[int], list[int]]] = {}
    for position, _, question, target in _labelled(examples, train):
        if question.id in options:
            rows.setdefault(question.id, ([], []))[0].append(position)
            rows[question.id][1].append(target)
    probes = {qid: fit_probe(features[xs], np.array(ys), len(options[qid])) for qid, (xs, ys) in rows.items()}
    out = {}
    for position in held:
        for number, question in enumerate(examples[position].stored.encoded.record.questions):
            if question.id in probes:
                log_p = probes[question.id].log_probabilities(features[position : position + 1])[0]
                out[position, number] = torch.from_numpy(np.exp(log_p))
    return out


def pooled_example_features(examples: Sequence[Example]) -> np.ndarray:
    """The probe's pooled features of every example (states read a batch at a time)."""
    chunks = [
        pooled_features(load_states([example.stored for example in examples[start : start + POOL_BATCH]]))
        for start in range(0, len(examples), POOL_BATCH)
    ]
    return np.concatenate(chunks)


def cross_fit(
    base_head: JointSchemaHead,
    lexical: torch.Tensor,
    examples: Sequence[Example],
    folds: Sequence[int],
    settings: FitSettings,
    seed: int,
    device: torch.device,
    on_epoch: Callable[[str, int, float], None],
) -> CrossFit:
    """Train and predict fold by fold; every prediction of a record comes from the other folds."""
    count = max(folds) + 1
    base = predict(base_head, lexical, examples, settings.batch_tokens, device)
    features = pooled_example_features(examples)
    result = CrossFit(base, [[] for _ in examples], [[] for _ in examples], [[] for _ in examples])
    for fold in range(count):
        train = [position for position, number in enumerate(folds) if number != fold]
        held = [position for position, number in enumerate(folds) if number == fold]
        head = copy.deepcopy(base_head)
        inner, validation = inner_split([examples[p] for p in train], settings.validation_fraction, seed + fold)
        name = f"fold {fold + 1}/{count}"
        run = fit(
            head, lexical, inner, settings, seed + fold + 1, device,
            lambda epoch, loss, name=name: on_epoch(name, epoch, loss), validation=validation,
        )  # fmt: skip
        result.best_epochs.append(run.best_epoch)
        predicted = predict(head, lexical, [examples[p] for p in held], settings.batch_tokens, device)
        calibrated = _recalibrated(examples, base, train, held)
        probed = _probed(examples, features, train, held)
        for position, probs in zip(held, predicted, strict=True):
            questions = range(len(examples[position].targets))
            result.trained[position] = probs
            result.calibrated[position] = [calibrated[position, q] for q in questions]
            result.probe[position] = [probed.get((position, q)) for q in questions]
        result.folds.append(
            {"fold": fold, "records": len(held), "best_epoch": run.best_epoch, "loss_curve": run.curve,
             "validation_log_loss": run.validation_curve}
        )  # fmt: skip
    return result
