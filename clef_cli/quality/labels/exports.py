"""Labels that people gave in Label Studio or Argilla, read back as gold rows.

Label Studio's JSON export is a list of tasks: `data.id` is the record id and each task's most
recent non-cancelled annotation gives, per `Choices` named after a question id, its label.
Argilla's export is a list of records (or `{"records": [...]}`): `id` is the record id and a
question's gold is its first submitted response. A task or record without one is "no gold".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from clef_cli.errors import UsageError

Row = tuple[str, dict[str, object]]


class GoldFormat(str, Enum):
    auto = "auto"
    table = "table"
    label_studio = "label-studio"
    argilla = "argilla"


def detect(rows: Sequence[Mapping[str, Any]]) -> GoldFormat:
    """Label Studio tasks carry a `data` object and `annotations`/`predictions`; Argilla records a
    `fields` object and `responses`/`suggestions`; anything else is a table of `id` + labels."""
    if not rows:
        return GoldFormat.table
    if all(isinstance(r.get("data"), Mapping) and ("annotations" in r or "predictions" in r) for r in rows):
        return GoldFormat.label_studio
    if all(isinstance(r.get("fields"), Mapping) and ("responses" in r or "suggestions" in r) for r in rows):
        return GoldFormat.argilla
    return GoldFormat.table


def _latest(annotations: Any) -> Mapping[str, Any] | None:
    """The most recent non-cancelled annotation (by updated_at, then created_at, then id)."""
    kept = [a for a in annotations or () if isinstance(a, Mapping) and not a.get("was_cancelled")]
    if not kept:
        return None
    return max(kept, key=lambda a: (str(a.get("updated_at") or a.get("created_at") or ""), a.get("id") or 0))


def _choice(item: Mapping[str, Any]) -> object:
    """A result item's label: the one choice of `choices`, or a `rating` of k stars as level k − 1."""
    value = item.get("value") or {}
    if item.get("type") == "rating" and isinstance(value.get("rating"), (int, float)):
        return int(value["rating"]) - 1
    choices = value.get("choices")
    if isinstance(choices, list) and len(choices) == 1:
        return choices[0]
    return choices if choices else None


def label_studio_rows(path: Path | str, tasks: Sequence[Mapping[str, Any]]) -> list[Row]:
    rows = []
    for number, task in enumerate(tasks, start=1):
        record_id = (task.get("data") or {}).get("id")
        if record_id is None or record_id == "":
            raise UsageError(
                f"gold file {str(path)!r} task {number} (Label Studio id {task.get('id')}): no `data.id` record id"
            )
        annotation = _latest(task.get("annotations"))
        labels: dict[str, object] = {}
        for item in (annotation or {}).get("result") or ():
            if isinstance(item, Mapping) and item.get("from_name") and item.get("type") in ("choices", "rating"):
                labels[str(item["from_name"])] = _choice(item)
        rows.append((str(record_id), labels))
    return rows


def _responses(record: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(question, response) pairs from `{q: [response]}` (Record.to_dict) or a list with
    `question_name` (Record.serialize)."""
    raw = record.get("responses") or {}
    if isinstance(raw, Mapping):
        return [(str(q), r) for q, found in raw.items() for r in found or () if isinstance(r, Mapping)]
    return [(str(r["question_name"]), r) for r in raw if isinstance(r, Mapping) and r.get("question_name")]


def argilla_rows(path: Path | str, records: Sequence[Mapping[str, Any]]) -> list[Row]:
    """A response counts when its `status` is "submitted"; the SDK's `records.to_json` drops that
    status, so there a response counts when the record's `status` is "completed"."""
    rows = []
    for number, record in enumerate(records, start=1):
        record_id = record.get("id")
        if record_id is None or record_id == "":
            raise UsageError(f"gold file {str(path)!r} record {number}: no `id` (the record id clef exported)")
        completed = record.get("status") == "completed"
        labels: dict[str, object] = {}
        for question_id, response in _responses(record):
            status = response.get("status")
            submitted = status == "submitted" if status is not None else completed
            if submitted and question_id not in labels:
                labels[question_id] = response.get("value")
        rows.append((str(record_id), labels))
    return rows


def export_rows(path: Path | str, rows: Sequence[Mapping[str, Any]], format: GoldFormat) -> list[Row] | None:
    """Gold rows of a Label Studio or Argilla export (detected unless `format` says); None for a
    plain table, which gold.py reads itself."""
    found = detect(rows) if format is GoldFormat.auto else format
    if found is GoldFormat.label_studio:
        _check_objects(path, rows, "data", "a Label Studio task")
        return label_studio_rows(path, rows)
    if found is GoldFormat.argilla:
        return argilla_rows(path, rows)
    return None


def _check_objects(path: Path | str, rows: Sequence[Mapping[str, Any]], key: str, what: str) -> None:
    for number, row in enumerate(rows, start=1):
        if not isinstance(row.get(key), Mapping):
            raise UsageError(f"gold file {str(path)!r} row {number}: not {what} (no `{key}` object)")
