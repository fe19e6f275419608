"""Nothing piles up on a machine that keeps its cache (issue 56, "Nothing piles up"): a remote
`-o` staged locally goes once it is uploaded, a dead process's lock goes with the next run, a
command that writes nothing leaves no empty folder, and `checkpoint prune --cache-dir` prunes the
machine's cache folder of a bucket store. Against moto's S3 server behind the counting proxy,
with the tiny model."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clef_cli.cli import app

from .support.helpers import TINY_MODEL, write_jsonl

runner = CliRunner()
BUCKET = "clef-cache-hygiene"
STORE = f"s3://{BUCKET}/store/"
OUTPUT = f"s3://{BUCKET}/out/night.parquet"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
COMMON = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--max-length", "4096", "--max-batch-size", "2"]


@pytest.fixture
def cache(store_bucket, monkeypatch, tmp_path) -> Path:
    """This machine's cache root (CLEF_CACHE_DIR), not made yet."""
    root = tmp_path / "cache"
    monkeypatch.setenv("CLEF_CACHE_DIR", str(root))
    return root


def records(path: Path, count: int = 2, start: int = 0) -> Path:
    numbers = range(start, start + count)
    lines = [{"id": f"r{n}", "state": f"ticket {n}: the printer is on fire", "questions": QUESTIONS} for n in numbers]
    return write_jsonl(path, lines)


def score(*args: object):
    return runner.invoke(app, ["score", *map(str, args), *COMMON])


def tree(root: Path) -> list[str]:
    """Every file and folder under `root`, relative (empty when `root` is missing)."""
    return sorted(str(path.relative_to(root)) for path in root.rglob("*")) if root.exists() else []


def empty_folders(root: Path) -> list[str]:
    return [str(path.relative_to(root)) for path in root.rglob("*") if path.is_dir() and not any(path.iterdir())]


def objects(client, prefix: str = "") -> list[str]:
    return [item["Key"] for item in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


# ---------------------------------------------------------------------------- staged outputs


def test_an_uploaded_output_leaves_no_staged_copy_in_the_bucket_stores_cache(cache, store_bucket, tmp_path):
    result = score(records(tmp_path / "in.jsonl"), "-o", OUTPUT, "--checkpoint", STORE)
    assert result.exit_code == 0, result.output
    assert "out/night.parquet" in objects(store_bucket, "out/")
    assert not [name for name in tree(cache) if name.endswith((".parquet", ".lock"))], tree(cache)
    assert not [name for name in tree(cache) if name.endswith("/upload")], tree(cache)
    assert empty_folders(cache) == []


def test_an_uploaded_output_leaves_no_staged_copy_in_a_local_checkpoint(cache, store_bucket, tmp_path):
    checkpoint = tmp_path / "night.ckpt"
    result = score(records(tmp_path / "in.jsonl"), "-o", OUTPUT, "--checkpoint", checkpoint)
    assert result.exit_code == 0, result.output
    assert "out/night.parquet" in objects(store_bucket, "out/")
    assert not (checkpoint / "upload").exists(), tree(checkpoint)
    assert not list(tmp_path.glob("*.lock")), tree(tmp_path)


def test_keep_staged_output_keeps_the_local_copy(cache, store_bucket, tmp_path):
    result = score(records(tmp_path / "in.jsonl"), "-o", OUTPUT, "--checkpoint", STORE, "--keep-staged-output")
    assert result.exit_code == 0, result.output
    staged = [name for name in tree(cache) if name.endswith("upload/night.parquet")]
    assert len(staged) == 1, tree(cache)
    assert (cache / staged[0]).read_bytes() == store_bucket.get_object(Bucket=BUCKET, Key="out/night.parquet")[
        "Body"
    ].read()


def test_a_failed_upload_keeps_the_staged_copy_and_says_where(cache, store_bucket, proxy, tmp_path):
    proxy.failure_status, proxy.failure_code = 403, "AccessDenied"
    proxy.failures[f"PUT /{BUCKET}/out/night.parquet"] = 10  # the upload, not the probe beside it
    try:
        result = score(records(tmp_path / "in.jsonl"), "-o", OUTPUT, "--checkpoint", STORE)
    finally:
        proxy.failures.clear()
        proxy.failure_status, proxy.failure_code = 503, "SlowDown"
    assert result.exit_code == 1, result.output
    assert objects(store_bucket, "out/") == []
    staged = [name for name in tree(cache) if name.endswith("upload/night.parquet")]
    assert len(staged) == 1, tree(cache)
    assert str(cache / staged[0]) in result.stderr.replace("\n", ""), result.stderr
    rerun = score(records(tmp_path / "in.jsonl"), "-o", OUTPUT, "--checkpoint", STORE)
    assert rerun.exit_code == 0, rerun.output
    assert "out/night.parquet" in objects(store_bucket, "out/")
    assert not [name for name in tree(cache) if name.endswith(".parquet")], tree(cache)


# ---------------------------------------------------------------------------- no empty folders


def test_commands_that_write_nothing_leave_the_cache_dir_as_it_was(cache, store_bucket, tmp_path):
    local = records(tmp_path / "in.jsonl")
    refusals = [
        ["score", local, "-o", tmp_path / "o.parquet", "--checkpoint", STORE, "--restart", *COMMON],
        ["score", local, "-o", tmp_path / "o.parquet", "--checkpoint", "s3://no-such-bucket-here/store/", *COMMON],
        ["score", tmp_path / "missing.jsonl", "-o", OUTPUT, "--checkpoint", STORE, *COMMON],
        ["checkpoint", "info", STORE],
        ["checkpoint", "info", f"s3://{BUCKET}/elsewhere/"],
        ["checkpoint", "prune", STORE, "--keep-runs", "1"],
    ]
    for args in refusals:
        result = runner.invoke(app, [*map(str, args)])
        assert result.exit_code in (1, 2), (args, result.output)
        assert tree(cache) == [], (args, tree(cache))
    dry = runner.invoke(app, ["score", str(local), "-o", OUTPUT, "--checkpoint", STORE, "--dry-run", *COMMON])
    assert dry.exit_code == 0, dry.output
    assert tree(cache) == [], tree(cache)
    assert objects(store_bucket) == []


# ---------------------------------------------------------------------------- stale locks


def gone_pid() -> int:
    """The pid of a process of this host that has ended (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def planted_lock(path: Path, pid: int, host: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(), "started": time.time() - 86400}))
    return path


def test_a_dead_processes_lock_goes_with_the_next_run_a_live_ones_and_another_hosts_stay(cache, tmp_path):
    from clef_cli.store.remote.layout import cache_folder

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        out = tmp_path / "out"
        dead = [planted_lock(out / "night-1.parquet.lock", gone_pid())]
        dead.append(planted_lock(out / "night-1.parquet.ckpt.lock", gone_pid()))
        second_slot = cache_folder(STORE, cache, 2)
        dead.append(planted_lock(second_slot.with_name(second_slot.name + ".lock"), gone_pid()))
        kept = [planted_lock(out / "night-2.parquet.lock", live.pid)]
        kept.append(planted_lock(out / "night-3.parquet.lock", gone_pid(), host="another-machine"))
        kept.append(planted_lock(out / "night-4.parquet.lock", os.getpid()))
        result = score(records(tmp_path / "in.jsonl"), "-o", out / "night-5.parquet", "--checkpoint", STORE)
        assert result.exit_code == 0, result.output
        assert [path for path in dead if path.exists()] == []
        assert [path for path in kept if not path.exists()] == []
        assert not (out / "night-5.parquet.lock").exists()
    finally:
        live.kill()
        live.wait()


def test_a_lock_held_by_a_live_process_is_never_swept(tmp_path):
    """The `flock` decides first: a held file stays whatever its owner line says."""
    from clef_cli.store.locks import JobLock, sweep_stale

    holder = JobLock(tmp_path / "a.parquet.lock", "output a")
    holder.acquire()
    try:
        holder.path.write_text(json.dumps({"pid": gone_pid(), "host": socket.gethostname(), "started": 0}))
        assert sweep_stale(tmp_path) == []
        assert holder.path.exists()
    finally:
        holder.release()
    planted_lock(tmp_path / "b.parquet.lock", gone_pid())
    assert sweep_stale(tmp_path) == [tmp_path / "b.parquet.lock"]


# ---------------------------------------------------------------------------- prune --cache-dir


def cached_files(folder: Path) -> list[str]:
    return sorted(path.name for path in (folder / "shards").iterdir())


def test_prune_with_cache_dir_prunes_this_machines_cache_of_the_store(store_bucket, monkeypatch, tmp_path):
    from clef_cli.store.key_index import KeyIndex
    from clef_cli.store.remote.layout import cache_folder

    monkeypatch.setenv("CLEF_CACHE_DIR", str(tmp_path / "not-this-one"))
    machine = tmp_path / "machine"
    for night in (1, 2):
        inputs = records(tmp_path / f"night-{night}.jsonl", start=10 * night)
        output = f"s3://{BUCKET}/out/night-{night}.parquet"
        keep = ["--keep-staged-output"]
        result = score(inputs, "-o", output, "--checkpoint", STORE, "--cache-dir", machine, *keep)
        assert result.exit_code == 0, result.output
    folder = cache_folder(STORE, machine)
    assert sorted(path.name for path in (folder / "upload").iterdir()) == ["night-1.parquet", "night-2.parquet"]
    files_before = cached_files(folder)
    offline = ["--grace-hours", "0", "--no-running-jobs"]  # no job runs: no grace needed
    args = ["checkpoint", "prune", STORE, "--keep-runs", "1", *offline, "--cache-dir", str(machine)]
    dry = runner.invoke(app, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would remove 2 staged outputs" in dry.stdout, dry.stdout
    assert cached_files(folder) == files_before and (folder / "upload").exists()
    pruned = runner.invoke(app, args)
    assert pruned.exit_code == 0, pruned.output
    assert "dropped 2 of 4 keys" in pruned.stdout, pruned.stdout
    assert f"this machine's cache ({machine / 'stores'}): 1 cache folder pruned to match, 2 staged outputs removed" in (
        pruned.stdout.replace("\n", "")
    ), pruned.stdout
    assert not (folder / "upload").exists()
    assert len(cached_files(folder)) < len(files_before), (files_before, cached_files(folder))
    index = KeyIndex(folder / "keys.sqlite")
    try:
        assert index.count() == 2
    finally:
        index.close()
    assert not list((tmp_path / "not-this-one").rglob("*"))
    again = score(
        tmp_path / "night-2.jsonl",
        "-o",
        f"s3://{BUCKET}/out/again.parquet",
        "--checkpoint",
        STORE,
        "--cache-dir",
        machine,
    )
    assert again.exit_code == 0 and "0 run through the model" in again.stderr + again.stdout, again.output
