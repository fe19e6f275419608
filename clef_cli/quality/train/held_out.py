"""Held-out metrics of `clef train-head`, per record (what the gate pairs) and per question (what
a user compares: base, recalibrated base, trained head and the probe on the same records)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from clef_cli.quality.train.fit import Example
from clef_cli.quality.train.gate import paired_bootstrap


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


def summary(metrics: dict, resamples: int, seed: int) -> dict[str, Any]:
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


def question_losses(
    examples: Sequence[Example], probabilities: Sequence[Sequence[torch.Tensor | None]]
) -> dict[str, dict[str, np.ndarray]]:
    """Per question id: -ln p(gold) and top-1 correctness of each labelled record, in record order
    (records whose prediction is None are left out)."""
    out: dict[str, dict[str, list]] = {}
    for example, probs in zip(examples, probabilities, strict=True):
        for question, target, p in zip(example.stored.encoded.record.questions, example.targets, probs, strict=True):
            if target < 0 or p is None:
                continue
            numbers = out.setdefault(question.id, {"log_loss": [], "correct": []})
            numbers["log_loss"].append(-float(torch.log(p[target].clamp(min=1e-300))))
            numbers["correct"].append(float(int(torch.argmax(p)) == target))
    return {qid: {name: np.array(values) for name, values in numbers.items()} for qid, numbers in out.items()}


def question_table(examples: Sequence[Example], models: dict[str, Sequence[Sequence[torch.Tensor | None]]]) -> dict:
    """{question id: {model: {"log_loss", "accuracy", "labels"}}}: each model's mean held-out
    log loss and accuracy over the question's labelled records (the probe: those it answers)."""
    table: dict[str, dict[str, Any]] = {}
    for name, probabilities in models.items():
        for question_id, numbers in question_losses(examples, probabilities).items():
            table.setdefault(question_id, {})[name] = {
                "labels": len(numbers["log_loss"]),
                "log_loss": float(numbers["log_loss"].mean()),
                "accuracy": float(numbers["correct"].mean()),
            }
    return dict(sorted(table.items()))
