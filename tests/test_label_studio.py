"""The review loop through a real Label Studio: `clef review`'s config and tasks go in with every
prediction accepted (prediction validation switched on, and shown to refuse a bad one), people's
annotations come out in Label Studio's JSON export, and `clef eval --gold` reads it.

Label Studio pins other numpy/pyarrow than clef, so it runs from its own virtual environment:
`$CLEF_LABEL_STUDIO_VENV` (`.ci/label_studio_venv.sh` builds or reuses one and prints its path;
`.ci/run` sets it), else `.ci/ls-venv`. Under CI=true a missing one fails the test instead of
skipping it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.quality.labels.gold import read_gold_rows

from .support.helpers import MEDIA, SAMPLE_DATA, TINY_MODEL
from .support.scored_files import random_records, write_scored

pytestmark = pytest.mark.slow
runner = CliRunner()
REPO = Path(__file__).parent.parent
VENV = Path(os.environ.get("CLEF_LABEL_STUDIO_VENV", REPO / ".ci" / "ls-venv"))
TOKEN = "clef-review-test-token-0123456789"
STARTUP_SECONDS = 900  # a fresh SQLite database runs every migration first (about 3 minutes here)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def label_studio(tmp_path_factory):
    executable = VENV / "bin" / "label-studio"
    if not executable.exists():
        message = f"no Label Studio in {VENV} (CLEF_LABEL_STUDIO_VENV=$(.ci/label_studio_venv.sh) builds one)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    data = tmp_path_factory.mktemp("label-studio")
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update({
        "LABEL_STUDIO_BASE_DATA_DIR": str(data),
        "LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK": "true",
        # Label Studio 1.23 only logs invalid predictions unless this flag is on: make it refuse them.
        "fflag_feat_utc_210_prediction_validation_15082025": "true",
        "LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED": "true",
        "LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT": str(data / "media_root"),
    })  # fmt: skip
    command = [
        str(executable), "start", "--no-browser", "--internal-host", "127.0.0.1", "--port", str(port),
        "--data-dir", str(data), "--username", "reviewer@example.com", "--password", "clef-review-pw",
        "--user-token", TOKEN, "--enable-legacy-api-token",
    ]  # fmt: skip
    log = (data / "server.log").open("wb")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                tail = (data / "server.log").read_text(errors="replace")[-3000:]
                pytest.fail(f"Label Studio did not start (exit {server.poll()}):\n{tail}")
            time.sleep(3)
        yield url, data / "media_root"
    finally:
        with contextlib.suppress(ProcessLookupError):  # a server that did not start has exited already
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    out = tmp_path_factory.mktemp("ls-scored") / "out.parquet"
    result = runner.invoke(app, [
        "score", str(SAMPLE_DATA / "posts.jsonl"), "--questions", str(SAMPLE_DATA / "questions.json"),
        "-o", str(out), "--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--keep-columns", "state",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


def media_review(media_root: Path, tmp_path: Path) -> dict:
    """Tasks whose records show images and audio under the local-files document root."""
    folder = media_root / "posts" / "img"
    folder.mkdir(parents=True)
    for name in ("image_a.png", "image_b.png", "tone_16k_mono.wav"):
        (folder / name).write_bytes((MEDIA / name).read_bytes())
    inputs = [
        {"id": "r000", "state": "two images", "images": ["img/image_a.png", "img/image_b.png"]},
        {"id": "r001", "state": "one sound", "audio": ["img/tone_16k_mono.wav"]},
        {"id": "r002", "state": {"text": "nothing else"}},
    ]
    records = media_root / "posts" / "records.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in inputs))
    scored = write_scored(tmp_path / "media.parquet", random_records(seed=4, n=3))
    tasks, config = tmp_path / "media_tasks.json", tmp_path / "media_config.xml"
    result = runner.invoke(app, ["review", str(scored), "-o", str(tasks), "--config-out", str(config),
                                 "--records", str(records), "--media-root", str(media_root)])  # fmt: skip
    assert result.exit_code == 0, result.output
    return {"config": config.read_text(), "tasks": json.loads(tasks.read_text()), "folder": str(folder)}


def test_review_through_label_studio_and_back(label_studio, scored, tmp_path):
    label_studio, media_root = label_studio
    tasks_path, config_path = tmp_path / "tasks.json", tmp_path / "label_config.xml"
    result = runner.invoke(app, ["review", str(scored), "-o", str(tasks_path), "--config-out", str(config_path)])
    assert result.exit_code == 0, result.output
    tasks = json.loads(tasks_path.read_text())
    order = [task["data"]["id"] for task in tasks]
    assert len(order) == 5
    first, second, third, fourth = order[:4]
    annotations = [  # (record, [(question, label)], cancelled), posted in this order
        [first, [["is_spam", "true"], ["category", "spam"], ["toxicity", "2"]], False],
        [second, [["category", "safe"]], False],
        [second, [["category", "violence"], ["is_spam", "false"]], False],  # newer: wins
        [third, [["toxicity", "3"]], False],
        [third, [["toxicity", "0"]], True],  # newer but cancelled: ignored
        [fourth, [["category", "other"]], True],  # cancelled only: no gold
    ]  # the fifth task gets no annotation: no gold
    expected = {
        first: {"is_spam": "true", "category": "spam", "toxicity": "2"},
        second: {"category": "violence", "is_spam": "false"},
        third: {"toxicity": "3"},
    }
    export = tmp_path / "export.json"
    rating = {  # toxicity (a score question) as a Rating: k stars are level k - 1
        "config": '<View><Text name="state" value="$state"/>'
                  '<Rating name="toxicity" toName="state" maxRating="4"/></View>',
        "tasks": [{"data": task["data"]} for task in tasks],
        "annotations": [[first, "toxicity", 1], [second, "toxicity", 4], [third, "toxicity", 3]],
        "export": str(tmp_path / "rating_export.json"),
    }  # fmt: skip
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "url": label_studio, "token": TOKEN, "config": config_path.read_text(), "tasks": tasks,
        "annotations": annotations, "export": str(export), "media": media_review(media_root, tmp_path),
        "rating": rating,
    }))  # fmt: skip
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    client = Path(__file__).parent / "support" / "label_studio_client.py"
    done = subprocess.run(
        [str(VENV / "bin" / "python"), str(client), str(plan)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["bad_prediction_status"] == "400"
    assert summary["task_count"] == summary["prediction_count"] == len(tasks)
    for task in tasks:
        [stored] = summary["predictions"][task["data"]["id"]]
        [sent] = task["predictions"]
        assert stored["model_version"] == sent["model_version"]
        assert stored["score"] == pytest.approx(sent["score"])
        assert [(r["from_name"], r["value"]) for r in stored["result"]] == [
            (r["from_name"], r["value"]) for r in sent["result"]
        ]
    media = summary["media"]
    assert media["task_count"] == media["prediction_count"] == 3
    expected_media = {"image_a.png", "image_b.png", "tone_16k_mono.wav"}
    assert {url.rsplit("/", 1)[1] for url in media["served"]} == expected_media
    for url, digest in media["served"].items():
        assert digest == hashlib.sha256((MEDIA / url.rsplit("/", 1)[1]).read_bytes()).hexdigest()
    gold = {record_id: {q: str(v) for q, v in labels.items()} for record_id, labels in read_gold_rows(export)[0]}
    assert {k: v for k, v in gold.items() if v} == expected
    metrics = tmp_path / "metrics.json"
    result = runner.invoke(app, ["eval", str(scored), "--gold", str(export), "--json", str(metrics)])
    assert result.exit_code == 0, result.output
    document = json.loads(metrics.read_text())
    assert document["records"] == len(expected)
    answers = {
        row["id"]: {a["question_id"]: a["labels"] for a in row["answers"]} for row in pq.read_table(scored).to_pylist()
    }
    for qid, found in document["questions"].items():
        labelled = [(rid, labels[qid]) for rid, labels in expected.items() if qid in labels]
        hits = []
        for rid, truth in labelled:
            options = answers[rid][qid]
            hits.append(options[int(np.argmax([o["probability"] for o in options]))]["label"] == truth)
        assert found["n"] == len(labelled) and found["accuracy"] == pytest.approx(float(np.mean(hits)))
    rated = {record_id: labels for record_id, labels in read_gold_rows(Path(rating["export"]))[0] if labels}
    assert rated == {first: {"toxicity": 0}, second: {"toxicity": 3}, third: {"toxicity": 2}}
    result = runner.invoke(app, ["eval", str(scored), "--gold", rating["export"], "--json", str(metrics)])
    assert result.exit_code == 0, result.output
    assert json.loads(metrics.read_text())["questions"]["toxicity"]["n"] == 3
    assert sys.modules.get("label_studio_sdk") is None  # the SDK stays in its own environment
