"""What an input table looks like before any row is read: its columns, the `datasets` features
its `huggingface` schema metadata declares (`Image`, `Audio`, `Video`, lists of them), and so
how each record field will be read (`--dry-run` prints it: `images <- photo: datasets Image,
inline bytes`).

A column-mapping mistake is a refusal of the whole run (exit 2, before anything is written):
a mapped column no input has, or a column whose `datasets` features are another kind of media
than the field it is mapped to (a column of `Image` features mapped to `audio`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_cli.errors import UsageError
from clef_cli.inputs.columns import ColumnMapping
from clef_cli.inputs.fields import RECORD_FIELDS
from clef_cli.inputs.readers import raw_rows
from clef_cli.inputs.sources import InputFile, expand_inputs

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
    first_record_only: bool = False
    """JSON input: `columns` are its first record's keys, so a key missing there may be in others."""


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
    """A Parquet file's schema and features; a JSON input's keys of its first record."""
    if source.is_parquet:
        try:
            schema = source.parquet().schema_arrow
        except Exception as error:  # pyarrow raises several types for a damaged file
            raise UsageError(f"{source.location} is not a readable Parquet file: {error}") from None
        columns = {name: str(schema.field(name).type) for name in schema.names}
        return TableShape(source.name, columns, hf_media_features(schema.metadata))
    sampled = source.format.kind not in ("csv", "tsv")  # a CSV's header names every row's columns
    for raw, problem in raw_rows(source):
        if problem is None and isinstance(raw, Mapping):
            return TableShape(source.name, {str(key): _json_kind(value) for key, value in raw.items()}, {}, sampled)
    return TableShape(source.name, {}, {}, sampled)


def _json_kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "text"}.get(type(value), "value")


def check_columns(mapping: ColumnMapping, inputs: Iterable[str | Path]) -> list[TableShape]:
    """Refuse (exit 2) a mapping that names a column an input lacks (JSON inputs: its first
    record), or maps a `datasets` media column to another field; the inputs' shapes."""
    shapes = [table_shape(source) for source in expand_inputs(inputs)]
    for shape in shapes:
        if not shape.columns:
            continue  # an input with no readable record: its records are the errors
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
            if shape.first_record_only:
                lines.append(f"{field} <- {column}: not in the first record (read from each record that has it){hint}")
            else:
                lines.append(f"{field}: no column {column!r}{hint}")
            continue
        lines.append(f"{field} <- {column}: {_reading(field, shape.features.get(column), shape.columns[column])}")
    return lines


def _reading(field: str, feature: str | None, kind: str) -> str:
    if feature is not None:
        return f"datasets {feature}, inline bytes (a path where a cell has no bytes)"
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
