"""Writing the final Parquet: committed results in input order, pass-through columns, provenance.

The file appears only when complete (temporary name, fsync, rename), so a killed job never
leaves a half-written output that a downstream reader could take for a result.

A job whose `-o` is an object URI writes its output into its checkpoint's local folder first (the
store itself, or a bucket store's cache folder), atomically as every file (`store/atomic.py`),
and uploads it whole at the end (`locations/uploads.py`); the rerun uploads again from the store.
The staged copy goes once its upload succeeded (a dated output a night would otherwise pile up in
a cache a machine keeps), unless `--keep-staged-output`; a failed upload keeps it and says where.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from clef_cli import faults
from clef_cli.errors import ClefError, UsageError
from clef_cli.inputs.json_values import without_lone_surrogates
from clef_cli.inputs.readers import iter_column_values, parquet_only, parquet_schema
from clef_cli.inputs.sources import expand_inputs
from clef_cli.locations.object_store import ObjectStoreError
from clef_cli.locations.uploads import upload_whole
from clef_cli.results import (
    FIRST_ERRORS,
    LONG_SCHEMA,
    RESULT_SCHEMA,
    FlatColumns,
    OutputCounts,
    failures_of,
    flat_rows,
    long_rows,
)
from clef_cli.store import durable
from clef_cli.store.atomic import is_stdout, write_file

if TYPE_CHECKING:
    from clef_cli.quality.calibrate.temperature import Calibration

RESERVED_COLUMNS = set(RESULT_SCHEMA.names) | set(LONG_SCHEMA.names)


@dataclass(frozen=True)
class OutputSpec:
    path: Path
    layout: str = "wide"
    keep_columns: Sequence[str] = ()
    row_group_size: int = 16384
    metadata: dict[str, str] = field(default_factory=dict)
    calibration: Calibration | None = None
    """Temperature scaling applied as rows are written (never stored in the checkpoint)."""


def check_keep_columns(columns: Sequence[str]) -> None:
    """Refuse, before any record is scored, a column the output could not hold: one of clef's own
    or one named twice (a Parquet file has one column by each name)."""
    clashes = sorted(set(columns) & RESERVED_COLUMNS)
    if clashes:
        raise UsageError(f"--keep-columns cannot pass through {', '.join(clashes)}: clef writes these columns")
    twice = sorted(name for name, count in Counter(columns).items() if count > 1)
    if twice:
        raise UsageError(f"--keep-columns names {', '.join(twice)} more than once")


# ----------------------------------------------------------------------------- pass-through columns


_RANK = {"null": 0, "bool": 1, "int": 2, "float": 3, "string": 4, "json": 5}
_ARROW = {
    "null": pa.null(),
    "bool": pa.bool_(),
    "int": pa.int64(),
    "float": pa.float64(),
    "string": pa.string(),
    "json": pa.string(),
}


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if INT64_MIN <= value <= INT64_MAX else "json"  # kept whole, as JSON text
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    return "json"


def _widen(current: str, value: Any) -> str:
    kind = _kind(value)
    if {current, kind} <= {"int", "float", "null"} or current == "null" or kind == "null":
        return max(current, kind, key=_RANK.__getitem__)
    if current == kind:
        return current
    return "json" if "json" in (current, kind) else "string"


@dataclass(frozen=True)
class Passthrough:
    types: dict[str, pa.DataType]
    as_text: frozenset[str] = frozenset()
    """Columns whose non-string values are written as JSON text."""


def passthrough_types(inputs: Sequence[Path], columns: Sequence[str], limit: int | None) -> Passthrough:
    """Native Arrow types for Parquet inputs; for JSON a type wide enough for every value (one
    pass over the input), with objects and lists kept as JSON text."""
    if parquet_only(inputs):
        schemas = [parquet_schema(source) for source in expand_inputs(inputs)]
        try:
            unified = pa.unify_schemas(schemas)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
            raise UsageError(f"--keep-columns: the input files disagree on column types: {error}") from None
        _check_present(columns, set(unified.names))
        return Passthrough({name: unified.field(name).type for name in columns})
    kinds = dict.fromkeys(columns, "null")
    present: set[str] = set()
    for values in iter_column_values(inputs, columns, limit, present=present):
        for name, value in values.items():
            kinds[name] = _widen(kinds[name], value)
    _check_present(columns, present)
    return Passthrough(
        {name: _ARROW[kind] for name, kind in kinds.items()},
        frozenset(name for name, kind in kinds.items() if kind in ("json", "string")),
    )


def _check_present(columns: Sequence[str], present: set[str]) -> None:
    missing = [name for name in columns if name not in present]
    if missing:
        raise UsageError(f"--keep-columns: no input record has {', '.join(missing)}")


def _passthrough_chunks(
    inputs: Sequence[Path], columns: Sequence[str], limit: int | None, passthrough: Passthrough, size: int
) -> Iterator[dict[str, pa.Array]]:
    buffer: dict[str, list[Any]] = {name: [] for name in columns}

    def flush() -> dict[str, pa.Array]:
        arrays = {name: pa.array(values, type=passthrough.types[name]) for name, values in buffer.items()}
        for values in buffer.values():
            values.clear()
        return arrays

    count = 0
    for values in iter_column_values(inputs, columns, limit):
        for name in columns:
            value = values[name]
            if name in passthrough.as_text and value is not None and not isinstance(value, str):
                value = json.dumps(value, ensure_ascii=False, sort_keys=True)
            if isinstance(value, str):
                value = without_lone_surrogates(value)  # text Parquet can hold; the record is scored
            buffer[name].append(value)
        count += 1
        if count == size:
            yield flush()
            count = 0
    if count:
        yield flush()


# ----------------------------------------------------------------------------- writing


@contextmanager
def flat_spool(results: Iterable[pa.Table], output: Path) -> Iterator[tuple[Iterator[pa.Table], FlatColumns]]:
    """The flat layout's columns depend on every record's questions, and a Parquet file's schema
    comes first: so the results go once into a temporary file beside the output (a row group at
    a time, memory flat) while their columns are gathered, and are then read back to be written."""
    folder = None if is_stdout(output) else _resolved_parent(output)
    descriptor, name = tempfile.mkstemp(dir=folder, prefix=f".{output.name}.", suffix=".flat.tmp")
    os.close(descriptor)
    temporary = Path(name)
    try:
        columns = FlatColumns()
        with pq.ParquetWriter(temporary, RESULT_SCHEMA) as writer:
            for table in results:
                columns.add(table)
                writer.write_table(table.cast(RESULT_SCHEMA))
        stored = pq.ParquetFile(temporary)
        yield (pa.Table.from_batches([batch]) for batch in stored.iter_batches()), columns
    finally:
        temporary.unlink(missing_ok=True)


def _resolved_parent(path: Path) -> Path:
    return (path.resolve() if path.is_symlink() else path.absolute()).parent


def row_groups(results: Iterable[pa.Table], size: int) -> Iterator[tuple[int, pa.Table]]:
    """(first record_index, rows) of each row group, from `results` in input order, checked:
    the records of the job, each exactly once, from index 0 (a chunk at a time, never the job)."""
    pending: list[pa.Table] = []
    held = start = 0
    for table in results:
        if table.num_rows == 0:
            continue
        indices = table.column("record_index").to_numpy()
        expected = np.arange(start + held, start + held + table.num_rows)
        if not np.array_equal(indices, expected):
            raise ClefError("the checkpoint does not hold exactly one result per input record; rerun with --restart")
        pending.append(table)
        held += table.num_rows
        while held >= size:
            rows = pa.concat_tables(pending)
            yield start, rows.slice(0, size).combine_chunks()
            pending, held, start = [rows.slice(size)], held - size, start + size
    if held:
        yield start, pa.concat_tables(pending).combine_chunks()


@dataclass
class _Failures:
    """The failed rows counted as the output streams past (`results.failures_of`, chunk by chunk),
    and the rows whose state was cut to fit."""

    count: int = 0
    by_kind: Counter = field(default_factory=Counter)
    first: list[tuple[str | None, str]] = field(default_factory=list)
    cut: int = 0

    def add(self, rows: pa.Table) -> None:
        self.cut += int(pc.sum(pc.greater(rows.column("state_tokens_cut"), 0)).as_py() or 0)
        failed = rows.column("error").is_valid()
        if not pc.any(failed).as_py():
            return
        by_kind, first = failures_of(rows)
        self.count += sum(by_kind.values())
        self.by_kind.update(by_kind)
        self.first.extend(first[: FIRST_ERRORS - len(self.first)])

    def counts(self, records: int) -> OutputCounts:
        return OutputCounts(records, self.count, dict(sorted(self.by_kind.items())), tuple(self.first), self.cut)


def write_output(
    spec: OutputSpec,
    results: Iterable[pa.Table],
    inputs: Sequence[Path],
    limit: int | None,
    passthrough: Passthrough | None = None,
) -> OutputCounts:
    """Write `results` (one row per record, in input order, in chunks) to `spec.path`, a row
    group at a time, so memory does not grow with the job.

    `passthrough` (from `passthrough_types`, computed early so a bad --keep-columns fails before
    the model runs) is worked out here when not given."""
    check_keep_columns(spec.keep_columns)
    if spec.layout == "flat":
        with flat_spool(results, spec.path) as (spooled, columns):
            return _write(spec, spooled, inputs, limit, passthrough, columns)
    return _write(spec, results, inputs, limit, passthrough, None)


def _write(
    spec: OutputSpec,
    results: Iterable[pa.Table],
    inputs: Sequence[Path],
    limit: int | None,
    passthrough: Passthrough | None,
    flat: FlatColumns | None,
) -> OutputCounts:
    schema = LONG_SCHEMA if spec.layout == "long" else RESULT_SCHEMA
    if flat is not None:
        schema = flat.schema()
    chunks: Iterator[dict[str, pa.Array]] | None = None
    if spec.keep_columns:
        passthrough = passthrough or passthrough_types(inputs, spec.keep_columns, limit)
        chunks = _passthrough_chunks(inputs, spec.keep_columns, limit, passthrough, spec.row_group_size)
        for name in spec.keep_columns:
            if name in schema.names:
                raise UsageError(f"--keep-columns {name}: the flat layout writes a column of that name")
            schema = schema.append(pa.field(name, passthrough.types[name]))
    metadata = dict(spec.metadata)
    if flat is not None:
        metadata["clef.flat_columns"] = flat.metadata()
    if spec.calibration is not None:
        metadata["clef.calibration_sha256"] = spec.calibration.sha256 or ""
        metadata["clef.calibration_method"] = spec.calibration.method
    schema = schema.with_metadata({key: str(value) for key, value in metadata.items()})
    failures, records = _Failures(), 0

    def write(handle: BinaryIO) -> None:
        nonlocal records
        with pq.ParquetWriter(handle, schema) as writer:
            for start, chunk in row_groups(results, spec.row_group_size):
                failures.add(chunk)
                records += chunk.num_rows
                if spec.calibration is not None:
                    from clef_cli.quality.calibrate.temperature import calibrate_results

                    chunk = calibrate_results(chunk, spec.calibration)
                extra = next(chunks) if chunks is not None else {}
                shaped = _shape(chunk, spec.layout, extra, start, schema, flat)
                writer.write_table(shaped, row_group_size=1 << 30)
            if records == 0:
                writer.write_table(schema.empty_table())

    write_file(spec.path, write, before_rename=faults.before_output_rename)
    return failures.counts(records)


def _shape(
    chunk: pa.Table,
    layout: str,
    extra: dict[str, pa.Array],
    start: int,
    schema: pa.Schema,
    flat: FlatColumns | None = None,
) -> pa.Table:
    if flat is not None:
        table = flat_rows(chunk, flat)
        columns = extra
    elif layout == "long":
        table = long_rows(chunk)
        positions = pc.subtract(table.column("record_index"), pa.scalar(start, pa.int64()))
        columns = {name: pc.take(values, positions) for name, values in extra.items()}
    else:
        table = chunk
        columns = extra
    for name, values in columns.items():
        table = table.append_column(name, values)
    return table.cast(schema)


def upload_staged(staged: Path, uri: str, keep: bool = False) -> None:
    """Put the staged output `staged` at `uri`, then remove it unless `keep`. A failed upload (an
    `ObjectStoreError`, exit 1) keeps it, and its message names where it is."""
    try:
        upload_whole(staged, uri)
    except ObjectStoreError as error:
        raise ObjectStoreError(f"{error} (its local copy stays at {staged})") from None
    if not keep:
        durable.unlink(staged)
