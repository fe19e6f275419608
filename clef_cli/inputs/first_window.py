"""Mistakes of the whole job, caught once from its first records, before anything is written.

A record's problem is that record's error and the job goes on. Some mistakes are the job's, not
a record's: no record at all (an export that failed upstream would replace the last output with
0 rows; `--allow-empty` says the job means it), no record has questions and no `--questions`
was given, a table (Parquet, CSV) has no `state` column or a column that only looks like a
record field (`image`), a struct column whose nulls refuse every record. Each would fail every
record with the same message, after the job made its output and its store. So the job reads its
first window of records (as planning's first window, so a job of millions starts at once) and
refuses with one line (exit 2) before it opens the store. What shows only later, or only in some
records, stays each record's error.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from clef_cli.errors import RecordError, UsageError
from clef_cli.inputs.columns import ColumnMapping
from clef_cli.inputs.fields import near_miss
from clef_cli.inputs.formats import Cells
from clef_cli.inputs.parquet_rows import RECORD_COLUMNS, AmbiguousNulls, StructNulls
from clef_cli.inputs.readers import parquet_schema, raw_rows
from clef_cli.inputs.records import own_questions
from clef_cli.inputs.sources import InputFile, InputLike, expand_inputs, given_name

NO_RECORDS = "no records in"
EMPTY_WAY_OUT = (
    "nothing was written; a job that means to write an empty output (0 rows, replacing the last one) "
    "passes --allow-empty"
)
FIRST_WINDOW = 64
"""Records in the first window: the records the job checks before it starts, and the records
planning encodes before the model starts (engines/local/planning.py)."""


def check_first_window(
    inputs: Sequence[InputLike],
    questions_given: bool,
    claimed: Collection[str] = (),
    struct_nulls: StructNulls = StructNulls.refuse,
    limit: int | None = None,
    columns: ColumnMapping | None = None,
    allow_empty: bool = False,
) -> list[str]:
    """Refuse (UsageError) a mistake of the whole job seen in its first records; return warnings
    (`--questions` that no record of the window uses). `claimed`: the fields the user gave a use
    (`--keep-columns`, and the columns `columns`, the mapping, reads), which are no near misses;
    the rows are checked as the mapping makes them into records. Inputs with no record at all are
    refused unless `allow_empty` (`--allow-empty`): an export that failed upstream must not replace
    yesterday's output with 0 rows."""
    claimed = {*claimed, *(columns.columns if columns else ())}
    nested = columns.nested_columns if columns else RECORD_COLUMNS
    room = FIRST_WINDOW if limit is None else min(limit, FIRST_WINDOW)
    rows: list[Mapping[str, Any]] = []
    documents: list[Mapping[str, Any]] = []  # the raw JSON records, whose keys vary from one to the next
    records = 0
    for source in expand_inputs(inputs):
        if room <= 0:
            break
        read = list(itertools.islice(raw_rows(source, struct_nulls, nested), room))
        room -= len(read)
        records += len(read)
        raws = [raw for raw, problem in read if problem is None and isinstance(raw, Mapping)]
        if source.format.cells is Cells.values:
            documents += raws
        found = [{**row, "questions": own_questions(row, source.format.cells)} for row in _mapped(raws, columns)]
        if source.is_parquet and read:
            check_table(source, parquet_schema(source).names, found, claimed, _state_column(columns))  # Hive keys too
        elif source.format.kind in ("csv", "tsv") and read and isinstance(read[0][0], Mapping):
            check_table(source, list(read[0][0]), found, claimed, _state_column(columns))  # its header
        rows.extend(found)
    if records == 0 and not allow_empty:
        raise UsageError(f"{NO_RECORDS} {', '.join(given_name(item) for item in inputs)}: {EMPTY_WAY_OUT}")
    return unmet_columns(documents, columns) + questions_warnings(rows, questions_given, claimed)


def unmet_columns(documents: Sequence[Mapping[str, Any]], columns: ColumnMapping | None) -> list[str]:
    """A mapped column that none of the first JSON records has: a warning, not a refusal (a later
    record may have it; `table_shape.check_columns` refuses one that no record has)."""
    if not columns or not documents:
        return []
    return [
        f"none of the first {len(documents):,} JSON records has a column {column!r} "
        "(mapped by --columns/--state-columns): check its name; a record without it lacks that field"
        for column in columns.columns
        if not any(column in document for document in documents)
    ]


def _state_column(columns: ColumnMapping | None) -> str | None:
    """The column a table's state comes from (None: built from --state-columns, which the
    mapping's own check finds, `table_shape`)."""
    if columns is None:
        return "state"
    return None if columns.state_columns else columns.source_of("state")


def _mapped(rows: list[Mapping[str, Any]], columns: ColumnMapping | None) -> list[Mapping[str, Any]]:
    """The rows with their fields where the mapping puts them; a row it cannot map is that
    record's error, not the job's."""
    if not columns:
        return rows
    mapped = []
    for index, row in enumerate(rows):
        try:
            mapped.append(columns.apply(row, index))
        except RecordError:
            continue
    return mapped


def check_table(
    source: InputFile,
    names: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    claimed: Collection[str],
    state: str | None = "state",
) -> None:
    """A table's columns (a Parquet schema's, a CSV header's) are every row's fields, so a column's
    mistake is the job's: a column that looks like a record field, no `state` column, a struct
    column refused in every row."""
    missed = near_miss(names, claimed)
    if missed is not None:
        raise UsageError(
            f"{source.path_given}: column {missed[0]!r} is not a record field (did you mean {missed[1]!r}?); "
            f"rename it, map it (--columns {missed[1]}={missed[0]}), or name it in --keep-columns to keep it as "
            "an output column"
        )
    if state is not None and state not in names:
        raise UsageError(f"{source.path_given} has no {state!r} column (its columns: {', '.join(names) or 'none'})")
    for column in RECORD_COLUMNS:
        refused = [row[column] for row in rows if isinstance(row.get(column), AmbiguousNulls)]
        if rows and len(refused) == len(rows):
            raise UsageError(
                f"{source.path_given}: the Parquet struct column {column!r} has nulls in {_first(len(rows))} "
                f"(first {refused[0].paths[0]}): a struct column gives every row the keys of every record, so "
                f"scoring would change their prompts; store {column!r} as JSON text or a Parquet map, or say "
                "what the nulls mean with --struct-nulls absent or --struct-nulls null"
            )


def questions_warnings(
    rows: Sequence[Mapping[str, Any]], questions_given: bool, claimed: Collection[str] = ()
) -> list[str]:
    """No record has questions and no --questions: refused. --questions while every record has
    its own: a warning (a record's own questions win, so the file changes nothing)."""
    if not rows:
        return []
    own = sum(row.get("questions") is not None for row in rows)
    if own == 0 and not questions_given:
        raise UsageError(
            f"no questions: no 'questions' field in {_first(len(rows))}{_near_questions(rows, claimed)}; "
            "give them in the records, or one schema for all with --questions FILE"
        )
    if own == len(rows) and questions_given:
        return [f"--questions changes nothing for {_first(len(rows))}: each has its own questions, which win"]
    return []


def _first(count: int) -> str:
    return "the first record" if count == 1 else f"the first {count:,} records"


def _near_questions(rows: Sequence[Mapping[str, Any]], claimed: Collection[str]) -> str:
    """A field such as `question` in the first record that has one: likely the questions meant."""
    for row in rows:
        missed = near_miss(row, claimed)
        if missed is not None and missed[1] == "questions":
            return f" (but {missed[0]!r}: did you mean 'questions'?)"
    return ""
