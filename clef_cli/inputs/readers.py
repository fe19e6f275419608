"""Reading input files (JSONL, JSON, Parquet, CSV/TSV; compressed streams; local paths or URIs)
into records, streaming: a Parquet or CSV file is read batch by batch and a JSONL file line by
line, so a job over millions of records never holds them all. A part of a Hive-partitioned
folder gives each row its partition keys as columns. Validation itself is records.py's."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from clef_cli.errors import RecordError, UsageError
from clef_cli.inputs.columns import ColumnMapping
from clef_cli.inputs.delimited import raw_csv
from clef_cli.inputs.fields import MEDIA_FIELDS
from clef_cli.inputs.json_values import unreadable_json
from clef_cli.inputs.parquet_pages import oversize_cells, refused_columns
from clef_cli.inputs.parquet_rows import RECORD_COLUMNS, StructNulls, parquet_rows
from clef_cli.inputs.record_size import MAX_RECORD_BYTES, Oversize, ReadLimits, bounded_lines, oversize_line
from clef_cli.inputs.records import InvalidRecord, Record, RecordBuilder, parse_questions
from clef_cli.inputs.sources import InputFile, InputLike, expand_inputs

TEXT_ENCODING = "utf-8-sig"
"""UTF-8, with a byte order mark (as Windows tools write one) read past, as gold files are read."""


def load_questions_file(path: str | Path) -> dict[str, Any]:
    """`--questions FILE`: one question schema, as `{id: question}` or `{"questions": {...}}`; a
    path or a URI (an object is read once into a local copy, `sources.local_copy`)."""
    from clef_cli.inputs.sources import local_copy

    try:
        data = json.loads(local_copy(path, "--questions").read_text(encoding=TEXT_ENCODING))
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


def _raw_jsonl(source: InputFile, limit: int) -> Iterator[tuple[Any, str | None]]:
    with source.open_binary() as handle:
        for line_number, line in enumerate(bounded_lines(handle, limit), start=1):
            yield from jsonl_record(line, source.name, line_number, limit)


def jsonl_record(line: bytes | Oversize, file_name: str, line_number: int, limit: int) -> list[tuple[Any, str | None]]:
    """The record of one JSONL line (none for a blank one); a line over `limit` is its error."""
    if isinstance(line, Oversize):
        return [(None, oversize_line(file_name, line_number, line.size, limit))]
    return [parse_jsonl_line(line, file_name, line_number)] if line.strip() else []


def _raw_json(source: InputFile) -> Iterator[tuple[Any, str | None]]:
    try:
        with source.open_binary() as handle:
            data = json.loads(handle.read().decode(TEXT_ENCODING))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{source.path_given} is not a valid JSON file: {error}") from None
    except (RecursionError, ValueError) as error:
        raise UsageError(f"{source.path_given} cannot be read: {unreadable_json(error)}") from None
    items = data if isinstance(data, list) else [data]
    for item in items:
        yield item, None


def _raw_parquet(
    source: InputFile, struct_nulls: StructNulls | None, nested: tuple[str, ...], limits: ReadLimits
) -> Iterator[tuple[Any, str | None]]:
    try:
        parquet = source.parquet()
    except Exception as error:  # pyarrow raises several types for a damaged file
        raise UsageError(f"{source.path_given} is not a readable Parquet file: {error}") from None
    for group in range(parquet.num_row_groups):
        for row in row_group_rows(source, parquet, group, struct_nulls, nested, limits):
            yield row, None


def row_group_rows(
    source: InputFile,
    parquet: Any,
    group: int,
    struct_nulls: StructNulls | None,
    nested: tuple[str, ...],
    limits: ReadLimits,
    batch_size: int = 1024,
) -> Iterator[dict[str, Any]]:
    """The rows of one row group, a batch at a time. A column whose pages there are too large to
    decompress is left out of the read, and a cell over its limit is never copied out of Arrow
    (parquet_pages.py): each of those holds an `OversizeCell` (read as stored, `struct_nulls`
    None: a null)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    refused = refused_columns(source, parquet, group, limits)
    read = [name for name in parquet.schema_arrow.names if name not in refused]
    marks = {name: (cell if struct_nulls is not None else None) for name, cell in refused.items()}
    if not read:  # no column left to read: the rows are their marks alone
        for _ in range(parquet.metadata.row_group(group).num_rows):
            yield dict(marks)
        return
    size = batch_rows(parquet, batch_size)
    for batch in parquet.iter_batches(batch_size=size, row_groups=[group], columns=read if refused else None):
        over = oversize_cells(batch, limits)
        for name, (mask, _) in over.items():  # never copied: null in the batch, marked in the row
            number = batch.schema.get_field_index(name)
            column = batch.column(number)
            batch = batch.set_column(number, name, pc.if_else(mask, pa.nulls(len(column), column.type), column))
        rows = batch.to_pylist() if struct_nulls is None else parquet_rows(batch, struct_nulls, nested)
        for number, row in enumerate(rows):
            for name, (mask, cells) in over.items():
                if mask[number]:
                    row[name] = cells[number] if struct_nulls is not None else None
            yield row | marks if marks else row


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
    source: InputFile,
    struct_nulls: StructNulls | None = None,
    nested: tuple[str, ...] = RECORD_COLUMNS,
    limits: ReadLimits | None = None,
) -> Iterator[tuple[Any, str | None]]:
    """(raw record, None) or (None, problem) for every record of one input, in order. Parquet
    rows are read for records under `struct_nulls` (the `nested` columns: a mapping's), or
    exactly as stored when it is None (pass-through columns). `limits`: the sizes refused unread
    (a JSONL line, a cell: `--max-record-bytes`; an inline medium: `--max-file-bytes`)."""
    limits = limits or ReadLimits()
    kind = source.format.kind
    if kind == "parquet":
        rows = _raw_parquet(source, struct_nulls, nested, limits)
    elif kind in ("csv", "tsv"):
        rows = raw_csv(source, limits.record_bytes)
    elif kind == "json":
        rows = _raw_json(source)
    else:
        rows = _raw_jsonl(source, limits.record_bytes)
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
    paths: Iterable[InputLike],
    questions: Mapping[str, Any] | None = None,
    limit: int | None = None,
    struct_nulls: StructNulls = StructNulls.refuse,
    columns: ColumnMapping | None = None,
    claimed: Iterable[str] = (),
    limits: ReadLimits | None = None,
) -> Iterator[Record | InvalidRecord]:
    """Stream records from every input in order; `index` counts across all inputs from 0.
    `struct_nulls` says what a null inside a Parquet struct column means (see parquet_rows);
    `columns`, which input columns the fields come from (inputs/columns.py); `claimed` names
    fields the user gave a use (`--keep-columns`), so they are no near misses; `limits`, the
    sizes refused unread (`record_size.py`)."""
    builder = RecordBuilder(default_questions=questions, columns=columns, claimed=frozenset(claimed))
    nested = columns.nested_columns if columns is not None else RECORD_COLUMNS
    limits = read_limits(limits or ReadLimits(), columns)
    index = 0
    for source in expand_inputs(paths):
        base_dir = source.base_dir
        cells = source.format.cells
        for raw, problem in raw_rows(source, struct_nulls, nested, limits):
            if limit is not None and index >= limit:
                return
            if problem is not None:
                yield InvalidRecord(None, index, problem)  # no id can be read: the row's id is null
            else:
                yield builder.build(raw, index, base_dir, cells)
            index += 1


def read_limits(limits: ReadLimits, columns: ColumnMapping | None) -> ReadLimits:
    """`limits` with the columns a mapping reads media from among its media columns."""
    if columns is None:
        return limits
    mapped = tuple(columns.source_of(name) for name in MEDIA_FIELDS)
    return replace(limits, media_columns=tuple(dict.fromkeys(limits.media_columns + mapped)))


def count_records(paths: Iterable[InputLike], limit: int | None = None) -> int | None:
    """How many records the inputs hold (for progress and estimates), without parsing them.

    JSONL counts non-blank lines (a line too long to read is a record, read past); Parquet
    reads its footer; a JSON file is parsed.
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
                    lines = bounded_lines(handle, MAX_RECORD_BYTES)
                    total += sum(1 for line in lines if isinstance(line, Oversize) or line.strip())
        except Exception:  # counting is only for progress; reading reports real problems
            return None
    return min(total, limit) if limit is not None else total


def iter_column_values(
    paths: Iterable[InputLike], columns: Sequence[str], limit: int | None = None, present: set[str] | None = None
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


def parquet_only(paths: Iterable[InputLike]) -> bool:
    return all(source.is_parquet for source in expand_inputs(paths))


def parquet_schema(source: InputFile) -> Any:
    """A Parquet part's Arrow schema with its Hive partition keys (text) as further columns."""
    import pyarrow as pa

    schema = source.parquet().schema_arrow
    for key, _ in source.partitions:
        if key not in schema.names:
            schema = schema.append(pa.field(key, pa.string()))
    return schema
