"""Label Studio's JSON export as gold: the most recent non-cancelled annotation per task, tasks
without one are no gold, the format is recognised from the content and can be forced."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.errors import UsageError
from clef_cli.quality.gold import read_gold_rows

from .scored_files import random_records, write_scored

runner = CliRunner()


def annotation(number: int, when: str, labels: dict[str, str], cancelled: bool = False) -> dict:
    return {
        "id": number, "created_at": when, "updated_at": when, "was_cancelled": cancelled,
        "result": [
            {"from_name": q, "to_name": "state", "type": "choices", "value": {"choices": [v]}}
            for q, v in labels.items()
        ],
    }  # fmt: skip


def export_tasks() -> tuple[list[dict], dict[str, dict[str, str]]]:
    prediction = {"model_version": "m", "score": 0.5, "result": []}
    tasks = [
        {"id": 1, "data": {"id": "r000"}, "annotations": [annotation(1, "2026-01-01T10:00:00Z", {"team": "sales"})]},
        {"id": 2, "data": {"id": "r001"}, "annotations": [  # the newer one wins
            annotation(2, "2026-01-01T10:00:00Z", {"team": "sales", "urgent": "true"}),
            annotation(3, "2026-01-02T10:00:00Z", {"team": "tech"}),
        ]},
        {"id": 3, "data": {"id": "r002"}, "annotations": [  # a newer cancelled one does not
            annotation(4, "2026-01-01T10:00:00Z", {"severity": "3"}),
            annotation(5, "2026-01-03T10:00:00Z", {"severity": "0"}, cancelled=True),
        ]},
        {"id": 4, "data": {"id": "r003"}, "annotations": [  # cancelled only: no gold
            annotation(6, "2026-01-01T10:00:00Z", {"team": "billing"}, cancelled=True),
        ]},
        {"id": 5, "data": {"id": "r004"}, "annotations": [], "predictions": [prediction]},  # never annotated
    ]
    expected = {"r000": {"team": "sales"}, "r001": {"team": "tech"}, "r002": {"severity": "3"}}
    return tasks, expected


def test_label_studio_export_is_gold(tmp_path):
    tasks, expected = export_tasks()
    export = tmp_path / "export.json"
    export.write_text(json.dumps(tasks))
    rows = dict(read_gold_rows(export)[0])
    assert {k: v for k, v in rows.items() if v} == expected
    assert rows["r003"] == {} and rows["r004"] == {}
    jsonl = tmp_path / "export.jsonl"
    jsonl.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    assert read_gold_rows(jsonl)[1] == [] and dict(read_gold_rows(jsonl)[0]) == rows
    scored = write_scored(tmp_path / "s.parquet", random_records(seed=1, n=8))
    metrics = tmp_path / "m.json"
    result = runner.invoke(app, ["eval", str(scored), "--gold", str(export), "--json", str(metrics)])
    assert result.exit_code == 0, result.output
    found = json.loads(metrics.read_text())
    assert found["records"] == 3 and found["questions"]["team"]["n"] == 2


def test_forced_and_broken_exports(tmp_path):
    tasks, _ = export_tasks()
    export = tmp_path / "export.json"
    export.write_text(json.dumps(tasks))
    scored = write_scored(tmp_path / "s.parquet", random_records(seed=1, n=8))
    forced = runner.invoke(app, ["eval", str(scored), "--gold", str(export), "--gold-format", "table"])
    assert forced.exit_code == 2 and "record '1' is not in the scored records" in forced.stderr
    tasks[1]["data"] = {"text": "no id"}
    export.write_text(json.dumps(tasks))
    broken = runner.invoke(app, ["eval", str(scored), "--gold", str(export)])
    assert broken.exit_code == 2 and "task 2 (Label Studio id 2): no `data.id`" in broken.stderr
    table = tmp_path / "gold.jsonl"
    table.write_text(json.dumps({"id": "r000", "labels": {"team": "sales"}}) + "\n")
    wrong = runner.invoke(app, ["eval", str(scored), "--gold", str(table), "--gold-format", "label-studio"])
    assert wrong.exit_code == 2 and "not a Label Studio task" in wrong.stderr


def test_plain_tables_stay_tables(tmp_path):
    path = tmp_path / "gold.json"
    rows = [{"id": "a", "labels": {}}, {"id": "b", "labels": {"team": "sales"}}]
    path.write_text(json.dumps(rows))
    assert read_gold_rows(path)[0] == [(row["id"], row["labels"]) for row in rows]
    path.write_text(json.dumps({"records": [], "settings": {}}))  # an empty Argilla document
    with pytest.raises(UsageError, match="holds no rows"):
        read_gold_rows(path)
