"""What `clef calibrate` prints: its table as text cells, and the lines and warnings under it."""

from __future__ import annotations

from collections.abc import Sequence

from clef_cli.quality.calibrate.temperature import T_BOUNDS, CalibrationRun, named_temperatures
from clef_cli.quality.text_table import TextTable, cell, fixed, tsv
from clef_cli.sizes import plural

CALIBRATE_HEADERS = ["method", "log loss", "Brier", "ECE", "chosen"]


def calibrate_table(run: CalibrationRun, notes: Sequence[str] = ()) -> TextTable:
    """Cross-fitted metrics of each method tried, the chosen one marked; `notes` under it."""
    rows = []
    for method, found in run.candidates.items():
        mark = "chosen" if method == run.calibration.method else ""
        label = "none (uncalibrated)" if method == "none" else method
        rows.append([label, fixed(found["log_loss"], 4), fixed(found["brier"], 4), fixed(found["ece"], 4), mark])
    title = f"clef calibrate: cross-fitted ({plural(run.folds, 'fold')} of records)"
    return TextTable(title, list(CALIBRATE_HEADERS), rows, [False, True, True, True, False], list(notes))


def calibrate_tsv(run: CalibrationRun) -> str:
    """The calibrate table at full precision, one value per cell (`chosen`: true or false)."""
    rows = [
        [method, *(cell(found[name]) for name in ("log_loss", "brier", "ece")),
         "true" if method == run.calibration.method else "false"]
        for method, found in run.candidates.items()
    ]  # fmt: skip
    return tsv(["method", "log_loss", "brier", "ece", "chosen"], rows)


def calibrate_lines(run: CalibrationRun, method: str) -> list[str]:
    """The lines under calibrate's table: whether it helped, and the temperatures."""
    lines = [] if run.improved else [f"{method}: calibration does not improve the cross-fitted log loss"]
    return [*lines, temperatures_line(run)]


def bound_warnings(run: CalibrationRun) -> list[str]:
    """One warning per temperature the search left on an edge of its range."""
    calibration = run.calibration
    values = named_temperatures(calibration)
    n = calibration.fitted_on.get("n")
    labels = f" ({plural(n, 'label')})" if n is not None else ""
    return [
        f"temperature {name} = {values[name]:.4g} is the edge of the search range [{T_BOUNDS[0]:g}, {T_BOUNDS[1]:g}]"
        f"{labels}: the labels do not pin it down (too few, or answers wrong "
        "with full confidence); look at them before applying it (`at_search_bound` in the file)"
        for name in calibration.at_search_bound
    ]


def temperatures_line(run: CalibrationRun) -> str:
    calibration = run.calibration
    if calibration.method == "none":
        return "temperatures: none (T = 1)"
    shown = {**calibration.type_temperatures, **calibration.temperatures}
    listed = ", ".join(f"{name} {value:.3f}" for name, value in shown.items())
    return f"temperatures: default {calibration.default:.3f}" + (f"; {listed}" if listed else "")
