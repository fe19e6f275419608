"""CSV that a spreadsheet opens as text, never as a formula, and reads back as it was written.

A record's id, an answer or a question id comes from strangers; a spreadsheet runs a cell that
starts with `=`, `+`, `-`, `@`, a tab or a carriage return as a formula (CSV injection). As OWASP
advises, such a text cell is written with one leading `'`, which a spreadsheet shows as text. A
cell that already starts with `'` before such a character gets one more, so the escape can be
undone exactly (`cell_text`) when the file comes back as gold. Numbers clef computes
(`record_index`, confidences, probabilities) are never a record's text and are written as numbers.
Every CSV clef writes goes through `csv_text`; every CSV it reads back through `cell_text`.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""The first characters that make a spreadsheet read a cell as a formula (OWASP's list)."""


def safe_cell(value: Any) -> Any:
    """A text cell as a spreadsheet must get it: one `'` before a formula start (after any `'`)."""
    if isinstance(value, str) and value.lstrip("'").startswith(FORMULA_STARTS):
        return "'" + value
    return value


def cell_text(cell: Any) -> Any:
    """A CSV cell as it was before `safe_cell` (a text cell; anything else as it is)."""
    if isinstance(cell, str) and cell.startswith("'") and cell.lstrip("'").startswith(FORMULA_STARTS):
        return cell[1:]
    return cell


def csv_text(columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> str:
    """A CSV table: a header row, then one row per mapping; every text cell, header included,
    through `safe_cell`. Rows end in CRLF (RFC 4180), so a cell holding a CR or an LF is quoted
    and never starts a row of its own (whose first cell could be a formula)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")  # RFC 4180; a cell holding \r or \n is quoted
    writer.writerow([safe_cell(column) for column in columns])
    for row in rows:
        writer.writerow([safe_cell(row.get(column)) for column in columns])  # None: an empty cell
    return buffer.getvalue()


def read_csv(handle: Iterable[str]) -> list[dict[str, Any]]:
    """The rows of a CSV file as mappings, every header and cell through `cell_text`; an empty
    cell is None."""
    rows = []
    for row in csv.DictReader(handle):
        rows.append({cell_text(key): (cell_text(value) if value != "" else None) for key, value in row.items()})
    return rows
