"""What `clef eval`, `clef calibrate`, `clef compare` and `clef train-head` print: their tables as
text cells, and the warning lines (presentation only; `text_table` renders the cells: rich on a
terminal, plain text in a pipe or a file)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console

from clef_cli.quality.calibrate import T_BOUNDS, CalibrationRun, named_temperatures
from clef_cli.quality.gold import GoldProblem
from clef_cli.quality.metrics import FEW_RECORDS, few_records
from clef_cli.quality.text_table import TextTable, print_tables, tsv, write

SHOWN_PROBLEMS = 20
FEW_MARK = "*"
EVAL_HEADERS = ["question", "type", "n", "accuracy (95% CI)", "log loss", "Brier", "ECE", "threshold", "coverage"]
TSV_HEADERS = [
    "question", "type", "n", "accuracy", "accuracy_ci_low", "accuracy_ci_high", "log_loss", "brier", "ece",
    "threshold", "threshold_records", "coverage",
]  # fmt: skip


def print_problems(console: Console, problems: Sequence[GoldProblem], warnings: Sequence[str] = ()) -> None:
    """Gold problems are warnings: counted, the first 20 listed (file-wide ones first), never a failure."""
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


def group_title(column: str, value: Any) -> str:
    """`source = "web"`, `source = null`: JSON spelling keeps a null and the string "null" apart."""
    return f"{column} = {json.dumps(value, ensure_ascii=False)}"


def eval_table(document: Mapping[str, Any], title: str = "clef eval") -> TextTable:
    rows, few, notes = [], [], []
    for qid, found in document["questions"].items():
        low, high = found["accuracy_ci"]
        mark = FEW_MARK if few_records(found) else ""
        if mark:
            few.append(f"{qid} {found['threshold_records']}")
        rows.append(
            [
                qid,
                found["type"],
                str(found["n"]),
                f"{_f(found['accuracy'])} [{_f(low)}, {_f(high)}]",
                _f(found["log_loss"]),
                _f(found["brier"]),
                _f(found["ece"]),
                _f(found["threshold"]) + mark,
                _f(found["coverage"]),
            ]
        )
        for name, reason in found.get("undefined", {}).items():
            notes.append(f"{qid}: {name} is undefined (null in --json): {reason}")
    caption = f"{document['records']} records with gold · joint exact match {_f(document['joint_exact_match'])}"
    if few:
        notes.insert(
            0,
            f"{FEW_MARK} the threshold rests on fewer than {FEW_RECORDS} records (records at or above "
            f"it: {', '.join(few)})",
        )
    right = [False, False] + [True] * (len(EVAL_HEADERS) - 2)
    return TextTable(title, list(EVAL_HEADERS), rows, right, [caption, *notes])


def _cell(value: Any) -> str:
    return "" if value is None else repr(value) if isinstance(value, float) else str(value)


def eval_tsv(document: Mapping[str, Any], by: str | None = None) -> str:
    """Every question's numbers at full precision, one per cell (empty for null); with `--by`, a
    first column holds the group's value as JSON text (empty on the overall rows)."""

    def rows(part: Mapping[str, Any]) -> list[list[str]]:
        found_rows = []
        for qid, found in part["questions"].items():
            numbers = [found["accuracy"], *found["accuracy_ci"], found["log_loss"], found["brier"], found["ece"]]
            rest = [found["threshold"], found["threshold_records"], found["coverage"]]
            found_rows.append([qid, found["type"], str(found["n"]), *map(_cell, numbers), *map(_cell, rest)])
        return found_rows

    if by is None:
        return tsv(TSV_HEADERS, rows(document))
    lines = [["", *row] for row in rows(document)]
    for group in document["by"]["groups"]:
        value = json.dumps(group["value"], ensure_ascii=False)
        lines += [[value, *row] for row in rows(group)]
    return tsv([by, *TSV_HEADERS], lines)


def print_eval(console: Console, document: Mapping[str, Any], form: str = "table", by: str | None = None) -> None:
    """The overall table, then one per `--by` group (`form`: table, markdown, or tsv as one table)."""
    if form == "tsv":
        write(console, eval_tsv(document, by))
        return
    tables = [eval_table(document)]
    for group in document.get("by", {}).get("groups", []):
        tables.append(eval_table(group, title=group_title(document["by"]["column"], group["value"])))
    print_tables(console, tables, form)


CALIBRATE_HEADERS = ["method", "log loss", "Brier", "ECE", "chosen"]


def calibrate_table(run: CalibrationRun, notes: Sequence[str] = ()) -> TextTable:
    """Cross-fitted metrics of each method tried, the chosen one marked; `notes` under it."""
    rows = []
    for method, found in run.candidates.items():
        mark = "chosen" if method == run.calibration.method else ""
        label = "none (uncalibrated)" if method == "none" else method
        rows.append([label, _f(found["log_loss"], 4), _f(found["brier"], 4), _f(found["ece"], 4), mark])
    title = f"clef calibrate: cross-fitted ({run.folds} folds of records)"
    return TextTable(title, list(CALIBRATE_HEADERS), rows, [False, True, True, True, False], list(notes))


def calibrate_tsv(run: CalibrationRun) -> str:
    """The calibrate table at full precision, one value per cell (`chosen`: true or false)."""
    rows = [
        [method, *(_cell(found[name]) for name in ("log_loss", "brier", "ece")),
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
    return [
        f"temperature {name} = {values[name]:.4g} is the edge of the search range [{T_BOUNDS[0]:g}, {T_BOUNDS[1]:g}]"
        f"{f' ({n} labels)' if n is not None else ''}: the labels do not pin it down (too few, or answers wrong "
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


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def compare_tables(document: Mapping[str, Any]) -> list[TextTable]:
    """Per question n, flips, PSI, JS and mean confidence; then the answer shares of both runs."""
    title = (
        f"{document['shared_records']} records in both runs (joined on {document['join']}); "
        f"{document['only_old_records']} only in old, {document['only_new_records']} only in new"
    )
    rows = []
    for qid, found in document["questions"].items():
        confidence = f"{_share(found['old']['mean_confidence'])} → {_share(found['new']['mean_confidence'])}"
        psi, js = (_f(found[name], 4) for name in ("psi", "js"))
        flipped = f"{found['flipped']} ({_share(found['flipped_share'])})"
        rows.append([qid, str(found["n"]), flipped, psi, js, confidence])
    headers = ["question", "n", "flipped", "PSI", "JS", "mean conf. old → new"]
    summary = TextTable(title, headers, rows, [False] + [True] * 5)
    shares = []
    for qid, found in document["questions"].items():
        for option, count in found["old"]["counts"].items():
            new_count = found["new"]["counts"][option]
            shares.append([qid, option, f"{count} ({_share(found['old']['shares'][option])})",
                           f"{new_count} ({_share(found['new']['shares'][option])})"])  # fmt: skip
    title = "answer shares, old → new (shared records)"
    return [summary, TextTable(title, ["question", "answer", "old", "new"], shares, [False, False, True, True])]


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
