"""Every `clef eval` metric against an independent oracle: scikit-learn or a direct loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, brier_score_loss, confusion_matrix, f1_score
from sklearn.metrics import log_loss as sk_log_loss

from clef_cli.quality import metrics
from clef_cli.quality.labels.scored import QuestionData

TOL = 1e-12


def edge_case() -> tuple[np.ndarray, np.ndarray]:
    """Probabilities of exactly 0, 0.5 and 1, ties (argmax must take the first), a class (3) never in gold."""
    p = np.array(
        [
            [1.0, 0.0, 0.0, 0.0],
            [0.0, 1.0, 0.0, 0.0],  # confident and wrong: gold 0 has p = 0
            [0.5, 0.5, 0.0, 0.0],  # tie: predicts 0
            [0.25, 0.25, 0.25, 0.25],  # four-way tie
            [0.0, 0.5, 0.0, 0.5],  # tie between 1 and 3: predicts 1
            [0.1, 0.2, 0.3, 0.4],  # predicts 3, which is never gold
            [0.2, 0.2, 0.6, 0.0],
            [0.3, 0.3, 0.2, 0.2],
        ]
    )
    gold = np.array([0, 0, 1, 2, 1, 2, 2, 1])
    return p, gold


def random_case(seed: int, n: int = 400, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, k)) * 2
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return p, rng.integers(0, k, n)


CASES = [edge_case(), random_case(1), random_case(2, n=50, k=2), random_case(3, n=7, k=3)]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_metrics_equal_scikit_learn(case):
    p, gold = CASES[case]
    k = p.shape[1]
    predicted = np.argmax(p, axis=1)
    assert abs(metrics.accuracy(p, gold) - accuracy_score(gold, predicted)) < TOL
    assert abs(metrics.macro_f1(p, gold) - f1_score(gold, predicted, average="macro")) < TOL
    # sklearn clips to [eps, 1 - eps]; docs/quality.md's definition clips to [1e-15, 1], so the oracle is
    # given probabilities already clipped that way (its own clip then changes them by < 3e-16).
    clipped = np.clip(p, 1e-15, 1.0)
    assert abs(metrics.log_loss(p, gold) - sk_log_loss(gold, clipped, labels=list(range(k)))) < TOL
    if k == 2:  # sklearn's binary Brier uses one option; docs/quality.md's sums both, so twice as large
        assert abs(metrics.brier(p, gold) - 2 * brier_score_loss(gold, p[:, 1], pos_label=1)) < TOL
    else:
        assert abs(metrics.brier(p, gold) - brier_score_loss(gold, p, labels=list(range(k)))) < TOL
    labels = [f"o{i}" for i in range(k)]
    found = metrics.confusion(p, gold, tuple(labels))
    assert found["labels"] == labels
    assert found["matrix"] == confusion_matrix(gold, predicted, labels=list(range(k))).tolist()


def test_edge_case_predictions_break_ties_in_head_order():
    p, _ = edge_case()
    assert metrics.predicted(p).tolist() == [0, 1, 0, 0, 1, 3, 2, 0]


def ece_loop(p: np.ndarray, gold: np.ndarray, bins: int) -> float:
    total = 0.0
    members: dict[int, list[int]] = {}
    for i in range(len(gold)):
        c = max(p[i])
        members.setdefault(min(math.floor(c * bins), bins - 1), []).append(i)
    for rows in members.values():
        acc = sum(int(np.argmax(p[i]) == gold[i]) for i in rows) / len(rows)
        conf = sum(max(p[i]) for i in rows) / len(rows)
        total += len(rows) / len(gold) * abs(acc - conf)
    return total


@pytest.mark.parametrize("bins", [1, 2, 10, 15])
def test_ece_equals_a_direct_loop(bins):
    for p, gold in CASES:
        assert abs(metrics.ece(p, gold, bins) - ece_loop(p, gold, bins)) < TOL


def test_ece_bin_edges_and_confidence_one():
    # Confidences exactly on bin edges (0.5, 0.6 with 10 bins) and exactly 1.0 (last bin, not bin 10).
    p = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.6, 0.4], [0.4, 0.6], [0.7, 0.3]])
    gold = np.array([0, 0, 1, 0, 1, 1])
    assert metrics.bin_index(metrics.confidence(p), 10).tolist() == [9, 9, 5, 6, 6, 7]
    assert abs(metrics.ece(p, gold, 10) - ece_loop(p, gold, 10)) < TOL
    # bin 9: conf 1, acc 1/2; bin 5: conf .5 acc 0; bin 6: conf .6 acc 1; bin 7: conf .7 acc 0
    expected = (2 * 0.5 + 1 * 0.5 + 2 * 0.4 + 1 * 0.7) / 6
    assert abs(metrics.ece(p, gold, 10) - expected) < TOL


def test_score_metrics_equal_direct_loops():
    p, gold = random_case(4, n=60, k=4)
    k = 4
    rps = mae = within = 0.0
    for row, g in zip(p, gold, strict=True):
        rps += sum((sum(row[: j + 1]) - (1.0 if g <= j else 0.0)) ** 2 for j in range(k - 1)) / (k - 1)
        mae += abs(sum(level * row[level] for level in range(k)) - g)
        within += abs(int(np.argmax(row)) - g) <= 1
    assert abs(metrics.rps(p, gold) - rps / len(gold)) < TOL
    assert abs(metrics.mae(p, gold) - mae / len(gold)) < TOL
    assert abs(metrics.within_one(p, gold) - within / len(gold)) < TOL


def threshold_loop(p: np.ndarray, gold: np.ndarray, target: float):
    conf = p.max(axis=1)
    for c in sorted(set(conf.tolist())):
        keep = conf >= c
        if np.mean(np.argmax(p[keep], axis=1) == gold[keep]) >= target:
            return c, keep.mean(), int(keep.sum())
    return None


@pytest.mark.parametrize("target", [0.0, 0.3, 0.5, 0.6, 0.9, 1.0])
def test_threshold_is_the_smallest_confidence_reaching_the_target(target):
    for p, gold in CASES:
        found = metrics.threshold(p, gold, target)
        expected = threshold_loop(p, gold, target)
        if expected is None:
            assert found is None
        else:
            assert found == {"confidence": expected[0], "coverage": expected[1], "records": expected[2]}


def test_bootstrap_is_seeded_and_brackets_the_estimate():
    p, gold = random_case(5, n=300)
    first = metrics.bootstrap_ci(p, gold, 15)
    assert first == metrics.bootstrap_ci(p, gold, 15)
    (low, high), (elow, ehigh) = first
    assert low < metrics.accuracy(p, gold) < high
    assert elow < metrics.ece(p, gold, 15) < ehigh
    # the same resamples, by a direct loop
    rng = np.random.default_rng(metrics.BOOTSTRAP_SEED)
    accs, eces = [], []
    for _ in range(metrics.BOOTSTRAP_RESAMPLES):
        pick = rng.integers(0, len(gold), len(gold))
        accs.append(metrics.accuracy(p[pick], gold[pick]))
        eces.append(ece_loop(p[pick], gold[pick], 15))
    assert abs(np.percentile(accs, 2.5) - low) < TOL and abs(np.percentile(accs, 97.5) - high) < TOL
    assert abs(np.percentile(eces, 2.5) - elow) < 1e-9 and abs(np.percentile(eces, 97.5) - ehigh) < 1e-9


def data(qid, qtype, ids, p, gold):
    return QuestionData(qid, qtype, tuple(str(i) for i in range(p.shape[1])), ids, p, np.log(p + 1e-300), gold)


def test_evaluate_overall_and_names():
    p1 = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    p2 = np.array([[0.1, 0.7, 0.2, 0.0], [0.5, 0.5, 0.0, 0.0]])
    questions = {
        "a": data("a", "noul", ["r1", "r2", "r3"], p1, np.array([0, 1, 1])),
        "b": data("b", "score", ["r2", "r4"], p2, np.array([1, 0])),
    }
    document = metrics.evaluate(questions, bins=15, target=0.95)
    assert document["records"] == 4
    assert document["joint_exact_match"] == 0.75  # r3 wrong on a; r2 right on both; r1, r4 right
    assert list(document["questions"]["a"]) == [
        "type", "n", "accuracy", "accuracy_ci", "macro_f1", "log_loss", "brier", "ece", "ece_ci",
        "confusion", "threshold", "coverage", "threshold_records",
    ]  # fmt: skip
    assert {"rps", "mae", "within_one"} <= set(document["questions"]["b"])
    assert document["questions"]["a"]["threshold"] == 0.8 and document["questions"]["a"]["coverage"] == 2 / 3


def test_a_one_level_score_question_has_a_null_rps_with_its_reason():
    """RPS divides by K - 1: undefined for one level. It is null with a reason, never NaN, so
    the document is strict JSON; the other metrics of that question stay defined."""
    import json

    p = np.ones((4, 1))
    document = metrics.evaluate({"s": data("s", "score", ["r1", "r2", "r3", "r4"], p, np.zeros(4, dtype=int))})
    found = document["questions"]["s"]
    assert found["rps"] is None
    assert "one level" in found["undefined"]["rps"]
    assert found["accuracy"] == 1.0 and found["log_loss"] == 0.0 and found["brier"] == 0.0 and found["mae"] == 0.0
    json.dumps(document, allow_nan=False)  # raises on NaN
    two = metrics.evaluate({"s": data("s", "score", ["r1"], np.array([[0.3, 0.7]]), np.array([1]))})
    assert "undefined" not in two["questions"]["s"] and two["questions"]["s"]["rps"] == pytest.approx(0.09)
