"""Reading input files (JSONL, JSON, Parquet, CSV/TSV; compressed streams; local paths or URIs)
into records, streaming: a Parquet or CSV file is read batch by batch and a JSONL file line by
line, so a job over millions of records never holds them all. A part of a Hive-partitioned
folder gives each row its partition keys as columns. Validation itself is records.py's."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from clef_cli.errors import RecordError, UsageError
from clef_cli.inputs.columns import ColumnMapping
from clef_cli.inputs.delimited import raw_csv
from clef_cli.inputs.json_values import unreadable_json
from clef_cli.inputs.parquet_rows import RECORD_COLUMNS, StructNulls, parquet_rows
from clef_cli.inputs.records import InvalidRecord, Record, RecordBuilder, parse_questions
from clef_cli.inputs.sources import InputFile, expand_inputs

TEXT_ENCODING = "utf-8-sig"
"""UTF-8, with a byte order mark (as Windows tools write one) read past, as gold files are read."""


def load_questions_file(path: str | Path) -> dict[str, Any]:
    """`--questions FILE`: one question schema, as `{id: question}` or `{"questions": {...}}`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding=TEXT_ENCODING))
    except FileNotFoundError:
        raise UsageError(f"questions file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read questions file {path}: {error}") from None
    except json.JSONDecodeError as error:
        raise UsageError(f"questions file {path} is not valid JSON: {error.msg} (line {error.lineno})") from None
    except (RecursionError, ValueError) as error:
        raise UsageError(f"questions file {path} cannot be read: {unreadable_json(error)}") from None
    if isinstance(data, Mapping) and isinstance(data.get("questions"), Mapping):
        data = data["questions"]
    if not isinstance(data, Mapping) or not data:
        raise UsageError(f"questions file {path} must hold a non-empty object of question id -> question")
    try:
        parse_questions(data, "--questions")
    except RecordError as error:
        raise UsageError(f"questions file {path}: {error.message} ({error.field})") from None
    return dict(data)


def parse_jsonl_line(line: bytes, file_name: str, line_number: int) -> tuple[Any, str | None]:
    """One JSONL line: (value, None), or (None, what is wrong with it)."""
    try:
        return json.loads(line.decode(TEXT_ENCODING)), None
    except UnicodeDecodeError as error:
        return None, f"{file_name} line {line_number}: not UTF-8 text ({error.reason})"
    except json.JSONDecodeError as error:
        return None, f"{file_name} line {line_number}: invalid JSON ({error.msg})"
    except (RecursionError, ValueError) as error:  # valid JSON that Python's parser cannot hold
        return None, f"{file_name} line {line_number}: JSON that cannot be read ({unreadable_json(error)})"


def _raw_jsonl(source: InputFile) -> Iterator[tuple[Any, str | None]]:
    with source.open_binary() as handle:
        for line_number, line in enumerate(handle, start=1):
            if line.strip():
                yield parse_jsonl_line(line, source.name, line_number)


def _raw_json(source: InputFile) -> Iterator[tuple[Any, str | None]]:
    try:
        with source.open_binary() as handle:
            data = json.loads(handle.read().decode(TEXT_ENCODING))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{source.location} is not a valid JSON file: {error}") from None
    except (RecursionError, ValueError) as error:
        raise UsageError(f"{source.location} cannot be read: {unreadable_json(error)}") from None
    items = data if isinstance(data, list) else [data]
    for item in items:
        yield item, None


def _raw_parquet(
    source: InputFile, struct_nulls: StructNulls | None, nested: tuple[str, ...], batch_size: int = 1024
) -> Iterator[tuple[Any, str | None]]:
    try:
        parquet = source.parquet()
    except Exception as error:  # pyarrow raises several types for a damaged file
        raise UsageError(f"{source.location} is not a readable Parquet file: {error}") from None
    for batch in parquet.iter_batches(batch_size=batch_rows(parquet, batch_size)):
        rows = batch.to_pylist() if struct_nulls is None else parquet_rows(batch, struct_nulls, nested)
        for row in rows:
            yield row, None


BATCH_BYTES = 16 << 20
"""About the bytes of one Parquet batch read for records (its rows' uncompressed size)."""
BINARY_BATCH_ROWS = 64
"""Rows per batch of a table with binary columns (inline media): their size cannot be known
before reading (a dictionary-encoded column of repeated images is small on disk), and 1024 rows
of 100 KiB images would be 100 MiB read at once, twice over as Python values."""


def batch_rows(parquet: Any, most: int) -> int:
    """Rows per batch: `most`, fewer where the file's rows are large or hold binary cells."""
    metadata = parquet.metadata
    rows = metadata.num_rows
    size = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
    if "binary" in str(parquet.schema_arrow):  # a binary column, or one nested in a struct or list
        most = min(most, BINARY_BATCH_ROWS)
    return most if rows == 0 or size <= 0 else max(1, min(most, BATCH_BYTES * rows // size))


def raw_rows(
    source: InputFile, struct_nulls: StructNulls | None = None, nested: tuple[str, ...] = RECORD_COLUMNS
) -> Iterator[tuple[Any, str | None]]:
    """(raw record, None) or (None, problem) for every record of one input, in order. Parquet
    rows are read for records under `struct_nulls` (the `nested` columns: a mapping's), or
    exactly as stored when it is None (pass-through columns)."""
    kind = source.format.kind
    if kind == "parquet":
        rows = _raw_parquet(source, struct_nulls, nested)
    elif kind in ("csv", "tsv"):
        rows = raw_csv(source)
    elif kind == "json":
        rows = _raw_json(source)
    else:
        rows = _raw_jsonl(source)
    return with_partitions(rows, source.partitions) if source.partitions else rows


def with_partitions(
    rows: Iterator[tuple[Any, str | None]], partitions: tuple[tuple[str, str | None], ...]
) -> Iterator[tuple[Any, str | None]]:
    """Rows with their Hive partition keys as columns (a column the part itself holds wins)."""
    for raw, problem in rows:
        if problem is None and isinstance(raw, dict):
            raw = {**dict(partitions), **raw}
        yield raw, problem


def read_records(
    paths: Iterable[str | Path],
    questions: Mapping[str, Any] | None = None,
    limit: int | None = None,
    struct_nulls: StructNulls = StructNulls.refuse,
    columns: ColumnMapping | None = None,
    claimed: Iterable[str] = (),
) -> Iterator[Record | InvalidRecord]:
    """Stream records from every input in order; `index` counts across all inputs from 0.
    `struct_nulls` says what a null inside a Parquet struct column means (see parquet_rows);
    `columns`, which input columns the fields come from (inputs/columns.py); `claimed` names
    fields the user gave a use (`--keep-columns`), so they are no near misses."""
    builder = RecordBuilder(default_questions=questions, columns=columns, claimed=frozenset(claimed))
    nested = columns.nested_columns if columns is not None else RECORD_COLUMNS
    index = 0
    for source in expand_inputs(paths):
        base_dir = source.base_dir
        json_text = source.format.text_cells
        for raw, problem in raw_rows(source, struct_nulls, nested):
            if limit is not None and index >= limit:
                return
            if problem is not None:
                yield InvalidRecord(str(index), index, problem)
            else:
                yield builder.build(raw, index, base_dir, json_text=json_text)
            index += 1


def count_records(paths: Iterable[str | Path], limit: int | None = None) -> int | None:
    """How many records the inputs hold (for progress and estimates), without parsing them.

    JSONL counts non-blank lines; Parquet reads its footer; a JSON file is parsed.
    """
    total = 0
    for source in expand_inputs(paths):
        try:
            kind = source.format.kind
            if kind == "parquet":
                total += source.parquet().metadata.num_rows
            elif kind in ("json", "csv", "tsv"):
                total += sum(1 for _ in raw_rows(source))
            else:
                with source.open_binary() as handle:
                    total += sum(1 for line in handle if line.strip())
        except Exception:  # counting is only for progress; reading reports real problems
            return None
    return min(total, limit) if limit is not None else total


def iter_column_values(
    paths: Iterable[str | Path], columns: Sequence[str], limit: int | None = None, present: set[str] | None = None
) -> Iterator[dict[str, Any]]:
    """The raw values of some input columns, one dict per record, in record order; the names
    found in at least one record are added to `present`."""
    index = 0
    for source in expand_inputs(paths):
        for raw, problem in raw_rows(source):
            if limit is not None and index >= limit:
                return
            values = raw if problem is None and isinstance(raw, Mapping) else {}
            if present is not None:
                present.update(name for name in columns if name in values)
            yield {name: values.get(name) for name in columns}
            index += 1


def parquet_only(paths: Iterable[str | Path]) -> bool:
    return all(source.is_parquet for source in expand_inputs(paths))


def parquet_schema(source: InputFile) -> Any:
    """A Parquet part's Arrow schema with its Hive partition keys (text) as further columns."""
    import pyarrow as pa

    schema = source.parquet().schema_arrow
    for key, _ in source.partitions:
        if key not in schema.names:
            schema = schema.append(pa.field(key, pa.string()))
    return schema
