"""Reading the inputs in Ray tasks: Parquet row groups and JSONL byte ranges, each row carrying
its global record index, so that records keep their place in the output whoever reads them."""

from __future__ import annotations

import itertools
import json
import pickle
from dataclasses import dataclass
from typing import Any

from clef_cli.errors import RecordError
from clef_cli.inputs.json_values import MAX_NESTING
from clef_cli.inputs.parquet_rows import RECORD_COLUMNS, StructNulls
from clef_cli.inputs.readers import jsonl_record, raw_rows, row_group_rows, with_partitions
from clef_cli.inputs.record_size import MAX_RECORD_BYTES, PIECE_BYTES, Oversize, ReadLimits, bounded_lines
from clef_cli.inputs.sources import InputFile

JSONL_RANGE_BYTES = 64 << 20


@dataclass(frozen=True)
class Slice:
    """A piece of one input that a Ray task reads: a Parquet row group or a JSONL byte range."""

    location: str
    size: int
    kind: str  # "parquet" (a row group), "jsonl" (a byte range) or "json" (a file read whole)
    part: int  # row group, or byte offset of the range
    stop: int  # byte end of a JSONL range
    first_index: int
    first_line: int = 1
    partitions: str = "[]"
    """The part's Hive partition keys, as JSON pairs (`InputFile.partitions`)."""
    base: str | None = None
    shown: str | None = None

    def source(self) -> InputFile:
        pairs = tuple((key, value) for key, value in json.loads(self.partitions))
        return InputFile(self.location, self.size, pairs, self.base, self.shown)


def _slice(source: InputFile, kind: str, part: int, stop: int, first_index: int, first_line: int = 1) -> Slice:
    partitions = json.dumps([list(pair) for pair in source.partitions])
    return Slice(
        source.location, source.size, kind, part, stop, first_index, first_line, partitions, source.base, source.shown
    )


def _count_range(location: str, size: int, start: int, stop: int) -> tuple[int, int]:
    """(records, lines) whose first byte lies in [start, stop) of a JSONL file."""
    records = lines = 0
    for _, line in _range_lines(InputFile(location, size), start, stop, MAX_RECORD_BYTES):
        lines += 1
        records += isinstance(line, Oversize) or bool(line.strip())
    return records, lines


def _range_lines(source: InputFile, start: int, stop: int, limit: int) -> Any:
    """(position, line) of each line starting in [start, stop); a line over `limit` bytes is
    `Oversize`, read past in pieces (`record_size.bounded_lines`), as is one under way at `start`."""
    with source.open_binary() as handle:
        position = 0
        if start > 0:
            while position < start - 1:  # streams from remote filesystems cannot seek
                position += len(handle.read(min(1 << 24, start - 1 - position)))
            position += 1
            if handle.read(1) != b"\n":  # the line under way belongs to the previous range
                while piece := handle.readline(PIECE_BYTES):
                    position += len(piece)
                    if piece.endswith(b"\n"):
                        break
        for line in bounded_lines(handle, limit):
            if position >= stop:
                return
            yield position, line
            position += line.size if isinstance(line, Oversize) else len(line)


def plan_slices(sources: list[InputFile], limit: int | None) -> list[Slice]:
    """Cut the inputs into slices and give each its first global record index."""
    import ray

    slices: list[Slice] = []
    index = 0
    for source in sources:
        if source.is_parquet:
            metadata = source.parquet().metadata
            for group in range(metadata.num_row_groups):
                slices.append(_slice(source, "parquet", group, 0, index))
                index += metadata.row_group(group).num_rows
        elif not source.format.splittable:  # JSON, CSV, compressed streams: one task reads it whole
            slices.append(_slice(source, "json", 0, 0, index))
            index += sum(1 for _ in raw_rows(source))
        else:
            bounds = [*range(0, max(source.size, 1), JSONL_RANGE_BYTES), source.size]
            ranges = list(itertools.pairwise(bounds))
            count = ray.remote(_count_range)
            counts = ray.get([count.remote(source.location, source.size, a, b) for a, b in ranges])
            line = 1
            for (start, stop), (records, lines) in zip(ranges, counts, strict=True):
                slices.append(_slice(source, "jsonl", start, stop, index, line))
                index += records
                line += lines
        if limit is not None and index >= limit:
            break
    return slices


def _pickled(raw: Any, index: int) -> tuple[bytes | None, str | None]:
    """A raw record for the actors, or its error: pickle stops near 500 levels of nesting, which
    a JSON line may hold (records.py refuses anything deeper than MAX_NESTING anyway)."""
    try:
        return pickle.dumps(raw), None
    except RecursionError:
        message = f"nested deeper than {MAX_NESTING} levels of arrays and objects"
        return None, str(RecordError(None, None, message, index=index))


def read_slice(
    row: dict[str, Any],
    done: bytes,
    limit: int | None,
    struct_nulls: StructNulls = StructNulls.refuse,
    nested: tuple[str, ...] = RECORD_COLUMNS,
    limits: ReadLimits | None = None,
) -> list[dict[str, Any]]:
    """The records of one slice as rows {record_index, payload, problem, base_dir, cells};
    `nested`: the columns read under `struct_nulls` (a column mapping's state and questions);
    `limits`: the sizes refused unread (`record_size.py`)."""
    limits = limits or ReadLimits()
    piece = Slice(**row)
    source = piece.source()
    base_dir = str(source.base_dir) if source.base_dir is not None else None
    rows = []

    def keep(index: int) -> bool:
        return (limit is None or index < limit) and not (index < len(done) and done[index])

    def add(index: int, raw: Any, problem: str | None) -> None:
        if keep(index):
            payload = None
            if problem is None:
                payload, problem = _pickled(raw, index)
            rows.append(
                {
                    "record_index": index,
                    "payload": payload,
                    "problem": problem,
                    "base_dir": base_dir,
                    "cells": source.format.cells.value,
                }
            )

    index = piece.first_index
    if piece.kind == "parquet":
        records = row_group_rows(source, source.parquet(), piece.part, struct_nulls, nested, limits)
        for record, _ in with_partitions(((record, None) for record in records), source.partitions):
            add(index, record, None)
            index += 1
    elif piece.kind == "json":
        for raw, problem in raw_rows(source, limits=limits):
            add(index, raw, problem)
            index += 1
    else:
        line_number = piece.first_line
        for _, line in _range_lines(source, piece.part, piece.stop, limits.record_bytes):
            for raw, problem in jsonl_record(line, source.name, line_number, limits.record_bytes):
                add(index, raw, problem)
                index += 1
            line_number += 1
    return rows
