"""CSV and TSV inputs (pyarrow's reader): a header row, then one record per row.

Every cell is read as text, as the file holds it: pyarrow's type guessing would turn an id
`007` into 7 and a state `1e3` into 1000.0, and a spreadsheet's columns have no types to keep.
So `state` and `questions` cells are text that reads as today's Parquet text cells do (JSON
object or array text is that value), an id is the text it spells, and a media cell holds one
path or a JSON list of them. Quoted cells may hold the delimiter, quotes and newlines. An empty
`questions` or media cell is an absent one (the record has none).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from clef_cli.errors import UsageError

if TYPE_CHECKING:
    from clef_cli.inputs.sources import InputFile

MEDIA_COLUMNS = ("images", "audio", "videos")
EMPTY_IS_ABSENT = ("questions", *MEDIA_COLUMNS)
BLOCK_BYTES = 1 << 22
"""What pyarrow reads at once: a batch of rows, whatever the file's size."""


def _reader(source: InputFile, column_types: dict[str, Any] | None) -> Any:
    import pyarrow.csv as pacsv

    delimiter = "\t" if source.format.kind == "tsv" else ","
    return pacsv.open_csv(
        source.open_binary(),
        read_options=pacsv.ReadOptions(block_size=BLOCK_BYTES),
        parse_options=pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(column_types=column_types, strings_can_be_null=False),
    )


def csv_columns(source: InputFile) -> list[str]:
    """The header row's column names."""
    import pyarrow as pa

    try:
        with _reader(source, None) as reader:
            return list(reader.schema.names)
    except (pa.ArrowInvalid, OSError) as error:
        raise UsageError(f"{source.location} is not a readable {source.format.kind.upper()} file: {error}") from None


def raw_csv(source: InputFile) -> Iterator[tuple[Any, str | None]]:
    """(row, None) or (None, problem) for every data row, in order, every cell as text."""
    import pyarrow as pa

    names = csv_columns(source)
    row_number = 0
    try:
        with _reader(source, dict.fromkeys(names, pa.string())) as reader:
            for batch in reader:
                for row in batch.to_pylist():
                    row_number += 1
                    yield _cells(row, source.name, row_number)
    except pa.ArrowInvalid as error:
        raise UsageError(f"{source.location}: cannot read data row {row_number + 1}: {error}") from None


def _cells(row: dict[str, Any], file_name: str, row_number: int) -> tuple[Any, str | None]:
    """A row as a raw record: empty questions/media cells absent, media text as a list."""
    for name in EMPTY_IS_ABSENT:
        if row.get(name) == "":
            row[name] = None
    for name in MEDIA_COLUMNS:
        value = row.get(name)
        if not isinstance(value, str):
            continue
        if not value.lstrip().startswith("["):
            row[name] = [value]
            continue
        try:
            row[name] = json.loads(value)
        except (json.JSONDecodeError, RecursionError, ValueError):
            problem = f"{name}: a cell starting with [ must be a JSON list of paths"
            return None, f"{file_name} data row {row_number}: {problem}"
    return row, None
