"""The held-out half of `training_report.json`: each model's metrics, the probe yardstick, and
the gate's verdict overall and per question."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from clef_cli.quality.train.cross_fit import CrossFit
from clef_cli.quality.train.fit import Example
from clef_cli.quality.train.gate import FEW_LABELS, gate_verdict
from clef_cli.quality.train.held_out import per_record_metrics, question_losses, question_table, summary

GATE_RULE = (
    "held-out log loss lower than the recalibrated base head's (per-question temperature and option biases "
    "fitted on the training folds): mean paired difference below zero with its bootstrap 95% interval below "
    "zero, and no question whose own interval lies above zero"
)


def _question_differences(examples: Sequence[Example], crossed: CrossFit) -> dict[str, np.ndarray]:
    trained = question_losses(examples, crossed.trained)
    calibrated = question_losses(examples, crossed.calibrated)
    return {qid: trained[qid]["log_loss"] - calibrated[qid]["log_loss"] for qid in trained}


def held_out_report(examples: Sequence[Example], crossed: CrossFit, resamples: int, seed: int) -> dict[str, Any]:
    """{"held_out": ..., "by_question": ..., "gate": ...} of the report (the gate's `passed` is
    the rule's verdict; the job adds `forced`)."""
    after = per_record_metrics(examples, crossed.trained)
    baseline = per_record_metrics(examples, crossed.calibrated)
    verdict = gate_verdict(
        after["log_loss"] - baseline["log_loss"], _question_differences(examples, crossed), resamples, seed
    )
    by_question = question_table(
        examples,
        {
            "base": crossed.base,
            "calibrated_base": crossed.calibrated,
            "trained": crossed.trained,
            "probe": crossed.probe,
        },
    )
    for question_id, gate in verdict.by_question.items():
        by_question[question_id]["gate"] = gate
        probe, trained = by_question[question_id].get("probe"), by_question[question_id]["trained"]
        if probe is not None and probe["accuracy"] > 0:
            by_question[question_id]["accuracy_vs_probe"] = trained["accuracy"] / probe["accuracy"]
    return {
        "held_out": {
            "base": summary(per_record_metrics(examples, crossed.base), resamples, seed),
            "calibrated_base": summary(baseline, resamples, seed),
            "trained": summary(after, resamples, seed),
            "log_loss_difference": verdict.overall,
        },
        "by_question": by_question,
        "gate": {
            "passed": verdict.passed,
            "rule": GATE_RULE,
            "significantly_worse": verdict.worse,
            "few_labels": [qid for qid, gate in verdict.by_question.items() if gate["labels"] < FEW_LABELS],
        },
    }
