"""Which input columns a record's fields come from: `--columns FIELD=COLUMN,...` and
`--state-columns COL,...`.

A table as people have it names its columns its own way (a ticket export's `ticket_id`, `body`,
`attachments`). The mapping renames them to the record's fields before validation, so a mapped
row is read exactly as a row that had those names; `--state-columns` makes the state a JSON
object of the named columns keyed by column name (it renders with sorted keys, as every JSON
state does). Pure: no file is read here (inputs/table_shape.py checks the names against the
inputs before a run writes anything).

The mapping is not part of a record's key: the key hashes the prompt the mapping produced (its
state, questions and media), so a mapped record whose prompt equals a plain record's is the same
prompt and shares its key and stored result (store/record_key.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clef_cli.errors import RecordError, UsageError
from clef_cli.inputs.fields import RECORD_FIELDS
from clef_cli.inputs.parquet_rows import AmbiguousNulls
from clef_cli.inputs.record_size import OversizeCell


@dataclass(frozen=True)
class ColumnMapping:
    """Field -> input column pairs, and the columns a state is built from."""

    fields: tuple[tuple[str, str], ...] = ()
    state_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for name, column in self.fields:
            if name not in RECORD_FIELDS:
                raise UsageError(f"--columns: unknown field {name!r} (the fields are {', '.join(RECORD_FIELDS)})")
            if not column:
                raise UsageError(f"--columns: {name}= names no column")
            if name in seen:
                raise UsageError(f"--columns: field {name!r} is mapped twice ({seen[name]!r} and {column!r})")
            seen[name] = column
        if self.state_columns and "state" in seen:
            raise UsageError("--state-columns builds the state, so it does not go with --columns state=...")
        if len(set(self.state_columns)) < len(self.state_columns):
            raise UsageError("--state-columns: a column is named twice")

    def __bool__(self) -> bool:
        return bool(self.fields or self.state_columns)

    def source_of(self, name: str) -> str:
        """The input column field `name` is read from (its own name when not mapped)."""
        return dict(self.fields).get(name, name)

    @property
    def columns(self) -> tuple[str, ...]:
        """Every input column the mapping names, in the order given."""
        return tuple(dict.fromkeys([column for _, column in self.fields] + list(self.state_columns)))

    @property
    def nested_columns(self) -> tuple[str, ...]:
        """The input columns whose values become the state or the questions (read under
        --struct-nulls when they are Parquet struct columns)."""
        return (self.source_of("state"), self.source_of("questions"), *self.state_columns)

    def apply(self, raw: Mapping[str, Any], record_id: str) -> dict[str, Any]:
        """The row with the record's fields taken from their columns; a field whose column this
        row does not have is missing (a JSONL line without that key). `record_id`: the id its
        errors name (records.py reads it first, from `source_of("id")`)."""
        row = dict(raw)
        for name, column in self.fields:
            if column in raw:
                row[name] = raw[column]
            else:
                row.pop(name, None)
        if self.state_columns:
            missing = [column for column in self.state_columns if column not in raw]
            if missing:
                message = f"no column {missing[0]!r} in this record (--state-columns)"
                raise RecordError(record_id, "state", message)
            state = {column: raw[column] for column in self.state_columns}
            refused = [value for value in state.values() if isinstance(value, (AmbiguousNulls, OversizeCell))]
            row["state"] = refused[0] if refused else state  # a struct column's nulls, a cell too large: as for state
        return row

    def as_metadata(self) -> str:
        """The output's `clef.columns`: field -> column, and the state's columns."""
        return json.dumps({"fields": dict(self.fields), "state_columns": list(self.state_columns)}, ensure_ascii=False)


def mapping_from_metadata(text: str | None) -> ColumnMapping | None:
    """The mapping an output's `clef.columns` records (None: the run had none)."""
    if not text:
        return None
    found = json.loads(text)
    return ColumnMapping(tuple(found.get("fields", {}).items()), tuple(found.get("state_columns", ())))


def parse_columns(columns: str | None, state_columns: str | None) -> ColumnMapping | None:
    """`--columns` and `--state-columns` as given on the command line (None: neither)."""
    for option, text, example in (("--columns", columns, "id=ticket_id"), ("--state-columns", state_columns, "a,b")):
        if text is not None and not _items(text):  # given, but names nothing: never read as no mapping
            raise UsageError(f"{option} {text!r} names no column; give them, like {option} {example}")
    pairs: list[tuple[str, str]] = []
    for part in _items(columns):
        name, sep, column = part.partition("=")
        if not sep:
            raise UsageError(f"--columns: {part!r} is not FIELD=COLUMN")
        pairs.append((name.strip(), column.strip()))
    mapping = ColumnMapping(tuple(pairs), tuple(_items(state_columns)))
    return mapping or None


def _items(text: str | None) -> list[str]:
    return [item.strip() for item in (text or "").split(",") if item.strip()]
