"""train-head's gate rule on synthetic paired differences, the recalibrated baseline it gates
against, and the probe against scikit-learn (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import log_softmax

from clef_cli.quality.train.gate import CalibrationItem, fit_recalibration, gate_verdict
from clef_cli.quality.train.probe import fit_probe, pooled_features


def differences(mean: float, count: int, seed: int, spread: float = 0.3) -> np.ndarray:
    return np.random.default_rng(seed).normal(mean, spread, size=count)


@pytest.mark.parametrize("seed", range(5))
def test_gate_passes_a_clear_gain_and_refuses_noise(seed):
    gain = differences(-0.2, 300, seed)
    verdict = gate_verdict(gain, {"q": gain}, 2000, seed)
    assert verdict.passed and verdict.overall["ci95"][1] < 0 and verdict.worse == []
    noise = differences(0.0, 300, seed) - differences(0.0, 300, seed).mean() + 0.0  # mean exactly 0
    verdict = gate_verdict(noise, {"q": noise}, 2000, seed)
    assert not verdict.passed and verdict.overall["ci95"][0] < 0 < verdict.overall["ci95"][1]


def test_a_mean_below_zero_is_not_enough_without_the_interval():
    values = differences(-0.01, 40, 0, spread=1.0)
    values = values - values.mean() - 0.01  # mean -0.01, interval wide across zero
    verdict = gate_verdict(values, {"q": values}, 2000, 0)
    assert verdict.overall["mean"] < 0 and verdict.overall["ci95"][1] > 0 and not verdict.passed


def test_an_interval_that_ends_exactly_at_zero_does_not_pass():
    """19 records unchanged and one better: the mean is below zero, and a third of the bootstrap
    resamples draw no better record at all, so the interval's upper end is exactly 0. The rule
    asks for an interval below zero: `high <= 0` would pass this."""
    values = np.zeros(20)
    values[7] = -0.5
    verdict = gate_verdict(values, {"q": values}, 2000, 0)
    assert verdict.overall["mean"] < 0 and verdict.overall["ci95"][1] == 0.0
    assert not verdict.passed and verdict.worse == []


def test_the_held_out_table_is_plain_text_off_a_terminal(monkeypatch):
    """train-head's table on stderr in a pipe or a file: eval's plain aligned text, no boxes."""
    import io

    from rich.console import Console

    from clef_cli.cli import quality

    captured = io.StringIO()
    monkeypatch.setattr(quality, "stderr", Console(file=captured, width=40, soft_wrap=True))
    numbers = {"log_loss": 0.6931, "brier": 0.5, "accuracy": 0.5}
    gate = {"labels": 30, "mean": -0.1, "ci95": [-0.2, -0.01], "significantly_worse": False, "few_labels": True}
    question = {"base": numbers, "calibrated_base": numbers, "trained": numbers, "probe": numbers, "gate": gate}
    report = {
        "held_out": {"base": numbers, "calibrated_base": numbers, "trained": numbers,
                     "log_loss_difference": {"mean": -0.1, "ci95": [-0.2, -0.01]}},
        "by_question": {"a_rather_long_question_id": question}, "gate": {"passed": True, "forced": False},
        "gold": {"records": 30},
    }  # fmt: skip
    quality.print_gate(report)
    lines = captured.getvalue().splitlines()
    assert lines[0] == "held-out (k-fold cross-fitted)"
    assert lines[1].split() == ["metric", "base", "recalibrated", "trained", "probe"]
    assert set(lines[2]) == {"-", " "} and not set("─━│┃") & set(captured.getvalue())
    assert lines[6].split() == ["a_rather_long_question_id", "accuracy", "0.5000", "0.5000", "0.5000", "0.5000"]


def test_one_significantly_worse_question_refuses_an_overall_gain():
    """Records with two questions: `a` gains a lot, `b` loses a little but surely; per record the
    mean is a gain, yet `b` is named and the gate refuses."""
    a, b = differences(-0.6, 200, 1, spread=0.1), differences(0.1, 200, 2, spread=0.05)
    per_record = (a + b) / 2
    verdict = gate_verdict(per_record, {"a": a, "b": b}, 2000, 0)
    assert verdict.overall["ci95"][1] < 0
    assert verdict.worse == ["b"] and not verdict.passed
    assert verdict.by_question["b"]["ci95"][0] > 0 and verdict.by_question["a"]["ci95"][1] < 0
    fine = gate_verdict(per_record, {"a": a, "b": b - b.mean()}, 2000, 0)
    assert fine.passed and fine.worse == []


def test_few_labels_are_flagged():
    verdict = gate_verdict(differences(-0.5, 49, 0), {"q": differences(-0.5, 49, 0)}, 500, 0)
    assert verdict.by_question["q"]["few_labels"] and verdict.by_question["q"]["labels"] == 49
    assert not gate_verdict(differences(-0.5, 50, 0), {"q": differences(-0.5, 50, 0)}, 500, 0).by_question["q"][
        "few_labels"
    ]


def test_recalibration_learns_label_frequencies_from_a_uniform_head():
    """A uniform base head on labels 60/30/10: the best baseline is the label frequencies."""
    targets = [0] * 60 + [1] * 30 + [2] * 10
    options = ("x", "y", "z")
    items = [CalibrationItem("q", options, np.log(np.full(3, 1 / 3)), t) for t in targets]
    calibration = fit_recalibration(items)
    probs = np.exp(calibration.apply("q", options, np.log(np.full(3, 1 / 3))))
    assert probs == pytest.approx([0.6, 0.3, 0.1], abs=0.01)
    untouched = np.log([0.2, 0.8])
    assert calibration.apply("other", ("a", "b"), untouched) is untouched


def test_recalibration_recovers_a_known_temperature_and_bias():
    """Labels drawn from softmax(l / 2 + b): the fit recovers 1/T = 0.5 and b up to a constant."""
    rng = np.random.default_rng(0)
    bias = np.array([0.5, 0.0, -0.5])
    log_p = log_softmax(rng.normal(0, 3, size=(8000, 3)), axis=1)
    truth = np.exp(log_softmax(log_p / 2 + bias, axis=1))
    targets = (rng.random(8000)[:, None] > truth.cumsum(axis=1)).sum(axis=1)
    items = [CalibrationItem("q", ("a", "b", "c"), row, int(t)) for row, t in zip(log_p, targets, strict=True)]
    calibration = fit_recalibration(items)
    assert calibration.inverse_temperature["q"] == pytest.approx(0.5, abs=0.05)
    fitted = np.array([calibration.bias["q"][o] for o in "abc"])
    assert fitted - fitted.mean() == pytest.approx(bias - bias.mean(), abs=0.1)


def test_probe_matches_scikit_learn():
    import torch
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(3)
    states = [torch.from_numpy(rng.normal(size=(int(rng.integers(5, 30)), 8))) for _ in range(120)]
    features = pooled_features(states)
    oracle_features = np.stack([np.concatenate([s.numpy().mean(0), s.numpy()[-1], s.numpy().max(0)]) for s in states])
    assert np.allclose(features, oracle_features)
    targets = (features[:, 0] + features[:, 9] + rng.normal(0, 0.2, size=120) > 0).astype(int)
    targets[features[:, 17] > 1.5] = 2
    probe = fit_probe(features[:80], targets[:80], 3)
    scaler = StandardScaler().fit(features[:80])
    oracle = LogisticRegression(C=1.0, tol=1e-10, max_iter=10000).fit(scaler.transform(features[:80]), targets[:80])
    ours = np.exp(probe.log_probabilities(features[80:]))
    assert ours == pytest.approx(oracle.predict_proba(scaler.transform(features[80:])), abs=1e-4)
