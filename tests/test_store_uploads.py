"""A store in a bucket puts each object once (issue 57, "Uploads once" and "Concurrent jobs on one
machine"): a run's `runs/RUN.keys` once per run, however many sync turns meet a claim or a failing
bucket; nothing from a job refused before its first record; and jobs started together on one
machine each take their own cache folder, chosen and locked in one step. Against moto's S3 server
behind the counting proxy (tests/support/s3_proxy.py), with the tiny model where a job must run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clef_cli.errors import ClefError
from clef_cli.locations.uris import LocationProblem
from clef_cli.store.ledger import Ledger
from clef_cli.store.location import remote_location
from clef_cli.store.locks import LockedError, job_locks
from clef_cli.store.remote.manifests import Chain
from clef_cli.store.remote.store import RemoteCheckpoint
from clef_cli.store.remote.sync import Claimed

from .support.helpers import TINY_MODEL, write_jsonl
from .support.remote_stores import FINGERPRINT, commit, key_of, night, open_machine

runner = CliRunner()
BUCKET = "clef-store-uploads"
STORE = f"s3://{BUCKET}/store/"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
COMMON = ["--model", str(TINY_MODEL), "--device", "cpu", "--workers", "0", "--quiet", "--max-length", "4096"]
COMMON += ["--max-batch-size", "2"]


def objects(client) -> dict[str, int]:
    """Every object of the bucket, with its size."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    return {item["Key"]: item["Size"] for page in pages for item in page.get("Contents", [])}


def keys_puts(proxy) -> int:
    """PUTs of a run's keys object (`runs/RUN.keys`) the proxy saw, answered or failed."""
    return proxy.count("PUT", "/store/runs/")


def running(uri: str, cache: Path, numbers: range):
    """A job's store with its run begun and its ledger built (the keys of `numbers`), nothing
    committed yet: a sync after its first commit sends the run's keys with its first segment."""
    writer = open_machine(uri, cache)
    writer.begin_run()
    ledger = Ledger(writer.index, writer.run_seq)
    with writer.index.transaction() as db:
        db.executemany("INSERT INTO temp.job VALUES (?, ?, ?, NULL)", [(n, f"r{n}", key_of(n)) for n in numbers])
    writer.ledger = ledger
    return writer


def turn(writer) -> str:
    """One turn of the sync thread (`Syncer._loop`'s body): what it met."""
    try:
        writer.syncer.sync()
    except Claimed:
        return "claimed"
    except (ClefError, LocationProblem, OSError):
        return "failed"
    return "synced"


# ---------------------------------------------------------------------------- runs/RUN.keys once


def test_a_runs_keys_are_put_once_while_a_claim_holds_the_store_for_several_turns(store_bucket, proxy, tmp_path):
    from clef_cli.store.remote.compaction import claimed

    first = open_machine(STORE, tmp_path / "first")  # the store exists: a prune can claim it
    night(first, range(5), range(5))
    first.close()
    writer = running(STORE, tmp_path / "writer", range(10))
    commit(writer, range(10))
    proxy.clear()
    with claimed(Chain(STORE), "prune"):
        assert [turn(writer) for _ in range(4)] == ["claimed"] * 4
    assert keys_puts(proxy) <= 1  # at most once, before the claim was seen
    assert turn(writer) == "synced"  # the claim ended: the next turn commits
    commit(writer, range(10, 12))
    assert turn(writer) == "synced"
    writer.close()
    assert keys_puts(proxy) == 1
    run = writer.chain.latest().runs[writer.run_id]
    assert run["keys"] == f"runs/{writer.run_id}.keys" and f"store/{run['keys']}" in objects(store_bucket)


def test_a_runs_keys_are_put_once_while_the_bucket_refuses_its_manifests(store_bucket, proxy, tmp_path):
    writer = running(STORE, tmp_path / "writer", range(10))
    commit(writer, range(10))
    proxy.clear()
    proxy.failure_status, proxy.failure_code = 400, "InvalidRequest"  # refused at once, no retries
    proxy.failures[f"PUT /{BUCKET}/store/manifests/"] = 1000
    try:
        assert [turn(writer) for _ in range(4)] == ["failed"] * 4
    finally:
        proxy.failures.clear()
        proxy.failure_status, proxy.failure_code = 503, "SlowDown"
    assert proxy.count("PUT", "/store/manifests/") >= 4  # every turn tried its commit
    assert keys_puts(proxy) == 1
    assert turn(writer) == "synced"  # the bucket answers again
    writer.close()
    assert keys_puts(proxy) == 1
    assert writer.chain.latest().runs[writer.run_id]["keys"] == f"runs/{writer.run_id}.keys"


def test_a_run_with_nothing_new_still_records_its_keys_at_its_end(store_bucket, proxy, tmp_path):
    """The run's record and keys go at a job's end even when it computed nothing (`prune
    --keep-runs` keeps what it used); a turn before that puts nothing."""
    first = open_machine(STORE, tmp_path / "first")
    night(first, range(5), range(5))
    first.close()
    reuser = running(STORE, tmp_path / "reuser", range(5))
    proxy.clear()
    assert turn(reuser) == "synced" and proxy.count("PUT") == 0  # nothing of its own to send yet
    reuser.index.finish_run(reuser.run_id, {"run": 0, "reused": 5})
    reuser.close()
    assert keys_puts(proxy) == 1 and proxy.count("PUT", "/store/manifests/") == 1
    assert reuser.chain.latest().runs[reuser.run_id]["keys"] == f"runs/{reuser.run_id}.keys"


# ---------------------------------------------------------------------------- a refused job puts nothing


def records(path: Path, count: int, start: int = 0) -> Path:
    numbers = range(start, start + count)
    lines = [{"id": f"r{n}", "state": f"ticket {n}: the printer is on fire", "questions": QUESTIONS} for n in numbers]
    return write_jsonl(path, lines)


def test_a_job_the_disk_guard_refuses_leaves_the_bucket_as_it_was(store_bucket, proxy, monkeypatch, tmp_path):
    """Refused after the store opened and the records were keyed, before the first record was
    computed: no keys object, no manifest with its run (the write probe is put and deleted)."""
    from clef_cli.cli import app

    monkeypatch.setenv("CLEF_CACHE_DIR", str(tmp_path / "cache"))
    first = runner.invoke(app, ["score", str(records(tmp_path / "a.jsonl", 2)), "-o", str(tmp_path / "a.parquet"),
                                "--checkpoint", STORE, *COMMON])  # fmt: skip
    assert first.exit_code == 0, first.output
    before = objects(store_bucket)
    real = shutil.disk_usage

    def full(path):  # the cache's disk: 1 KiB free (its spool, planned in, as it is)
        usage = real(path)
        return usage._replace(free=1 << 10) if Path(path).name != "spool" else usage

    monkeypatch.setattr(shutil, "disk_usage", full)
    proxy.clear()
    refused = runner.invoke(app, ["score", str(records(tmp_path / "b.jsonl", 4, start=10)), "-o",
                                  str(tmp_path / "b.parquet"), "--checkpoint", STORE, *COMMON])  # fmt: skip
    assert refused.exit_code == 1, refused.output
    assert "hidden states of this job need" in refused.output
    assert objects(store_bucket) == before
    puts = [path for method, path in proxy.requests if method == "PUT"]
    assert all("/.clef-probe-" in path for path in puts), puts  # only the store's write probe, deleted at once


# ---------------------------------------------------------------------------- jobs started together


def test_jobs_that_chose_the_same_cache_folder_each_lock_their_own(store_bucket, tmp_path):
    """Three openers that looked for a free cache folder at once (all saw the first free): each
    takes the first folder whose lock it gets, and lets it go when done."""
    cache = tmp_path / "cache"
    seen = [remote_location(STORE, cache) for _ in range(3)]
    assert len({location.folder for location in seen}) == 1  # chosen before any was locked
    opened = [RemoteCheckpoint.open_remote(location, FINGERPRINT, sync_every=3600, hold_lock=True) for location in seen]
    folders = [checkpoint.path for checkpoint in opened]
    assert len(set(folders)) == 3 and folders[0] == seen[0].folder
    for checkpoint in opened:
        with pytest.raises(LockedError), job_locks(tmp_path / "x.parquet", checkpoint.path):  # held while open
            pass
        checkpoint.close()
    assert not list((cache / "stores").glob("*.lock"))


def test_a_job_plans_cache_folder_is_locked_when_chosen_and_its_stage_moves_with_it(store_bucket, tmp_path):
    from clef_cli.job.lifecycle import locked_slot
    from clef_cli.job.plan import plan_job
    from clef_cli.job.settings import ScoreSettings

    cache = tmp_path / "cache"
    inputs = records(tmp_path / "in.jsonl", 1)
    named = {"inputs": [inputs], "checkpoint": STORE, "cache_dir": cache, "model": str(TINY_MODEL)}
    plans = [plan_job(ScoreSettings(**named, output=f"s3://{BUCKET}/out/{n}.parquet")) for n in range(3)]
    assert len({plan.store.folder for plan in plans}) == 1  # planning only looks
    chosen = [locked_slot(plan) for plan in plans]
    folders = [moved.store.folder for moved, _ in chosen]
    assert len(set(folders)) == 3
    staged = [moved.store.folder / "upload" / f"{n}.parquet" for n, (moved, _) in enumerate(chosen)]
    assert [moved.output.path for moved, _ in chosen] == staged
    assert [moved.output.upload for moved, _ in chosen] == [f"s3://{BUCKET}/out/{n}.parquet" for n in range(3)]
    for _, lock in reversed(chosen):  # the first made the folders: they go with it when they end empty
        lock.release()
    assert not cache.exists()


@pytest.mark.slow  # three `clef score` processes with the tiny model (about 30 s on a loaded machine)
def test_three_jobs_started_together_on_one_store_and_one_cache_all_finish(store_bucket, proxy, tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "CLEF_"))}
    env |= {key: os.environ[key] for key in os.environ if key.startswith("AWS_")}
    env |= {"CLEF_CACHE_DIR": str(tmp_path / "cache")}
    jobs = []
    for number in range(3):
        inputs = records(tmp_path / f"job{number}.jsonl", 3, start=10 * number)
        argv = [sys.executable, "-m", "clef_cli", "score", str(inputs), "-o", str(tmp_path / f"job{number}.parquet"),
                "--checkpoint", STORE, "--sync-every", "1", *COMMON]  # fmt: skip
        jobs.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True))
    ended = [(job.wait(timeout=600), job.stderr.read()) for job in jobs]  # type: ignore[union-attr]
    assert [code for code, _ in ended] == [0, 0, 0], [err[-2000:] for _, err in ended]
    stores = tmp_path / "cache" / "stores"
    assert len([path for path in stores.iterdir() if path.is_dir()]) == 3  # a folder each
    assert not list(stores.glob("*.lock"))
    from clef_cli.store.opening import open_existing_store
    from clef_cli.store.remote import manifests

    manifests.forget()
    reader = open_existing_store(remote_location(STORE, tmp_path / "reader"), locked=False)
    try:
        latest = reader.chain.known
        assert sum(segment.records for segment in latest.segments.values()) == 9  # each record once
        with reader.index.lock:
            final = reader.index.db.execute("SELECT COUNT(*), COUNT(DISTINCT key) FROM keys WHERE final = 1").fetchone()
        assert final == (9, 9)
        assert len(latest.runs) == 3
    finally:
        reader.close()
