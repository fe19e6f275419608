"""Parquet rows as raw records, without letting struct columns change what a record says.

A Parquet struct column has one set of keys for every row: written from records with different
keys (`pa.Table.from_pylist`, pandas), each row gets every key of every record, the missing ones
as null. A row cannot tell "this record has no key `n`" from "this record set `n` to null", and
the two give different prompts (`{"n":null,"text":"hi"}` is not `{"text":"hi"}`; a choice
criterion set to null is an option, a missing one is not). So a null in a struct inside `state`
or `questions` is refused by default (`StructNulls.refuse`); `absent` reads it as a missing key,
`null` as an explicit null. Map and JSON-text columns keep each record's exact keys.

Two levels of `questions` read the same either way and are never refused: a question id that is
null (a null question would be invalid, so the record did not have it), and the fields of a
question object (`type`, `instructions`, `criteria`: null and missing mean the same there).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from clef_cli.choices import Choice
from clef_cli.errors import RecordError

if TYPE_CHECKING:  # pyarrow loads only where Parquet is read (not for `clef --help`)
    import pyarrow as pa

RECORD_COLUMNS = ("state", "questions")
"""The columns whose values make the prompt (media columns are lists, with exact elements)."""
QUESTION_LEVELS = 2
"""Levels of `questions` where a null means the same as a missing key (question ids, question fields)."""


class StructNulls(Choice):
    """What a null inside a Parquet struct column of `state` or `questions` means."""

    refuse = "refuse"
    absent = "absent"
    null = "null"


@dataclass(frozen=True)
class AmbiguousNulls:
    """Stands in for a `state` or `questions` value that its struct column may have changed; the
    record is refused with the first key path (it travels with the raw row, also to Ray workers)."""

    column: str
    paths: tuple[str, ...]

    def error(self, record_id: str) -> RecordError:
        more = f" (and {len(self.paths) - 1} more)" if len(self.paths) > 1 else ""
        return RecordError(
            record_id,
            self.paths[0],
            f"null in the Parquet struct column {self.column!r}{more}: a struct column gives every row the keys "
            "of every record, so this record may not have this key at all, and scoring would change its prompt. "
            f"Store {self.column!r} as JSON text or as a Parquet map, or say what the nulls mean with "
            "--struct-nulls absent (keys the record does not have) or --struct-nulls null (explicit nulls)",
        )


def parquet_rows(
    table: pa.Table | pa.RecordBatch, policy: StructNulls, nested: tuple[str, ...] = RECORD_COLUMNS
) -> list[dict[str, Any]]:
    """The rows of a Parquet batch as dicts; `state` and `questions` (or the columns a mapping
    takes them from, `nested`: state's, questions', then --state-columns) read under `policy`,
    with map values as objects. Other columns are left exactly as pyarrow gives them."""
    rows = table.to_pylist()
    for column in dict.fromkeys(nested):
        if column not in table.schema.names:
            continue
        arrow_type = table.schema.field(column).type
        if not _has_mappings(arrow_type):
            continue
        levels = QUESTION_LEVELS if column == nested[1] else 0
        for row in rows:
            reader = _NestedReader(policy, levels)
            value = reader.read(arrow_type, row[column], column, 0)
            row[column] = AmbiguousNulls(column, tuple(reader.ambiguous)) if reader.ambiguous else value
    return rows


def _has_mappings(arrow_type: pa.DataType) -> bool:
    import pyarrow as pa

    if pa.types.is_struct(arrow_type) or pa.types.is_map(arrow_type):
        return True
    child = _list_value_type(arrow_type)
    return child is not None and _has_mappings(child)


_LIST_KINDS = ("is_list", "is_large_list", "is_fixed_size_list", "is_list_view", "is_large_list_view")


@cache
def _list_tests() -> tuple[Any, ...]:
    import pyarrow as pa

    return tuple(getattr(pa.types, name) for name in _LIST_KINDS if hasattr(pa.types, name))


def _list_value_type(arrow_type: pa.DataType) -> pa.DataType | None:
    return arrow_type.value_type if any(test(arrow_type) for test in _list_tests()) else None


class _NestedReader:
    """Walks one value with its Arrow type; collects the key paths of ambiguous nulls."""

    def __init__(self, policy: StructNulls, exempt_levels: int) -> None:
        self.policy = policy
        self.exempt_levels = exempt_levels
        self.ambiguous: list[str] = []

    def read(self, arrow_type: pa.DataType, value: Any, path: str, level: int) -> Any:
        import pyarrow as pa

        if value is None:
            return None
        if pa.types.is_struct(arrow_type):
            fields = [arrow_type.field(i) for i in range(arrow_type.num_fields)]
            return self._mapping([(f.name, f.type, value.get(f.name)) for f in fields], path, level, ambiguous=True)
        if pa.types.is_map(arrow_type):
            item_type = arrow_type.item_type
            return self._mapping([(key, item_type, item) for key, item in value], path, level, ambiguous=False)
        child = _list_value_type(arrow_type)
        if child is not None:
            return [self.read(child, item, f"{path}[{i}]", level + 1) for i, item in enumerate(value)]
        return value

    def _mapping(self, items: list[tuple[Any, pa.DataType, Any]], path: str, level: int, ambiguous: bool) -> dict:
        """A struct (keys shared by all rows: a null is ambiguous) or a map (this row's own keys)."""
        result: dict[Any, Any] = {}
        for key, item_type, item in items:
            key_path = f"{path}.{key}"
            if item is not None:
                result[key] = self.read(item_type, item, key_path, level + 1)
            elif level < self.exempt_levels:
                continue  # a question id or a question field: null and missing read the same
            elif not ambiguous or self.policy is StructNulls.null:
                result[key] = None
            elif self.policy is StructNulls.refuse:
                self.ambiguous.append(key_path)
        return result
