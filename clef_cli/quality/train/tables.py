"""What `clef train-head` prints: the gate's held-out numbers as text cells."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clef_cli.quality.text_table import TextTable

GATE_MODELS = {"base": "base", "calibrated_base": "recalibrated", "trained": "trained"}


def gate_table(report: Mapping[str, Any]) -> TextTable:
    """train-head's held-out numbers: overall, then per question, with the probe beside them."""
    held = report["held_out"]
    rows = []
    for name, label in (("log_loss", "log loss"), ("brier", "Brier"), ("accuracy", "accuracy")):
        rows.append([label, *(f"{held[m][name]:.4f}" for m in GATE_MODELS), ""])
    for question, numbers in report["by_question"].items():
        probe = numbers.get("probe")
        for name, label in (("accuracy", "accuracy"), ("log_loss", "log loss")):
            cells = [f"{numbers[m][name]:.4f}" for m in GATE_MODELS]
            rows.append([f"  {question} {label}", *cells, f"{probe[name]:.4f}" if probe else "-"])
    headers = ["metric", *GATE_MODELS.values(), "probe"]
    return TextTable("held-out (k-fold cross-fitted)", headers, rows, [False] + [True] * 4)
