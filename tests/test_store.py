"""The checkpoint as a store keyed by record key: a second night over a grown, edited, shuffled
table runs only the new prompts and writes what a fresh run writes; a media file changed in place
is scored again; duplicates run once; transient failures are retried; info and prune."""

from __future__ import annotations

import functools
import http.server
import json
import random
import re
import shutil
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app

from .support.helpers import MEDIA, TINY_MODEL, assert_same_rows, write_jsonl

runner = CliRunner()
COUNTS = re.compile(
    r"(\d+) run through the model, (\d+) from the checkpoint, (\d+) duplicates? collapsed, (\d+) retried"
)
QUESTIONS = [
    {"urgent": {"type": "noul", "instructions": "Urgent?"}},
    {"team": {"type": "choice", "criteria": {"billing": "Money", "tech": None, "other": None}}},
    {"level": {"type": "score", "criteria": ["low", "mid", "high"]}},
]


def ticket(number: int, text: str | None = None) -> dict:
    return {
        "id": f"t{number:03d}",
        "state": text or f"ticket {number} " + "word " * (2 + number % 9),
        "questions": QUESTIONS[number % 3],
    }


def score(inputs: Path, output: Path, *extra: str):
    result = runner.invoke(
        app,
        ["score", str(inputs), "-o", str(output), "--model", str(TINY_MODEL), "--workers", "0", "--quiet", *extra],
    )
    assert result.exit_code in (0, 3), result.output
    match = COUNTS.search(result.stderr)
    assert match, result.stderr
    return tuple(int(group) for group in match.groups())


def rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def assert_same_output(got: Path, want: Path) -> None:
    """Ids, order, errors, answers exactly; probabilities within the batch-invariance bound."""
    a, b = rows(got), rows(want)
    assert_same_rows(a, b, probability_tolerance=1e-5)
    for x, y in zip(a, b, strict=True):
        assert (x["record_key"], x["error_kind"]) == (y["record_key"], y["error_kind"]), x["id"]


def test_night_two_runs_only_the_new_prompts_and_equals_a_fresh_run(tmp_path):
    store = tmp_path / "store.ckpt"
    night1 = [ticket(number) for number in range(6)] + [{"id": "broken", "state": "x", "questions": {}}]
    first = score(write_jsonl(tmp_path / "n1.jsonl", night1), tmp_path / "n1.parquet", "--checkpoint", str(store))
    assert first == (6, 0, 0, 0)

    night2 = [dict(record) for record in night1]
    night2[3] = ticket(3, "this ticket was edited")  # one edited
    night2 += [ticket(number) for number in (6, 7)]  # two appended
    night2 += [{**ticket(number), "id": f"copy-{number}"} for number in (1, 2)]  # two copies under new ids
    random.Random(7).shuffle(night2)
    inputs = write_jsonl(tmp_path / "n2.jsonl", night2)
    # the oracle, a direct loop over the records' content: new prompts run, the others are reused
    # from the store, later copies collapse
    content = lambda record: json.dumps([record["state"], record["questions"]], sort_keys=True)  # noqa: E731
    valid = [content(record) for record in night2 if record["questions"]]
    before = {content(record) for record in night1 if record["questions"]}
    new, reused = len(set(valid) - before), len(set(valid) & before)
    assert (new, reused) == (3, 5)  # one edited and two appended; five unchanged
    stats = tmp_path / "stats.json"
    counts = score(inputs, tmp_path / "n2.parquet", "--checkpoint", str(store), "--stats-json", str(stats))
    assert counts == (new, reused, len(valid) - len(set(valid)), 0)
    assert json.loads(stats.read_text())["counts"] == {
        "run": new, "forwarded": new, "reused": reused, "duplicates": len(valid) - len(set(valid)), "retried": 0,
        "invalid": len(night2) - len(valid),
    }  # fmt: skip
    assert score(inputs, tmp_path / "fresh.parquet") == (new + reused, 0, 2, 0)
    assert_same_output(tmp_path / "n2.parquet", tmp_path / "fresh.parquet")
    output = {row["id"]: row for row in rows(tmp_path / "n2.parquet")}
    assert output["broken"]["error_kind"] == "invalid" and output["broken"]["record_key"] is None
    assert output["copy-1"]["answers"] == output["t001"]["answers"]
    assert output["copy-1"]["record_key"] == output["t001"]["record_key"]
    metadata = pq.read_schema(tmp_path / "n2.parquet").metadata
    assert metadata[b"clef.records_reused"] == b"5" and metadata[b"clef.records_duplicates"] == b"2"
    # a third night over the same table computes nothing
    assert score(inputs, tmp_path / "n3.parquet", "--checkpoint", str(store)) == (0, new + reused, 2, 0)
    assert_same_output(tmp_path / "n3.parquet", tmp_path / "fresh.parquet")


def test_a_media_file_changed_in_place_is_scored_again(tmp_path):
    shutil.copy(MEDIA / "image_a.png", tmp_path / "photo.png")
    records = [ticket(0), {**ticket(1), "images": ["photo.png"]}]
    inputs = write_jsonl(tmp_path / "in.jsonl", records)
    store = str(tmp_path / "store.ckpt")
    assert score(inputs, tmp_path / "a.parquet", "--checkpoint", store) == (2, 0, 0, 0)
    shutil.copy(MEDIA / "image_b.png", tmp_path / "photo.png")  # same path, other bytes
    assert score(inputs, tmp_path / "b.parquet", "--checkpoint", store) == (1, 1, 0, 0)
    assert score(inputs, tmp_path / "fresh.parquet") == (2, 0, 0, 0)
    assert_same_output(tmp_path / "b.parquet", tmp_path / "fresh.parquet")
    assert rows(tmp_path / "a.parquet")[1]["record_key"] != rows(tmp_path / "b.parquet")[1]["record_key"]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.slow  # three jobs and an HTTP server
def test_a_transient_failure_is_retried_on_the_next_run(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(MEDIA / "image_a.png", served / "photo.png")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(served)))
    url = f"http://127.0.0.1:{server.server_address[1]}/photo.png"
    inputs = write_jsonl(tmp_path / "in.jsonl", [ticket(0), {**ticket(1), "images": [url]}])
    store = str(tmp_path / "store.ckpt")
    remote = ("--allow-remote-media", "--allow-private-media-hosts", "--checkpoint", store)
    server.server_close()  # night 1: the server is down, the fetch fails
    assert score(inputs, tmp_path / "a.parquet", *remote) == (1, 0, 0, 0)
    failed = rows(tmp_path / "a.parquet")[1]
    assert failed["error_kind"] == "transient" and "cannot fetch" in failed["error"]
    server = http.server.ThreadingHTTPServer(server.server_address, functools.partial(_Quiet, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        # run again: its key now hashes the fetched bytes (night 1 keyed the failed fetch), so it is new
        assert score(inputs, tmp_path / "b.parquet", *remote) == (1, 1, 0, 0)
        fresh = ("--allow-remote-media", "--allow-private-media-hosts")
        assert score(inputs, tmp_path / "fresh.parquet", *fresh) == (2, 0, 0, 0)
    finally:
        server.shutdown()
        server.server_close()
    assert_same_output(tmp_path / "b.parquet", tmp_path / "fresh.parquet")
    assert rows(tmp_path / "b.parquet")[1]["error"] is None


def test_error_kinds(tmp_path):
    records = [
        ticket(0),
        {"id": "no-questions", "state": "x", "questions": {}},
        {**ticket(1), "images": ["missing.png"]},
        {**ticket(2), "state": "word " * 400},
    ]
    inputs = write_jsonl(tmp_path / "in.jsonl", records)
    score(inputs, tmp_path / "out.parquet", "--max-length", "300", "--on-overflow", "error")
    kinds = {row["id"]: row["error_kind"] for row in rows(tmp_path / "out.parquet")}
    assert kinds == {"t000": None, "no-questions": "invalid", "t001": "media", "t002": "overflow"}


@pytest.mark.slow  # four jobs
def test_info_and_prune_keep_what_recent_runs_used(tmp_path):
    store = tmp_path / "store.ckpt"
    old = write_jsonl(tmp_path / "old.jsonl", [ticket(number) for number in range(4)])
    new = write_jsonl(tmp_path / "new.jsonl", [ticket(number) for number in range(2, 6)])
    assert score(old, tmp_path / "old.parquet", "--checkpoint", str(store)) == (4, 0, 0, 0)
    assert score(new, tmp_path / "new.parquet", "--checkpoint", str(store)) == (2, 2, 0, 0)
    info = json.loads(runner.invoke(app, ["checkpoint", "info", str(store), "--json"]).stdout)
    assert info["keys"] == 6 and len(info["runs"]) == 2
    assert info["hidden_bytes"] > 0 and info["results_bytes"] > 0
    assert info["runs"][1]["counts"]["reused"] == 2
    pruned = runner.invoke(app, ["checkpoint", "prune", str(store), "--keep-runs", "1"])
    assert pruned.exit_code == 0, pruned.output
    assert "dropped 2 of 6 keys" in pruned.stdout  # tickets 0 and 1: only the first run used them
    after = json.loads(runner.invoke(app, ["checkpoint", "info", str(store), "--json"]).stdout)
    assert after["keys"] == 4 and after["size_bytes"] < info["size_bytes"]
    assert score(new, tmp_path / "again.parquet", "--checkpoint", str(store)) == (0, 4, 0, 0)
    assert_same_output(tmp_path / "again.parquet", tmp_path / "new.parquet")
    assert score(old, tmp_path / "old2.parquet", "--checkpoint", str(store)) == (2, 2, 0, 0)
    assert_same_output(tmp_path / "old2.parquet", tmp_path / "old.parquet")


def test_train_head_reaches_stored_states_through_record_key(tmp_path):
    from clef_cli.quality.train.job import gold_examples
    from clef_cli.store.checkpoint import Checkpoint

    store = tmp_path / "store.ckpt"
    assert score(write_jsonl(tmp_path / "a.jsonl", [ticket(n) for n in range(3)]), tmp_path / "a.parquet",
                 "--checkpoint", str(store)) == (3, 0, 0, 0)  # fmt: skip
    renamed = write_jsonl(tmp_path / "b.jsonl", [{**ticket(n), "id": f"renamed-{n}"} for n in range(3)])
    assert score(renamed, tmp_path / "b.parquet", "--checkpoint", str(store)) == (0, 3, 0, 0)
    gold = write_jsonl(tmp_path / "gold.jsonl", [{"id": "renamed-1", "labels": {"team": "tech"}}])
    checkpoint = Checkpoint.open_existing(store)
    try:
        reader = checkpoint.hidden_reader()
        assert gold_examples(reader, gold, checkpoint=checkpoint)[0] == []  # the states are stored under t001
        examples, _ = gold_examples(reader, gold, checkpoint=checkpoint, scored=tmp_path / "b.parquet")
    finally:
        checkpoint.close()
    assert [example.stored.id for example in examples] == ["t001"]
    assert examples[0].targets == (sorted(["billing", "tech", "other"]).index("tech"),)


def test_a_lost_or_damaged_key_index_is_rebuilt_from_the_journal(tmp_path):
    inputs = write_jsonl(tmp_path / "in.jsonl", [ticket(n) for n in range(3)])
    store = tmp_path / "store.ckpt"
    assert score(inputs, tmp_path / "a.parquet", "--checkpoint", str(store)) == (3, 0, 0, 0)
    for path in store.glob("keys.sqlite*"):
        path.unlink()
    assert score(inputs, tmp_path / "b.parquet", "--checkpoint", str(store)) == (0, 3, 0, 0)
    (store / "keys.sqlite").write_bytes(b"not a database" * 100)
    assert score(inputs, tmp_path / "c.parquet", "--checkpoint", str(store)) == (0, 3, 0, 0)
    assert_same_output(tmp_path / "c.parquet", tmp_path / "a.parquet")


def test_a_rerun_for_hidden_states_that_runs_out_of_memory_keeps_the_stored_result(tmp_path, scorer, monkeypatch):
    """Night 1 stores final results without states (`drop`); night 2 asks for them (`keep`), so
    every record runs again, and the long one runs out of memory even alone: its new row is a
    transient error. The store keeps the final result it had: the output shows it, not the
    error, and the store still counts every key."""
    import torch

    from clef_cli.engines.local.pipeline import ScoreJob
    from clef_cli.store.key_index import KeyIndex

    from .support.helpers import settings_for

    records = [ticket(number) for number in range(5)] + [{**ticket(5), "state": "a long ticket " * 120}]
    inputs = write_jsonl(tmp_path / "in.jsonl", records)
    store = tmp_path / "store.ckpt"
    common = dict(inputs=[inputs], checkpoint=store)
    ScoreJob(settings_for(tmp_path, name="a.parquet", hidden_states="drop", **common), scorer=scorer).run()
    real = scorer.backbone.hidden_states
    failed = []

    def out_of_memory_on_the_long_one(batch, *args, **kwargs):
        if batch.input_ids.shape[-1] > 300:
            failed.append(batch.input_ids.shape[0])
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(batch, *args, **kwargs)

    monkeypatch.setattr(scorer.backbone, "hidden_states", out_of_memory_on_the_long_one)
    ScoreJob(settings_for(tmp_path, name="b.parquet", hidden_states="keep", **common), scorer=scorer).run()
    assert failed and failed[-1] == 1  # it ran out of memory alone: a transient result was committed
    night1, night2 = rows(tmp_path / "a.parquet"), rows(tmp_path / "b.parquet")
    assert [row["error_kind"] for row in night2] == [None] * len(records)
    assert_same_rows(night2, night1, probability_tolerance=1e-5)
    index = KeyIndex(store / "keys.sqlite")
    try:
        assert index.count() == len(records)
    finally:
        index.close()
