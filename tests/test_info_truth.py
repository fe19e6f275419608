"""`clef checkpoint info` tells the same truth of a folder store and of a store in a bucket (issue
56): the same three nights (N records; those and some new; a subset) run into each, then the
runs' lines compared: outputs named as given, "last user of" counting every key a run used,
computed or reused (docs/scoring.md), a finished run's counts said once each; no machine's cache
path in any object of the bucket's store; messages that name `info`'s own argument; a model
mismatch on a bucket store that offers the restart it would accept."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.locations import buckets
from clef_cli.store.remote import manifests

from .support.helpers import TINY_MODEL, write_jsonl

runner = CliRunner()
BUCKET = "clef-info-truth"
STORE = f"s3://{BUCKET}/store/"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
TOO_LONG = {"urgent": {"type": "noul", "instructions": "Urgent? " * 200}}
"""A schema longer than --max-length: its record fails on its way to the model (computed, not forwarded)."""
COMMON = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--max-length", "320", "--max-batch-size", "4"]
FAILS = 9
NIGHTS = [[0, 1, 2, 3, FAILS], range(0, 6), range(1, 3)]
"""Night 1: 5 records (one whose schema is too long); night 2: 4 of those and 2 new; night 3: 2 of the first."""
LAST_USERS = [1, 4, 2]
"""Night 2 used keys 0-5, night 3 keys 1 and 2: night 1 is the last user of its failed record's key only."""


def records(numbers) -> list[dict]:
    return [
        {"id": f"r{n}", "state": f"ticket {n}", "questions": TOO_LONG if n == FAILS else QUESTIONS} for n in numbers
    ]


def on_machine(monkeypatch, tmp_path, number: int) -> None:
    """The next command runs on machine `number`: its own cache folder, nothing else shared."""
    monkeypatch.setenv("CLEF_CACHE_DIR", str(tmp_path / "caches" / f"machine-{number}"))
    buckets.forget()
    manifests.forget()


def nights(monkeypatch, tmp_path, store: str, inputs: list[str], outputs: list[str]) -> None:
    """The three nights, each on its own machine (a folder store's machines share its folder)."""
    for night, (given, output) in enumerate(zip(inputs, outputs, strict=True), start=1):
        on_machine(monkeypatch, tmp_path, night)
        result = runner.invoke(app, ["score", given, "-o", output, "--checkpoint", store, *COMMON])
        assert result.exit_code == (3 if night == 1 else 0), result.output  # night 1: a record failed


def info(store: str) -> list[str]:
    """The runs' lines of `checkpoint info`, each run's id and times taken out (they differ)."""
    result = runner.invoke(app, ["checkpoint", "info", store])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith(("run ", "  inputs:", "  output:"))]
    return [re.sub(r"^run \w+: started .* UTC, finished .* UTC \(", "run: (", line) for line in lines]


def counts_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("run")]


def test_three_nights_read_alike_in_a_folder_store_and_in_a_bucket_store(store_bucket, monkeypatch, tmp_path):
    tables = [
        write_jsonl(tmp_path / f"night-{night}.jsonl", records(numbers)) for night, numbers in enumerate(NIGHTS, 1)
    ]
    folder = str(tmp_path / "store.ckpt")
    local_outputs = [str(tmp_path / f"out-{night}.parquet") for night in (1, 2, 3)]
    nights(monkeypatch, tmp_path, folder, [str(table) for table in tables], local_outputs)
    for table in tables:
        store_bucket.put_object(Bucket=BUCKET, Key=f"in/{table.name}", Body=table.read_bytes())
    remote_inputs = [f"s3://{BUCKET}/in/{table.name}" for table in tables]
    remote_outputs = [f"s3://{BUCKET}/out/night-{night}.parquet" for night in (1, 2, 3)]
    nights(monkeypatch, tmp_path, STORE, remote_inputs, remote_outputs)

    in_folder = info(folder)
    on_machine(monkeypatch, tmp_path, 3)  # the machine that ran night 3 (its cache knows its own run)
    warm = info(STORE)
    on_machine(monkeypatch, tmp_path, 4)  # a machine that never saw the store
    fresh = info(STORE)
    assert counts_lines(in_folder) == counts_lines(warm) == counts_lines(fresh), (in_folder, fresh)
    users = [int(re.search(r"last user of (\d+) key", line)[1]) for line in counts_lines(fresh)]
    assert users == LAST_USERS, fresh
    first = counts_lines(fresh)[0]
    assert "(5 computed (4 through the model, 1 failed on the way), 0 reused," in first, first
    assert "run: (2 computed, 4 reused," in counts_lines(fresh)[1]  # said once: computed is forwarded
    assert [line.split(": ", 1)[1] for line in in_folder if line.startswith("  output:")] == local_outputs
    assert [line.split(": ", 1)[1] for line in fresh if line.startswith("  output:")] == remote_outputs
    assert [line.split(": ", 1)[1] for line in fresh if line.startswith("  inputs:")] == remote_inputs

    caches = str(tmp_path / "caches").encode()
    stored = [item["Key"] for item in store_bucket.list_objects_v2(Bucket=BUCKET, Prefix="store/")["Contents"]]
    assert any(key.startswith("store/manifests/") for key in stored) and any("runs/" in key for key in stored)
    for key in stored:  # every object the store wrote, manifests, runs' keys, segments, read raw
        body = store_bucket.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        assert caches not in body and b"upload/" not in body, key
    latest = max(key for key in stored if key.startswith("store/manifests/"))
    runs = json.loads(store_bucket.get_object(Bucket=BUCKET, Key=latest)["Body"].read())["runs"]
    assert sorted(run["output"] for run in runs.values()) == remote_outputs


def test_info_names_its_own_argument_not_an_option_it_does_not_have(store_bucket, monkeypatch, tmp_path):
    on_machine(monkeypatch, tmp_path, 1)
    store_bucket.put_object(Bucket=BUCKET, Key="tickets/records.jsonl", Body=b"{}\n")
    for uri, words in [
        (f"s3://{BUCKET}/tickets/", f"DIRECTORY s3://{BUCKET}/tickets/ holds objects that are not a clef store"),
        (f"s3://{BUCKET}/empty/", f"DIRECTORY s3://{BUCKET}/empty/ holds no clef store"),
        ("s3:///tickets/", "DIRECTORY 's3:///tickets/': no bucket"),
    ]:
        result = runner.invoke(app, ["checkpoint", "info", uri])
        assert result.exit_code == 2, result.output
        assert words in result.stderr and "--checkpoint" not in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_model_mismatch_on_a_bucket_store_offers_the_restart_it_would_take(store_bucket, tmp_path):
    from clef_cli.store.manifest import CheckpointMismatch

    from .support.remote_stores import OTHER_MODEL, commit, open_machine

    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 3))
    writer.close()
    with pytest.raises(CheckpointMismatch) as refused:
        open_machine(STORE, tmp_path / "b", manifest=OTHER_MODEL)
    message = str(refused.value)
    assert "--restart --confirm-restart" in message and "another store" in message, message


def test_a_fresh_machine_reads_only_the_newest_key_lists_that_name_a_last_user(store_bucket, proxy, tmp_path):
    """Night 2 used every key: night 1's list is not read (the cost of "last user of" on a store
    of many nights is the lists of the nights that were some key's last user, newest first)."""
    from clef_cli.store.remote.last_users import last_users

    from .support.remote_stores import fresh_machine, night, open_machine

    ran = []
    for number, (used, computed) in enumerate([(range(0, 10), range(0, 10)), (range(0, 12), range(10, 12))]):
        writer = open_machine(STORE, tmp_path / f"machine-{number}")
        night(writer, used, computed)
        ran.append(writer.run_id)
        writer.close()
    proxy.clear()
    with fresh_machine(STORE, tmp_path / "fresh") as reader:
        assert last_users(reader) == {ran[1]: 12}
    read = [path for method, path in proxy.requests if method == "GET" and "/runs/" in path]
    assert len(read) == 1 and ran[1] in read[0], read
