"""Reading input files (JSONL, JSON, Parquet; local paths or URIs) into records, streaming:
a Parquet file is read batch by batch and a JSONL file line by line, so a job over millions of
records never holds them all. Validation itself is records.py's."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from clef_cli.errors import RecordError, UsageError
from clef_cli.inputs.json_values import unreadable_json
from clef_cli.inputs.parquet_rows import StructNulls, parquet_rows
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
    source: InputFile, struct_nulls: StructNulls | None, batch_size: int = 1024
) -> Iterator[tuple[Any, str | None]]:
    try:
        parquet = source.parquet()
    except Exception as error:  # pyarrow raises several types for a damaged file
        raise UsageError(f"{source.location} is not a readable Parquet file: {error}") from None
    for batch in parquet.iter_batches(batch_size=batch_size):
        rows = batch.to_pylist() if struct_nulls is None else parquet_rows(batch, struct_nulls)
        for row in rows:
            yield row, None


def raw_rows(source: InputFile, struct_nulls: StructNulls | None = None) -> Iterator[tuple[Any, str | None]]:
    """(raw record, None) or (None, problem) for every record of one input, in order. Parquet
    rows are read for records under `struct_nulls`, or exactly as stored when it is None
    (pass-through columns)."""
    if source.is_parquet:
        return _raw_parquet(source, struct_nulls)
    if source.suffix == ".json":
        return _raw_json(source)
    return _raw_jsonl(source)


def read_records(
    paths: Iterable[str | Path],
    questions: Mapping[str, Any] | None = None,
    limit: int | None = None,
    struct_nulls: StructNulls = StructNulls.refuse,
    claimed: Iterable[str] = (),
) -> Iterator[Record | InvalidRecord]:
    """Stream records from every input in order; `index` counts across all inputs from 0.
    `struct_nulls` says what a null inside a Parquet struct column means (see parquet_rows);
    `claimed` names fields the user gave a use (`--keep-columns`), so they are no near misses."""
    builder = RecordBuilder(default_questions=questions, claimed=frozenset(claimed))
    index = 0
    for source in expand_inputs(paths):
        base_dir = source.base_dir
        json_text = source.is_parquet
        for raw, problem in raw_rows(source, struct_nulls):
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
            if source.is_parquet:
                total += source.parquet().metadata.num_rows
            elif source.suffix == ".json":
                total += sum(1 for _ in _raw_json(source))
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
