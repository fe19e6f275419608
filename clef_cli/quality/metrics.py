"""Per-question metrics over gold labels, in numpy; the definitions are docs/quality.md's, word for word.

Every function takes `probabilities` (n, K) in head order and `gold` (n,) option indices. The
predicted option is the argmax, first in head order on ties (numpy's argmax).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from clef_cli.quality.labels.scored import QuestionData

LOG_LOSS_FLOOR = 1e-15
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
FEW_RECORDS = 30
"""A threshold whose accepted records number fewer than this is marked as resting on few records."""


def predicted(probabilities: np.ndarray) -> np.ndarray:
    return np.argmax(probabilities, axis=1)


def confidence(probabilities: np.ndarray) -> np.ndarray:
    return probabilities.max(axis=1)


def accuracy(probabilities: np.ndarray, gold: np.ndarray) -> float:
    return float(np.mean(predicted(probabilities) == gold))


def macro_f1(probabilities: np.ndarray, gold: np.ndarray) -> float:
    """Mean F1 over the options that occur in gold or as a prediction."""
    guess = predicted(probabilities)
    scores = []
    for option in np.union1d(gold, guess):
        tp = np.sum((guess == option) & (gold == option))
        fp = np.sum((guess == option) & (gold != option))
        fn = np.sum((guess != option) & (gold == option))
        scores.append(2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores))


def log_loss(probabilities: np.ndarray, gold: np.ndarray) -> float:
    p = np.clip(probabilities[np.arange(len(gold)), gold], LOG_LOSS_FLOOR, 1.0)
    return float(np.mean(-np.log(p)))


def brier(probabilities: np.ndarray, gold: np.ndarray) -> float:
    onehot = np.eye(probabilities.shape[1])[gold]
    return float(np.mean(np.sum((probabilities - onehot) ** 2, axis=1)))


@dataclass(frozen=True)
class Reliability:
    counts: np.ndarray
    accuracy: np.ndarray
    """Per bin; NaN for an empty bin."""
    confidence: np.ndarray


def bin_index(conf: np.ndarray, bins: int) -> np.ndarray:
    return np.minimum(np.floor(conf * bins).astype(np.int64), bins - 1)


def reliability(probabilities: np.ndarray, gold: np.ndarray, bins: int) -> Reliability:
    conf = confidence(probabilities)
    index = bin_index(conf, bins)
    counts = np.bincount(index, minlength=bins)
    correct = np.bincount(index, weights=(predicted(probabilities) == gold).astype(float), minlength=bins)
    summed = np.bincount(index, weights=conf, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return Reliability(counts, correct / counts, summed / counts)


def ece(probabilities: np.ndarray, gold: np.ndarray, bins: int) -> float:
    """Top-label: sum over bins of (n_b / n) * |accuracy_b - mean confidence_b|."""
    table = reliability(probabilities, gold, bins)
    used = table.counts > 0
    gaps = np.abs(table.accuracy[used] - table.confidence[used])
    return float(np.sum(table.counts[used] / len(gold) * gaps))


def rps(probabilities: np.ndarray, gold: np.ndarray) -> float | None:
    """Ranked probability score: (1/(K-1)) sum over the first K-1 levels of (CDF_p - CDF_gold)^2;
    None (undefined) for a question with one level, where K - 1 = 0."""
    levels = probabilities.shape[1]
    if levels < 2:
        return None
    cdf = np.cumsum(probabilities, axis=1)[:, :-1]
    gold_cdf = (np.arange(levels - 1)[None, :] >= gold[:, None]).astype(float)
    return float(np.mean(np.sum((cdf - gold_cdf) ** 2, axis=1) / (levels - 1)))


def expected_level(probabilities: np.ndarray) -> np.ndarray:
    return probabilities @ np.arange(probabilities.shape[1], dtype=np.float64)


def mae(probabilities: np.ndarray, gold: np.ndarray) -> float:
    return float(np.mean(np.abs(expected_level(probabilities) - gold)))


def within_one(probabilities: np.ndarray, gold: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted(probabilities) - gold) <= 1))


def confusion(probabilities: np.ndarray, gold: np.ndarray, labels: tuple[str, ...]) -> dict[str, Any]:
    """Rows are gold options, columns predicted options, both in head order."""
    size = len(labels)
    flat = np.bincount(gold * size + predicted(probabilities), minlength=size * size)
    return {"labels": list(labels), "matrix": flat.reshape(size, size).tolist()}


def coverage_curve(probabilities: np.ndarray, gold: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each distinct confidence c (descending): c, the share with confidence >= c, and their accuracy."""
    conf = confidence(probabilities)
    correct = predicted(probabilities) == gold
    order = np.argsort(-conf, kind="stable")
    conf, correct = conf[order], correct[order]
    last = np.r_[conf[1:] != conf[:-1], True]  # the last record of each run of equal confidence
    kept = np.cumsum(np.ones_like(conf))[last]
    right = np.cumsum(correct)[last]
    return conf[last], kept / len(conf), right / kept


def threshold(probabilities: np.ndarray, gold: np.ndarray, target: float) -> dict[str, float] | None:
    """The smallest confidence c whose records (confidence >= c) reach `target` accuracy, their
    share (`coverage`) and their number (`records`, what the accuracy estimate rests on)."""
    cuts, coverage, acc = coverage_curve(probabilities, gold)
    reached = np.flatnonzero(acc >= target)
    if not len(reached):
        return None
    best = reached[-1]  # cuts descend, so the last one reached is the smallest c
    records = int(np.sum(confidence(probabilities) >= cuts[best]))
    return {"confidence": float(cuts[best]), "coverage": float(coverage[best]), "records": records}


def few_records(found: Mapping[str, Any]) -> bool:
    """A question's threshold (from `question_metrics`) rests on fewer than FEW_RECORDS records."""
    return found.get("threshold_records") is not None and found["threshold_records"] < FEW_RECORDS


def bootstrap_ci(probabilities: np.ndarray, gold: np.ndarray, bins: int) -> tuple[list[float], list[float]]:
    """95% percentile intervals of accuracy and ECE over resamples of records (seeded)."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    n = len(gold)
    conf = confidence(probabilities)
    correct = (predicted(probabilities) == gold).astype(float)
    index = bin_index(conf, bins)
    accuracies = np.empty(BOOTSTRAP_RESAMPLES)
    eces = np.empty(BOOTSTRAP_RESAMPLES)
    for draw in range(BOOTSTRAP_RESAMPLES):
        pick = rng.integers(0, n, n)
        accuracies[draw] = correct[pick].mean()
        gap = np.bincount(index[pick], weights=correct[pick] - conf[pick], minlength=bins)
        eces[draw] = np.sum(np.abs(gap)) / n  # |sum(correct - conf)| per bin = n_b |acc_b - conf_b|
    return percentile_interval(accuracies), percentile_interval(eces)


def percentile_interval(values: np.ndarray) -> list[float]:
    """The 95% percentile interval of bootstrap values."""
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))]


def question_metrics(data: QuestionData, bins: int, target: float) -> dict[str, Any]:
    p, y = data.probabilities, data.gold
    accuracy_ci, ece_ci = bootstrap_ci(p, y, bins)
    found = threshold(p, y, target)
    result: dict[str, Any] = {
        "type": data.type,
        "n": data.n,
        "accuracy": accuracy(p, y),
        "accuracy_ci": accuracy_ci,
        "macro_f1": macro_f1(p, y),
        "log_loss": log_loss(p, y),
        "brier": brier(p, y),
        "ece": ece(p, y, bins),
        "ece_ci": ece_ci,
    }
    if data.type == "score":
        result.update(rps=rps(p, y), mae=mae(p, y), within_one=within_one(p, y))
    result["confusion"] = confusion(p, y, data.option_ids)
    result["threshold"] = found["confidence"] if found else None
    result["coverage"] = found["coverage"] if found else None
    result["threshold_records"] = found["records"] if found else None
    undefined = undefined_reasons(result, levels=len(data.option_ids))
    if undefined:
        result["undefined"] = undefined
    return result


def undefined_reasons(result: dict[str, Any], levels: int) -> dict[str, str]:
    """Why each null metric is null, for the table and the JSON; a non-finite number (from a
    scored file holding one) becomes null too, so the JSON stays strict."""
    reasons: dict[str, str] = {}
    if result.get("type") == "score" and levels < 2:
        reasons["rps"] = "a score question with one level: RPS divides by K - 1 = 0"
    for name, value in result.items():
        if isinstance(value, float) and not np.isfinite(value):
            result[name] = None
            reasons[name] = "not a finite number (the scored file holds non-finite probabilities)"
    return reasons


def evaluate(questions: Mapping[str, QuestionData], bins: int = 15, target: float = 0.95) -> dict[str, Any]:
    """`records` (with any gold), `joint_exact_match` and every question's metrics."""
    right: dict[str, bool] = {}
    for data in questions.values():
        correct = predicted(data.probabilities) == data.gold
        for record_id, ok in zip(data.record_ids, correct, strict=True):
            right[record_id] = right.get(record_id, True) and bool(ok)
    return {
        "records": len(right),
        "joint_exact_match": float(np.mean(list(right.values()))) if right else None,
        "questions": {qid: question_metrics(data, bins, target) for qid, data in questions.items()},
    }
