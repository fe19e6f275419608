"""Label Studio's JSON export as gold: the most recent non-cancelled annotation per task, tasks
without one are no gold, the format is recognised from the content and can be forced."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.errors import UsageError
from clef_cli.quality.labels.gold import read_gold_rows

from .support.scored_files import random_records, write_scored

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
        {
            "id": 2,
            "data": {"id": "r001"},
            "annotations": [  # the newer one wins
                annotation(2, "2026-01-01T10:00:00Z", {"team": "sales", "urgent": "true"}),
                annotation(3, "2026-01-02T10:00:00Z", {"team": "tech"}),
            ],
        },
        {
            "id": 3,
            "data": {"id": "r002"},
            "annotations": [  # a newer cancelled one does not
                annotation(4, "2026-01-01T10:00:00Z", {"severity": "3"}),
                annotation(5, "2026-01-03T10:00:00Z", {"severity": "0"}, cancelled=True),
            ],
        },
        {
            "id": 4,
            "data": {"id": "r003"},
            "annotations": [  # cancelled only: no gold
                annotation(6, "2026-01-01T10:00:00Z", {"team": "billing"}, cancelled=True),
            ],
        },
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


def rated_task(task_id: int, record_id: str, stars: int | None, when: str = "2026-01-05T10:00:00.000000Z") -> dict:
    """A task as Label Studio 1.23's JSON export writes it, for a config whose score question is a
    `<Rating name="severity" toName="state" maxRating="4"/>` beside a `Choices` question."""
    result = [{"value": {"choices": ["sales"]}, "id": f"c{task_id}", "from_name": "team", "to_name": "state",
               "type": "choices", "origin": "manual"}]  # fmt: skip
    if stars is not None:
        result.append({"value": {"rating": stars}, "id": f"r{task_id}", "from_name": "severity", "to_name": "state",
                       "type": "rating", "origin": "manual"})  # fmt: skip
    annotation = {
        "id": 100 + task_id, "completed_by": 1, "result": result, "was_cancelled": False, "ground_truth": False,
        "created_at": when, "updated_at": when, "draft_created_at": None, "lead_time": 4.2, "prediction": {},
        "result_count": len(result), "unique_id": f"u-{task_id}", "import_id": None, "last_action": None,
        "bulk_created": False, "task": task_id, "project": 3, "updated_by": 1, "parent_prediction": None,
        "parent_annotation": None, "last_created_by": None,
    }  # fmt: skip
    return {
        "id": task_id, "annotations": [annotation], "file_upload": None, "drafts": [], "predictions": [],
        "data": {"id": record_id, "state": f"text of {record_id}", "record_index": task_id, "confidence": 0.5},
        "meta": {}, "created_at": when, "updated_at": when, "inner_id": task_id, "total_annotations": 1,
        "cancelled_annotations": 0, "total_predictions": 0, "comment_count": 0, "unresolved_comment_count": 0,
        "last_comment_updated_at": None, "project": 3, "updated_by": 1, "comment_authors": [],
    }  # fmt: skip


def test_a_rating_of_k_stars_is_score_level_k_minus_1(tmp_path):
    """A score question labelled with Label Studio's Rating: 1 star is level "0", 4 stars "3"
    (an off-by-one reading passes no other test); the labels reach eval as such."""
    stars = {"r000": 1, "r001": 4, "r002": 3, "r003": 2, "r004": None}
    export = tmp_path / "export.json"
    export.write_text(json.dumps([rated_task(n, rid, k) for n, (rid, k) in enumerate(stars.items(), start=1)]))
    rows = dict(read_gold_rows(export)[0])
    assert {rid: labels.get("severity") for rid, labels in rows.items()} == {
        "r000": 0, "r001": 3, "r002": 2, "r003": 1, "r004": None
    }  # fmt: skip
    assert all(labels["team"] == "sales" for labels in rows.values())
    records = [
        (rid, {"severity": p, "team": (0.2, 0.7, 0.1)})
        for rid, p in (
            ("r000", (0.7, 0.1, 0.1, 0.1)),
            ("r001", (0.1, 0.1, 0.1, 0.7)),
            ("r002", (0.1, 0.1, 0.1, 0.7)),
            ("r003", (0.1, 0.7, 0.1, 0.1)),
            ("r004", (0.7, 0.1, 0.1, 0.1)),
        )
    ]  # fmt: skip  (levels 0, 3, 3, 1, 0: right for r000, r001 and r003, wrong for r002)
    scored = write_scored(tmp_path / "s.parquet", records)
    metrics = tmp_path / "m.json"
    result = runner.invoke(app, ["eval", str(scored), "--gold", str(export), "--json", str(metrics)])
    assert result.exit_code == 0, result.output
    severity = json.loads(metrics.read_text())["questions"]["severity"]
    assert severity["n"] == 4 and severity["accuracy"] == pytest.approx(0.75)
