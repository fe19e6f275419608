"""What `clef eval` prints: its tables as text cells, and the gold problems and warnings
(presentation only; `text_table` renders the cells: rich on a terminal, plain text in a pipe or a
file)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console

from clef_cli.quality.labels.gold import GoldProblem
from clef_cli.quality.labels.spreadsheet import safe_cell
from clef_cli.quality.metrics import FEW_RECORDS, few_records
from clef_cli.quality.text_table import TextTable, cell, fixed, print_tables, tsv, write
from clef_cli.sizes import plural

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
        console.print(
            f"warning: {plural(len(problems), 'gold problem')}; the labels concerned are skipped", markup=False
        )
        for problem in problems[:SHOWN_PROBLEMS]:
            console.print(f"  {problem.message}", markup=False)
        if len(problems) > SHOWN_PROBLEMS:
            console.print(f"  ... and {len(problems) - SHOWN_PROBLEMS:,} more", markup=False)
    for warning in warnings:
        console.print(f"warning: {warning}", markup=False)


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
                f"{fixed(found['accuracy'])} [{fixed(low)}, {fixed(high)}]",
                fixed(found["log_loss"]),
                fixed(found["brier"]),
                fixed(found["ece"]),
                fixed(found["threshold"]) + mark,
                fixed(found["coverage"]),
            ]
        )
        for name, reason in found.get("undefined", {}).items():
            notes.append(f"{qid}: {name} is undefined (null in --json): {reason}")
    exact = fixed(document["joint_exact_match"])
    caption = f"{plural(document['records'], 'record')} with gold · joint exact match {exact}"
    if few:
        notes.insert(
            0,
            f"{FEW_MARK} the threshold rests on fewer than {FEW_RECORDS} records (records at or above "
            f"it: {', '.join(few)})",
        )
    right = [False, False] + [True] * (len(EVAL_HEADERS) - 2)
    return TextTable(title, list(EVAL_HEADERS), rows, right, [caption, *notes])


def eval_tsv(document: Mapping[str, Any], by: str | None = None) -> str:
    """Every question's numbers at full precision, one per cell (empty for null); with `--by`, a
    first column holds the group's value as JSON text (empty on the overall rows). A question id
    comes from records, so a spreadsheet gets it as text (`safe_cell`)."""

    def rows(part: Mapping[str, Any]) -> list[list[str]]:
        found_rows = []
        for qid, found in part["questions"].items():
            numbers = [found["accuracy"], *found["accuracy_ci"], found["log_loss"], found["brier"], found["ece"]]
            rest = [found["threshold"], found["threshold_records"], found["coverage"]]
            found_rows.append([safe_cell(qid), found["type"], str(found["n"]), *map(cell, numbers), *map(cell, rest)])
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
