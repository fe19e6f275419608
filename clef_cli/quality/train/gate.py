"""The gate of `clef train-head`: the baseline a trained head must beat, and the rule.

The baseline is the base head recalibrated on the training folds: per question, a temperature
and a bias per option, `p = softmax(ln p_base / T + b)`, fitted by L-BFGS to the training folds'
gold (log loss + 1e-3 * ||b||^2 / 2, so an option never labelled keeps a finite bias). A head that
only learns the label frequencies (the biases) or its confidence (the temperature) matches that
baseline and does not pass: only what the states say about each record can beat it.

The rule, on paired held-out differences `d = loss_trained - loss_baseline`: pass when the mean
over records is below zero, its bootstrap 95% interval lies below zero, and no question is
significantly worse (its own interval lies above zero).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize
from scipy.special import log_softmax

from clef_cli.quality.metrics import percentile_interval

BIAS_PENALTY = 1e-3
FEW_LABELS = 50


@dataclass(frozen=True)
class CalibrationItem:
    """One labelled question of one record: the base head's log-probabilities over its options."""

    question_id: str
    option_ids: tuple[str, ...]
    log_probs: np.ndarray
    target: int


@dataclass
class Recalibration:
    """Per question: `1 / T` and a bias per option id (options it never saw keep bias 0)."""

    inverse_temperature: dict[str, float] = field(default_factory=dict)
    bias: dict[str, dict[str, float]] = field(default_factory=dict)

    def apply(self, question_id: str, option_ids: Sequence[str], log_probs: np.ndarray) -> np.ndarray:
        """Recalibrated log-probabilities (the base head's, unchanged, for an unseen question)."""
        if question_id not in self.inverse_temperature:
            return log_probs
        bias = self.bias[question_id]
        shifted = self.inverse_temperature[question_id] * log_probs + np.array([bias.get(o, 0.0) for o in option_ids])
        return log_softmax(shifted)


def _fit_question(items: Sequence[CalibrationItem]) -> tuple[float, dict[str, float]]:
    options = sorted({option for item in items for option in item.option_ids})
    column = {option: number for number, option in enumerate(options)}
    groups: dict[tuple[str, ...], list[CalibrationItem]] = {}
    for item in items:
        groups.setdefault(item.option_ids, []).append(item)
    packed = [
        (
            np.stack([item.log_probs for item in members]),
            np.array([column[o] for o in option_ids]),
            np.eye(len(option_ids))[[item.target for item in members]],
        )
        for option_ids, members in groups.items()
    ]

    def objective(params: np.ndarray) -> tuple[float, np.ndarray]:
        scale, bias = params[0], params[1:]
        loss = 0.5 * BIAS_PENALTY * float(bias @ bias)
        gradient = np.concatenate([[0.0], BIAS_PENALTY * bias])
        for log_probs, columns, onehot in packed:
            log_p = log_softmax(scale * log_probs + bias[columns], axis=1)
            loss -= float((onehot * log_p).sum())
            residual = np.exp(log_p) - onehot
            gradient[0] += float((residual * log_probs).sum())
            np.add.at(gradient[1:], columns, residual.sum(axis=0))
        return loss, gradient

    start = np.concatenate([[1.0], np.zeros(len(options))])
    result = minimize(
        objective, start, jac=True, method="L-BFGS-B", bounds=[(1e-3, 1e3)] + [(None, None)] * len(options)
    )
    return float(result.x[0]), {option: float(result.x[1 + column[option]]) for option in options}


def fit_recalibration(items: Sequence[CalibrationItem]) -> Recalibration:
    """Per question id, the temperature and option biases that minimise the items' log loss."""
    by_question: dict[str, list[CalibrationItem]] = {}
    for item in items:
        by_question.setdefault(item.question_id, []).append(item)
    calibration = Recalibration()
    for question_id, members in sorted(by_question.items()):
        scale, bias = _fit_question(members)
        calibration.inverse_temperature[question_id] = scale
        calibration.bias[question_id] = bias
    return calibration


# ----------------------------------------------------------------------------- the rule


def paired_bootstrap(values: np.ndarray, resamples: int, seed: int) -> tuple[float, float]:
    """Percentile 95% interval of the mean of `values` (records resampled with replacement)."""
    rng = np.random.default_rng(seed)
    means = []
    for start in range(0, resamples, 256):
        rows = min(256, resamples - start)
        means.append(values[rng.integers(0, len(values), size=(rows, len(values)))].mean(axis=1))
    low, high = percentile_interval(np.concatenate(means))
    return low, high


@dataclass(frozen=True)
class GateVerdict:
    passed: bool
    overall: dict
    """{"mean", "ci95"} of the per-record differences."""
    by_question: dict[str, dict]
    """Per question: {"labels", "mean", "ci95", "significantly_worse", "few_labels"}."""

    @property
    def worse(self) -> list[str]:
        return [question for question, numbers in self.by_question.items() if numbers["significantly_worse"]]


def gate_verdict(per_record: np.ndarray, per_question: dict[str, np.ndarray], resamples: int, seed: int) -> GateVerdict:
    """Apply the rule to paired held-out log-loss differences (trained - baseline)."""
    low, high = paired_bootstrap(per_record, resamples, seed)
    by_question = {}
    for question_id, values in sorted(per_question.items()):
        q_low, q_high = paired_bootstrap(values, resamples, seed)
        by_question[question_id] = {
            "labels": len(values),
            "mean": float(values.mean()),
            "ci95": [q_low, q_high],
            "significantly_worse": bool(q_low > 0),
            "few_labels": len(values) < FEW_LABELS,
        }
    improved = bool(per_record.mean() < 0 and high < 0)
    passed = improved and not any(numbers["significantly_worse"] for numbers in by_question.values())
    return GateVerdict(passed, {"mean": float(per_record.mean()), "ci95": [low, high]}, by_question)
