"""Drives a real Label Studio through `label-studio-sdk`; run by Label Studio's own Python (its
virtual environment pins other numpy/pyarrow than ours), by tests/test_label_studio.py.

Usage: python label_studio_client.py PLAN.json, where PLAN holds url, token, config (XML text),
tasks (clef review's JSON), annotations ([record id, [[from_name, choice], ...], was_cancelled]
in posting order), export (path). Prints a JSON summary on stdout; fails loudly otherwise.
"""

from __future__ import annotations

import copy
import json
import sys

from label_studio_sdk import LabelStudio
from label_studio_sdk.core.api_error import ApiError


def rejected_bad_prediction(client: LabelStudio, config: str, task: dict) -> str:
    """Prediction validation is on: a choice the config lacks must be refused at import."""
    project = client.projects.create(title="clef negative control", label_config=config)
    bad = copy.deepcopy(task)
    bad["predictions"][0]["result"][0]["value"]["choices"] = ["not-an-option"]
    try:
        client.projects.import_tasks(id=project.id, request=[bad])
    except ApiError as error:
        return str(error.status_code)
    raise SystemExit("Label Studio accepted a prediction outside the config: validation is off")


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as handle:
        plan = json.load(handle)
    client = LabelStudio(base_url=plan["url"], api_key=plan["token"])
    tasks = plan["tasks"]
    refused = rejected_bad_prediction(client, plan["config"], tasks[0])
    project = client.projects.create(title="clef review", label_config=plan["config"])
    imported = client.projects.import_tasks(id=project.id, request=tasks, return_task_ids=True)
    stored = {t.data["id"]: t for t in client.tasks.list(project=project.id, fields="all")}
    predictions = {
        record_id: [{"model_version": p.model_version, "score": p.score, "result": p.result} for p in t.predictions]
        for record_id, t in stored.items()
    }
    for record_id, choices, cancelled in plan["annotations"]:
        result = [
            {"from_name": name, "to_name": "state", "type": "choices", "value": {"choices": [choice]}}
            for name, choice in choices
        ]
        client.annotations.create(id=stored[record_id].id, result=result, was_cancelled=cancelled)
    export = b"".join(client.projects.exports.download_sync(project.id, export_type="JSON", download_all_tasks=True))
    with open(plan["export"], "wb") as handle:
        handle.write(export)
    summary = {
        "task_count": imported.task_count,
        "prediction_count": imported.prediction_count,
        "predictions": predictions,
        "bad_prediction_status": refused,
    }
    print(json.dumps(summary, default=str))


if __name__ == "__main__":
    main()
