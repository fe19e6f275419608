"""CSV and TSV inputs (pyarrow's reader): a header row, then one record per row.

Every cell is read as text, as the file holds it: pyarrow's type guessing would turn an id
`007` into 7 and a state `1e3` into 1000.0, and a spreadsheet's columns have no types to keep.
Quoted cells may hold the delimiter, quotes and newlines. Rows leave here as the file holds
them, whatever their columns are named: how a record field's text cell reads (JSON text for
`state` and `questions`, a media cell's one path or JSON list, an empty cell as none) is the
field's, after `--columns` renamed the columns (formats.Cells.text, records.py, media_cells.py).
Cells are read as bytes and decoded here, so a cell that is not UTF-8 is its row's error, not
the file's; a block is `--max-record-bytes`, so a row up to that size reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from clef_cli.errors import UsageError
from clef_cli.inputs.record_size import MAX_RECORD_BYTES

if TYPE_CHECKING:
    from clef_cli.inputs.sources import InputFile

MIN_BLOCK_BYTES = 1 << 22
"""What pyarrow reads at once at the least; a block is `--max-record-bytes` (a row must fit in one)."""
ROWS_AT_ONCE = 1024
"""Rows of a block made Python values at a time (a block of short rows holds hundreds of thousands)."""


def _reader(source: InputFile, column_types: dict[str, Any] | None, record_bytes: int) -> Any:
    """pyarrow's streaming reader over the file's bytes as pyarrow's own stream (`open_native`)."""
    import pyarrow.csv as pacsv

    delimiter = "\t" if source.format.kind == "tsv" else ","
    block = min(max(record_bytes + (1 << 16), MIN_BLOCK_BYTES), (1 << 31) - 1)
    return pacsv.open_csv(
        source.open_native(),
        read_options=pacsv.ReadOptions(block_size=block),
        parse_options=pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(column_types=column_types, strings_can_be_null=False),
    )


def csv_columns(source: InputFile, record_bytes: int = MAX_RECORD_BYTES) -> list[str]:
    """The header row's column names."""
    import pyarrow as pa

    try:
        with _reader(source, None, record_bytes) as reader:
            return list(reader.schema.names)
    except pa.ArrowInvalid as error:
        kind = source.format.kind.upper()
        raise UsageError(f"{source.path_given} is not a readable {kind} file: {error}") from None
    except OSError as error:
        raise source.read_failure(error) from None


def raw_csv(source: InputFile, record_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[Any, str | None]]:
    """(row, None) or (None, problem) for every data row, in order, every cell as text; a cell
    that is not UTF-8 is its row's problem. A file of no bytes has no rows (an empty export, as
    an empty JSONL file: `first_window` refuses it). A row longer than a block
    (`--max-record-bytes`) cannot be parsed and refuses the file."""
    import pyarrow as pa

    if source.size == 0:
        return
    names = csv_columns(source, record_bytes)
    row_number = 0
    try:
        with _reader(source, dict.fromkeys(names, pa.binary()), record_bytes) as reader:
            for batch in reader:
                for start in range(0, batch.num_rows, ROWS_AT_ONCE):
                    for row in batch.slice(start, ROWS_AT_ONCE).to_pylist():
                        row_number += 1
                        yield _text(row, source.name, row_number)
    except pa.ArrowInvalid as error:
        # pyarrow parses a block (many rows) at a time: the broken row is somewhere past the last one read
        raise UsageError(
            f"{source.path_given}: cannot read past data row {row_number}: {_hint(error, record_bytes)}"
        ) from None
    except OSError as error:
        raise source.read_failure(error) from None


def _hint(error: Exception, record_bytes: int) -> str:
    """pyarrow's words, and what to do when they say a row did not fit in a block."""
    if "block" not in str(error):
        return str(error)
    return f"{error} (a row must fit in --max-record-bytes, {record_bytes:,} bytes)"


def _text(row: dict[str, Any], file_name: str, row_number: int) -> tuple[Any, str | None]:
    """A row's cells as text, or the row's problem: a cell that is not UTF-8."""
    for name, value in row.items():
        try:
            row[name] = value.decode("utf-8")
        except UnicodeDecodeError as error:
            problem = f"column {name!r} is not UTF-8 text ({error.reason} at byte {error.start})"
            return None, f"{file_name} data row {row_number}: {problem}"
    return row, None
