"""Rich tables and warning lines for `clef eval` and `clef calibrate` (presentation only)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from clef_cli.quality.calibrate import CalibrationRun
from clef_cli.quality.gold import GoldProblem

SHOWN_PROBLEMS = 20


def print_problems(console: Console, problems: Sequence[GoldProblem], warnings: Sequence[str] = ()) -> None:
    """Gold problems are warnings: counted, the first 20 listed, never a failure."""
    if problems:
        console.print(f"warning: {len(problems)} gold problem(s); the labels concerned are skipped", markup=False)
        for problem in problems[:SHOWN_PROBLEMS]:
            console.print(f"  {problem.message}", markup=False)
        if len(problems) > SHOWN_PROBLEMS:
            console.print(f"  ... and {len(problems) - SHOWN_PROBLEMS} more", markup=False)
    for warning in warnings:
        console.print(f"warning: {warning}", markup=False)


def _f(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def eval_table(document: Mapping[str, Any], title: str = "clef eval") -> Table:
    caption = f"{document['records']} records with gold · joint exact match {_f(document['joint_exact_match'])}"
    table = Table(title=title, caption=caption)
    longest = max((len(qid) for qid in document["questions"]), default=8)
    table.add_column("question", min_width=min(longest, 40), overflow="fold")
    for name in ("type", "n", "accuracy (95% CI)", "log loss", "Brier", "ECE", "threshold", "coverage"):
        table.add_column(name, justify="left" if name == "type" else "right")
    for qid, found in document["questions"].items():
        low, high = found["accuracy_ci"]
        table.add_row(
            qid,
            found["type"],
            str(found["n"]),
            f"{_f(found['accuracy'])} [{_f(low)}, {_f(high)}]",
            _f(found["log_loss"]),
            _f(found["brier"]),
            _f(found["ece"]),
            _f(found["threshold"]),
            _f(found["coverage"]),
        )
    return table


def calibrate_table(run: CalibrationRun) -> Table:
    """Cross-fitted metrics of each method tried, the chosen one marked."""
    table = Table(title="clef calibrate: cross-fitted (5 folds of records)")
    for name in ("method", "log loss", "Brier", "ECE", ""):
        table.add_column(name, justify="left" if name in ("method", "") else "right")
    for method, found in run.candidates.items():
        mark = "chosen" if method == run.calibration.method else ""
        label = "none (uncalibrated)" if method == "none" else method
        table.add_row(label, _f(found["log_loss"], 4), _f(found["brier"], 4), _f(found["ece"], 4), mark)
    return table


def temperatures_line(run: CalibrationRun) -> str:
    calibration = run.calibration
    if calibration.method == "none":
        return "temperatures: none (T = 1)"
    shown = {**calibration.type_temperatures, **calibration.temperatures}
    listed = ", ".join(f"{name} {value:.3f}" for name, value in shown.items())
    return f"temperatures: default {calibration.default:.3f}" + (f"; {listed}" if listed else "")
