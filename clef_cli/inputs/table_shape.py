"""What an input table looks like before any row is read: its columns, the `datasets` features
its `huggingface` schema metadata declares (`Image`, `Audio`, `Video`, lists of them), and so
how each record field will be read (`--dry-run` prints it: `images <- photo: datasets Image,
inline bytes`).

A column-mapping mistake is a refusal of the whole run (exit 2, before anything is written):
a mapped column no input has, or a column whose `datasets` features are another kind of media
than the field it is mapped to (a column of `Image` features mapped to `audio`).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from clef_cli.errors import UsageError
from clef_cli.inputs.columns import ColumnMapping
from clef_cli.inputs.fields import RECORD_FIELDS
from clef_cli.inputs.first_window import FIRST_WINDOW
from clef_cli.inputs.formats import Cells
from clef_cli.inputs.readers import parquet_schema, raw_rows
from clef_cli.inputs.sources import InputFile, InputLike, expand_inputs

MEDIA_FEATURES = {"Image": "images", "Audio": "audio", "Video": "videos"}
"""A `datasets` media feature's `_type`, and the record field it belongs in."""
LIST_FEATURES = ("List", "Sequence", "LargeList")


@dataclass(frozen=True)
class TableShape:
    """One input's columns: name -> how its cells read (an Arrow type, or a `datasets` feature)."""

    name: str
    columns: dict[str, str]
    features: dict[str, str]
    """Column -> `datasets` media feature (`Image`, `list of Audio`), from the file's metadata."""
    sampled: bool = False
    """A JSON input longer than the records read: `columns` are the keys of its first
    `FIRST_WINDOW` records, so a key missing there may be in later ones."""
    cells: Cells = Cells.typed


def hf_media_features(metadata: Mapping[bytes, bytes] | None) -> dict[str, str]:
    """Column -> `Image` / `Audio` / `Video` (or `list of Image`...) from `huggingface` metadata."""
    try:
        features = json.loads((metadata or {}).get(b"huggingface", b"{}"))["info"]["features"]
    except (ValueError, KeyError, TypeError):
        return {}
    found = {}
    for column, feature in features.items() if isinstance(features, Mapping) else ():
        kind = _media_kind(feature)
        if kind is not None:
            found[column] = kind
    return found


def _media_kind(feature: Any) -> str | None:
    if isinstance(feature, list) and len(feature) == 1:  # datasets' older list spelling: [Image()]
        inner = _media_kind(feature[0])
        return None if inner is None or inner.startswith("list") else f"list of {inner}"
    if not isinstance(feature, Mapping):
        return None
    kind = feature.get("_type")
    if kind in MEDIA_FEATURES:
        return str(kind)
    if kind in LIST_FEATURES:
        inner = _media_kind(feature.get("feature"))
        return None if inner is None or inner.startswith("list") else f"list of {inner}"
    return None


def table_shape(source: InputFile) -> TableShape:
    """A Parquet file's schema (with its Hive partition keys, columns like any other) and
    features; a JSON input's keys of its first record."""
    if source.is_parquet:
        try:
            schema = parquet_schema(source)
        except Exception as error:  # pyarrow raises several types for a damaged file
            raise UsageError(f"{source.path_given} is not a readable Parquet file: {error}") from None
        columns = {name: str(schema.field(name).type) for name in schema.names}
        return TableShape(source.path_given, columns, hf_media_features(schema.metadata))
    cells = source.format.cells
    columns: dict[str, str] = {}
    rows = raw_rows(source)
    for raw, problem in itertools.islice(rows, 1 if cells is Cells.text else FIRST_WINDOW):
        if problem is None and isinstance(raw, Mapping):  # a CSV's header names every row's columns
            for key, value in raw.items():
                if columns.get(str(key), "null") == "null":  # the kind of its first value that is not null
                    columns[str(key)] = _json_kind(value)
    sampled = cells is not Cells.text and next(rows, None) is not None
    return TableShape(source.path_given, columns, {}, sampled, cells)


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "text"}.get(type(value), "value")


def check_columns(mapping: ColumnMapping, inputs: Iterable[InputLike]) -> list[TableShape]:
    """Refuse (exit 2) a mapping that names a column an input lacks, or maps a `datasets` media
    column to another field; the inputs' shapes. A table's columns (a Parquet schema, a CSV
    header) are every row's, so each table must have the column. A JSON record may lack a key
    others have (an optional attachment): a column is refused there only when no record of the
    JSON inputs has it, known when they were read whole; however the records are ordered or
    split into files, the answer is the same (first_window warns of one the window lacks)."""
    shapes = [table_shape(source) for source in expand_inputs(inputs)]
    for shape in shapes:
        if shape.columns and shape.cells is not Cells.values:  # none: its records are the errors
            for column in mapping.columns:
                if column not in shape.columns:
                    raise UsageError(
                        f"no column {column!r} in {shape.name} (mapped by --columns/--state-columns); "
                        f"its columns: {', '.join(shape.columns) or 'none'}"
                    )
        for field, column in mapping.fields:
            feature = shape.features.get(column, "")
            belongs = MEDIA_FEATURES.get(feature.removeprefix("list of "))
            if belongs is not None and belongs != field:
                raise UsageError(f"column {column!r} of {shape.name} holds datasets {feature} features, not {field}")
    documents = [shape for shape in shapes if shape.cells is Cells.values and shape.columns]
    if documents and not any(shape.sampled for shape in documents):
        keys = {key: None for shape in documents for key in shape.columns}
        names = ", ".join(shape.name for shape in documents[:3]) + (", ..." if len(documents) > 3 else "")
        for column in mapping.columns:
            if column not in keys:
                raise UsageError(
                    f"no column {column!r} in {names}: no record has it (mapped by --columns/--state-columns); "
                    f"their columns: {', '.join(keys)}"
                )
    return shapes


def field_sources(mapping: ColumnMapping | None, shape: TableShape) -> list[str]:
    """One line per record field: the column it comes from and how its cells are read."""
    mapping = mapping or ColumnMapping()
    lines = []
    for field in RECORD_FIELDS:
        if field == "state" and mapping.state_columns:
            lines.append(f"state <- {', '.join(mapping.state_columns)}: a JSON object keyed by column name")
            continue
        column = mapping.source_of(field)
        if column not in shape.columns:
            hint = " (the --questions file, if given)" if field == "questions" else ""
            if shape.sampled:
                lines.append(
                    f"{field} <- {column}: not in the first {FIRST_WINDOW} records (read from each record that has "
                    f"it){hint}"
                )
            else:
                lines.append(f"{field}: no column {column!r}{hint}")
            continue
        feature, kind = shape.features.get(column), shape.columns[column]
        lines.append(f"{field} <- {column}: {_reading(field, feature, kind, shape.cells)}")
    return lines


def _reading(field: str, feature: str | None, kind: str, cells: Cells = Cells.typed) -> str:
    if feature is not None:
        return f"datasets {feature}, inline bytes (a path where a cell has no bytes)"
    if cells is Cells.text and field in ("state", "questions", "images", "audio", "videos"):
        return {
            "state": "text (JSON object or array text read as JSON)",
            "questions": "text (JSON text; an empty cell: none of its own)",
        }.get(field, "text: a location, or a JSON list of them (an empty cell: none)")
    if field in ("images", "audio", "videos"):
        if kind in ("binary", "large_binary") or kind.startswith("fixed_size_binary"):
            return "binary, inline bytes, one a cell"
        if "struct<array" in kind or "struct<sampling_rate" in kind:
            return "decoded samples {array, sampling_rate}"
        if "binary" in kind:
            return f"{kind}: inline bytes"
        return f"{kind}: locations (paths, URIs, data: URLs)"
    if field == "state" and kind in ("string", "large_string"):
        return f"{kind} (JSON object or array text read as JSON)"
    if field == "questions" and kind in ("string", "large_string"):
        return f"{kind} (JSON text)"
    return kind
