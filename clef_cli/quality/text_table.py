"""A table of text cells and its renderings: a rich table for a terminal, and for pipes, files and
cron logs a plain aligned table, Markdown or TSV, where every value is printed whole (a rich
table cuts cells to fit 80 columns when stdout is not a terminal)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text


@dataclass
class TextTable:
    title: str
    headers: list[str]
    rows: list[list[str]]
    right: list[bool]
    """Right-align this column (numbers)."""
    notes: list[str] = field(default_factory=list)
    """Lines under the table: totals, what a marker means, why a value is missing."""


def fixed(value: float | None, digits: int = 3) -> str:
    """A number as a table shows it; a dash where it is undefined."""
    return "—" if value is None else f"{value:.{digits}f}"


def cell(value: Any) -> str:
    """A value at full precision for TSV (a float as its repr); empty for null."""
    return "" if value is None else repr(value) if isinstance(value, float) else str(value)


def rich_table(table: TextTable) -> Table:
    caption = "\n".join(table.notes) or None
    shown = Table(title=table.title, caption=caption, caption_justify="left")
    for header, right in zip(table.headers, table.right, strict=True):
        shown.add_column(header, justify="right" if right else "left", overflow="fold")
    for row in table.rows:
        shown.add_row(*(Text(cell) for cell in row))
    return shown


def plain(table: TextTable) -> str:
    """Title, header, a rule, the rows with columns two spaces apart, then the notes."""
    widths = [max(cell_len(cell) for cell in column) for column in zip(table.headers, *table.rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        padded = []
        for cell, width, right in zip(cells, widths, table.right, strict=True):
            pad = " " * (width - cell_len(cell))
            padded.append(pad + cell if right else cell + pad)
        return "  ".join(padded).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([table.title, line(table.headers), rule, *(line(row) for row in table.rows), *table.notes])


def markdown(table: TextTable) -> str:
    """A GitHub-flavoured Markdown table under a heading; characters Markdown would read as
    markup (`|`, `*`, `_`, a backtick, a backslash) are escaped."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(escape(cell) for cell in cells) + " |"

    rule = "|" + "|".join("---:" if right else "---" for right in table.right) + "|"
    body = [f"### {escape(table.title)}", "", line(table.headers), rule, *(line(row) for row in table.rows)]
    if table.notes:
        body += ["", *(escape(note) + "  " for note in table.notes[:-1]), escape(table.notes[-1])]
    return "\n".join(body) + "\n"


def escape(text: str) -> str:
    for char in "\\|*_`":
        text = text.replace(char, "\\" + char)
    return text


def tsv(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Tab-separated, one header line, cells never quoted (a `"` is data); a tab, newline or
    backslash inside a cell is escaped with a backslash."""

    def cell(text: str) -> str:
        return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")

    return "".join("\t".join(cell(text) for text in row) + "\n" for row in [list(headers), *rows])


def print_tables(console: Console, tables: Sequence[TextTable], form: str = "table") -> None:
    """`table`: rich on a terminal, plain elsewhere; `markdown`. (TSV has its own rows.)"""
    for number, table in enumerate(tables):
        if form == "table" and console.is_terminal:
            console.print(rich_table(table))
            continue
        text = markdown(table) if form == "markdown" else plain(table)
        write(console, ("\n" if number else "") + text + ("" if text.endswith("\n") else "\n"))


def write(console: Console, text: str) -> None:
    """Verbatim to the console's file: rich would expand tabs and read `[...]` as markup."""
    console.file.write(text)
    console.file.flush()
