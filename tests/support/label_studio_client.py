"""Drives a real Label Studio through `label-studio-sdk`; run by Label Studio's own Python (its
virtual environment pins other numpy/pyarrow than ours), by tests/test_label_studio.py.

Usage: python label_studio_client.py PLAN.json, where PLAN holds url, token, config (XML text),
tasks (clef review's JSON), annotations ([record id, [[from_name, choice], ...], was_cancelled]
in posting order), export (path), and media: {config, tasks, folder} for a second project whose
tasks show media from a local-files storage on `folder`, and rating: {config, tasks, annotations
([record id, from_name, stars]), export} for a project whose score question is a Rating. Prints a
JSON summary on stdout.
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
import urllib.request

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


def media_project(client: LabelStudio, plan: dict) -> dict:
    """Import tasks with media slots, connect the media folder as local-files storage, and fetch
    every media URL the tasks hold through Label Studio (their SHA-256 by URL)."""
    media = plan["media"]
    project = client.projects.create(title="clef review with media", label_config=media["config"])
    imported = client.projects.import_tasks(id=project.id, request=media["tasks"])
    client.import_storage.local.create(project=project.id, path=media["folder"], title="clef media")
    served = {}
    headers = {"Authorization": f"Token {plan['token']}"}
    for task in media["tasks"]:
        for value in task["data"].values():
            if isinstance(value, str) and value.startswith("/data/local-files/"):
                request = urllib.request.Request(plan["url"] + value, headers=headers)
                with urllib.request.urlopen(request, timeout=30) as response:
                    served[value] = hashlib.sha256(response.read()).hexdigest()
    return {"task_count": imported.task_count, "prediction_count": imported.prediction_count, "served": served}


def rating_project(client: LabelStudio, rating: dict) -> None:
    """A project whose score question is a Rating: post each record's stars, export as JSON."""
    project = client.projects.create(title="clef ratings", label_config=rating["config"])
    client.projects.import_tasks(id=project.id, request=rating["tasks"])
    stored = {t.data["id"]: t for t in client.tasks.list(project=project.id, fields="all")}
    for record_id, name, stars in rating["annotations"]:
        result = [{"from_name": name, "to_name": "state", "type": "rating", "value": {"rating": stars}}]
        client.annotations.create(id=stored[record_id].id, result=result)
    export = b"".join(client.projects.exports.download_sync(project.id, export_type="JSON", download_all_tasks=True))
    with open(rating["export"], "wb") as handle:
        handle.write(export)


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
        "media": media_project(client, plan),
    }
    rating_project(client, plan["rating"])
    print(json.dumps(summary, default=str))


if __name__ == "__main__":
    main()
