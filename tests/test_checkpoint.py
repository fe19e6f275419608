"""Resumable jobs: SIGKILL at the dangerous instants, resume without recomputing, refusals,
damaged shards, re-scoring with another head, SIGINT, the disk guard and the job lock."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from clef_cli.cli import app

from .support.helpers import TINY_MODEL, assert_same_rows, write_jsonl

runner = CliRunner()
SUMMARY = re.compile(r"(\d+) run through the model, (\d+) from the checkpoint")


def records(count: int = 24) -> list[dict]:
    kinds = [
        {"urgent": {"type": "noul", "instructions": "Urgent?"}},
        {"team": {"type": "choice", "criteria": {"billing": "Money", "tech": None, "other": None}}},
        {"level": {"type": "score", "criteria": ["low", "mid", "high"]}, "flag": {"type": "noul"}},
    ]
    return [
        {"id": f"r{i:03d}", "state": "ticket " + "word " * (3 + (i * 7) % 40), "questions": kinds[i % 3]}
        for i in range(count)
    ]


@pytest.fixture
def job(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", records())
    return path, tmp_path / "out.parquet"


def command(inputs: Path, output: Path, *extra: str, workers: int = 0) -> list[str]:
    return [
        sys.executable,
        "-m",
        "clef_cli",
        "score",
        str(inputs),
        "-o",
        str(output),
        "--model",
        str(TINY_MODEL),
        "--workers",
        str(workers),
        "--max-batch-size",
        "2",
        "--quiet",
        *extra,
    ]


def run(inputs: Path, output: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(inputs, output, *extra), capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=300
    )


def forwards(done: subprocess.CompletedProcess) -> tuple[int, int]:
    match = SUMMARY.search(done.stderr)
    assert match, done.stderr
    return int(match.group(1)), int(match.group(2))


def journal_records(checkpoint: Path) -> int:
    journal = checkpoint / "journal.jsonl"
    if not journal.exists():
        return 0
    total = 0
    for line in journal.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError, KeyError):
            total += json.loads(line)["records"]
    return total


def start_and_kill(
    inputs: Path, output: Path, ready, env: dict, sig=signal.SIGKILL, workers: int = 0, started=None
) -> subprocess.Popen:
    """Start a job, wait for `ready()`, then SIGKILL its main process, or SIGINT its whole process
    group as Ctrl-C in a terminal does (encoding workers included)."""
    process = subprocess.Popen(
        command(inputs, output, workers=workers),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        start_new_session=True,
    )
    if started is not None:
        started(process.pid)
    deadline = time.monotonic() + 120
    while not ready():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the job never reached the point to kill it"
        time.sleep(0.005)
    if sig == signal.SIGINT:
        os.killpg(process.pid, sig)
    else:
        process.send_signal(sig)
    process.wait(timeout=60)
    return process


def rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reference")
    inputs = write_jsonl(folder / "in.jsonl", records())
    done = run(inputs, folder / "out.parquet")
    assert done.returncode == 0, done.stderr
    assert forwards(done) == (24, 0)
    return rows(folder / "out.parquet")


@pytest.mark.slow  # a real process killed at a chosen instant, then resumed
def test_sigkill_before_the_first_commit(job, uninterrupted):
    inputs, output = job
    checkpoint = Path(str(output) + ".ckpt")
    start_and_kill(inputs, output, lambda: (checkpoint / "manifest.json").exists(), {"CLEF_TEST_SLOW_COMMIT": "5"})
    assert journal_records(checkpoint) <= 2  # at most the first batch, which may have landed
    committed = journal_records(checkpoint)
    done = run(inputs, output)
    assert done.returncode == 0, done.stderr
    assert forwards(done) == (24 - committed, committed)
    assert_same_rows(rows(output), uninterrupted)


def children(pid: int) -> list[int]:
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            if fields.get("PPid", "").strip() == str(pid):
                found.append(int(status.parent.name))
    return found


def wait_gone(pids: list[int], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow  # a real process killed at a chosen instant, then resumed
@pytest.mark.parametrize("workers", [0, 1])
def test_sigkill_mid_run_resumes_without_forwarding_committed_records(job, uninterrupted, workers):
    inputs, output = job
    checkpoint = Path(str(output) + ".ckpt")
    orphans: list[int] = []

    def ready() -> bool:
        if journal_records(checkpoint) < 8:
            return False
        orphans.extend(children(process_pid[0]))
        return True

    process_pid: list[int] = []
    process = start_and_kill(
        inputs, output, ready, {"CLEF_TEST_SLOW_COMMIT": "0.3"}, workers=workers, started=process_pid.append
    )
    assert process.returncode == -signal.SIGKILL
    assert orphans or workers == 0
    assert wait_gone(orphans), "encoding workers outlived their killed job"
    committed = journal_records(checkpoint)
    assert 8 <= committed < 24 and not output.exists()
    done = run(inputs, output)
    assert done.returncode == 0, done.stderr
    assert forwards(done) == (24 - committed, committed)
    assert_same_rows(rows(output), uninterrupted)


@pytest.mark.slow  # a real process killed at a chosen instant, then resumed
def test_sigkill_during_the_final_write_leaves_no_output(job, uninterrupted, tmp_path):
    inputs, output = job
    marker = tmp_path / "holding"
    start_and_kill(inputs, output, marker.exists, {"CLEF_TEST_HOLD_OUTPUT": str(marker)})
    assert not output.exists()
    assert list(output.parent.glob(f".{output.name}.*.tmp"))  # the complete-but-unrenamed temporary
    done = run(inputs, output)
    assert done.returncode == 0, done.stderr
    assert forwards(done) == (0, 24)
    assert not list(output.parent.glob(f".{output.name}.*.tmp"))
    assert_same_rows(rows(output), uninterrupted)


@pytest.mark.slow  # a real process killed at a chosen instant, then resumed
@pytest.mark.parametrize("workers", [0, 1])
def test_sigint_commits_and_exits_130(job, uninterrupted, workers):
    inputs, output = job
    checkpoint = Path(str(output) + ".ckpt")
    process = start_and_kill(
        inputs,
        output,
        lambda: journal_records(checkpoint) >= 4,
        {"CLEF_TEST_SLOW_COMMIT": "0.3"},
        sig=signal.SIGINT,
        workers=workers,
    )
    assert process.returncode == 130
    _, stderr = process.communicate()
    assert "interrupted" in stderr and "rerun the same command to continue" in stderr
    committed = journal_records(checkpoint)
    assert committed >= 4 and not output.exists()
    done = run(inputs, output)
    assert forwards(done) == (24 - committed, committed)
    assert_same_rows(rows(output), uninterrupted)


@pytest.mark.slow  # a real process stopped at a chosen instant, then resumed
@pytest.mark.parametrize("workers", [0, 1])
def test_sigterm_commits_and_exits_130(job, uninterrupted, workers):
    """SIGTERM, as a supervisor (systemd, Kubernetes, timeout) sends it to the main process only:
    the batch under way is committed, the encoding workers go, the exit status is 130."""
    inputs, output = job
    checkpoint = Path(str(output) + ".ckpt")
    workers_seen: list[int] = []
    pid: list[int] = []

    def ready() -> bool:
        if journal_records(checkpoint) < 4:
            return False
        workers_seen.extend(children(pid[0]))
        return True

    process = start_and_kill(
        inputs, output, ready, {"CLEF_TEST_SLOW_COMMIT": "0.3"}, sig=signal.SIGTERM, workers=workers, started=pid.append
    )
    assert process.returncode == 130
    _, stderr = process.communicate()
    assert "interrupted" in stderr and "rerun the same command to continue" in stderr
    assert wait_gone(workers_seen), "encoding workers outlived their stopped job"
    committed = journal_records(checkpoint)
    assert committed >= 4 and not output.exists()
    assert f"interrupted: {committed} records committed this run" in stderr  # what it says is on disk
    done = run(inputs, output)
    assert forwards(done) == (24 - committed, committed)
    assert_same_rows(rows(output), uninterrupted)


def in_process(inputs: Path, output: Path, *extra: str):
    return runner.invoke(
        app, ["score", str(inputs), "-o", str(output), "--model", str(TINY_MODEL), "--workers", "0", "--quiet", *extra]
    )


@pytest.mark.slow  # the quick loop's budget (issue 36.12): CI's whole run has it
def test_prompt_settings_and_inputs_share_the_store_and_another_dtype_is_refused(job):
    inputs, output = job
    assert in_process(inputs, output, "--max-length", "4096").exit_code == 0
    other_length = in_process(inputs, output, "--max-length", "2048")  # part of every key: all run again
    assert other_length.exit_code == 0 and "24 run through the model, 0 from the checkpoint" in other_length.stderr
    changed = write_jsonl(inputs, records(25))
    grown = in_process(changed, output, "--max-length", "4096")
    assert grown.exit_code == 0 and "1 run through the model, 24 from the checkpoint" in grown.stderr
    assert len(rows(output)) == 25
    refused = in_process(changed, output, "--max-length", "4096", "--dtype", "bfloat16")
    assert refused.exit_code == 2 and len(refused.stderr.splitlines()) == 1
    assert "this run differs in dtype (float32 there, bfloat16 here):" in refused.stderr
    assert refused.stderr.index("--checkpoint") < refused.stderr.index("--restart")
    restarted = in_process(changed, output, "--dtype", "bfloat16", "--restart")
    assert restarted.exit_code == 0, restarted.output
    assert "25 run through the model, 0 from the checkpoint" in restarted.stderr


def test_another_model_is_refused(job, tmp_path):
    inputs, output = job
    assert in_process(inputs, output).exit_code == 0
    other = second_head_release(tmp_path)
    refused = runner.invoke(
        app, ["score", str(inputs), "-o", str(output), "--model", str(other), "--workers", "0", "--quiet"]
    )
    assert refused.exit_code == 2
    assert "this run differs in head:" in refused.stderr


@pytest.mark.slow  # a real process killed at a chosen instant, then resumed
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_shard_is_detected_and_recomputed(job, uninterrupted, damage):
    inputs, output = job
    done = run(inputs, output)
    assert forwards(done) == (24, 0)
    checkpoint = Path(str(output) + ".ckpt")
    shard = sorted((checkpoint / "shards").glob("*.results.arrow"))[3]
    data = bytearray(shard.read_bytes())
    if damage == "truncate":
        shard.write_bytes(data[: len(data) // 2])
    else:
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    done = run(inputs, output)
    assert done.returncode == 0, done.stderr
    assert forwards(done) == (2, 22)
    assert_same_rows(rows(output), uninterrupted)


def second_head_release(tmp_path: Path) -> Path:
    """The same backbone with another (perturbed) joint head."""
    folder = tmp_path / "release-b"
    shutil.copytree(TINY_MODEL, folder)
    for path in folder.iterdir():
        path.chmod(0o644)
    state = load_file(str(folder / "joint_head.safetensors"))
    generator = torch.Generator().manual_seed(99)
    state = {k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in state.items()}
    save_file(state, str(folder / "joint_head.safetensors"))
    head = tmp_path / "head-b"
    head.mkdir()
    shutil.copy(folder / "joint_head.safetensors", head)
    shutil.copy(folder / "joint_head_config.json", head)
    return folder


def test_rehead_equals_a_full_run_with_that_head(job, tmp_path):
    inputs, output = job
    assert in_process(inputs, output, "--hidden-dtype", "float32").exit_code == 0
    release_b = second_head_release(tmp_path)
    full = tmp_path / "full-b.parquet"
    assert (
        runner.invoke(
            app, ["score", str(inputs), "-o", str(full), "--model", str(release_b), "--workers", "0", "--quiet"]
        ).exit_code
        == 0
    )
    reheaded = tmp_path / "rehead-b.parquet"
    result = in_process(inputs, reheaded, "--checkpoint", str(output) + ".ckpt", "--rehead", str(tmp_path / "head-b"))
    assert result.exit_code == 0, result.output
    assert_same_rows(rows(reheaded), rows(full))
    assert rows(reheaded)[0]["answers"] != rows(output)[0]["answers"]
    metadata = pq.read_schema(reheaded).metadata
    assert metadata[b"clef.rehead_from"].decode() == str(output) + ".ckpt"


def test_rehead_after_drop_computes_the_missing_hidden_states(job, tmp_path):
    """A store kept without states is reheaded all the same: the thinker runs on its records
    once (tests/test_keep_policy.py checks the states against a keep run's, bit for bit)."""
    inputs, output = job
    assert in_process(inputs, output, "--hidden-states", "drop").exit_code == 0
    second_head_release(tmp_path)
    rehead = ("--checkpoint", str(output) + ".ckpt", "--rehead", str(tmp_path / "head-b"))
    result = in_process(inputs, tmp_path / "r.parquet", *rehead)
    assert result.exit_code == 0, result.output
    assert "computed the hidden states of 24 stored records without them" in result.stderr
    assert len(rows(tmp_path / "r.parquet")) == 24


def test_rehead_without_model_uses_the_checkpoints_and_counts_only_the_jobs_tokens(job, tmp_path, monkeypatch):
    """No --model: the release the store's manifest names (not a download of the default). A job
    of 5 records over a store of 24 counts (and runs) those 5 keys' real prompt tokens only."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True, raising=False)
    inputs, output = job
    assert in_process(inputs, output).exit_code == 0
    second_head_release(tmp_path)
    stats, reheaded = tmp_path / "stats.json", tmp_path / "rehead.parquet"
    result = runner.invoke(
        app,
        ["score", str(inputs), "-o", str(reheaded), "--checkpoint", str(output) + ".ckpt", "--rehead",
         str(tmp_path / "head-b"), "--limit", "5", "--quiet", "--stats-json", str(stats)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert pq.read_schema(reheaded).metadata[b"clef.model"].decode() == str(TINY_MODEL)
    tokens = sum(row["prompt_tokens"] for row in rows(reheaded))
    assert [row["id"] for row in rows(reheaded)] == [f"r{i:03d}" for i in range(5)]
    assert json.loads(stats.read_text())["tokens"] == tokens
    assert f"{tokens:,} prompt tokens in" in result.stderr


def test_rehead_at_a_file_or_an_empty_folder_is_a_usage_error_naming_rehead(job, tmp_path):
    inputs, output = job
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("not a head")
    checkpoint = str(output) + ".ckpt"
    cases = (("a-file", "is a file"), ("empty", "has no joint_head_config.json"), ("nowhere", "does not exist"))
    for head, what in cases:
        rehead = ("--checkpoint", checkpoint, "--rehead", str(tmp_path / head))
        result = in_process(inputs, tmp_path / "r.parquet", *rehead)
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(f"error: --rehead {tmp_path / head} {what}")
        assert "Errno" not in result.stderr and "Traceback" not in result.output


def test_disk_guard_refuses_a_job_that_cannot_fit(job, monkeypatch):
    inputs, output = job
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    refused = in_process(inputs, output)
    assert refused.exit_code == 1
    assert "need about" in refused.stderr and "--hidden-states drop" in refused.stderr
    assert in_process(inputs, output, "--hidden-states", "drop").exit_code == 0


HOLDER = """
import sys, time
from pathlib import Path
from clef_cli.store.locks import JobLock
with JobLock(Path(sys.argv[1]), "test"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_job_on_a_locked_checkpoint_names_the_holder(job):
    inputs, output = job
    lock = Path(str(output) + ".ckpt.lock")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        refused = in_process(inputs, output)
        assert refused.exit_code == 1
        assert f"in use by another clef job (pid {holder.pid} on host {socket.gethostname()})" in refused.stderr
    finally:
        holder.kill()
        holder.wait()
    assert in_process(inputs, output).exit_code == 0


def test_a_stale_lock_is_taken_over(job):
    inputs, output = job
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = Path(str(output) + ".lock")
    lock.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": 0}))
    result = in_process(inputs, output)
    assert result.exit_code == 0, result.output
    assert not lock.exists()


def test_checkpoint_info(job):
    inputs, output = job
    assert in_process(inputs, output).exit_code == 0
    result = runner.invoke(app, ["checkpoint", "info", str(output) + ".ckpt", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["keys"] == 24
    assert info["shards_with_hidden_states"] == info["shards"] > 0
    assert info["size_bytes"] >= info["results_bytes"] + info["hidden_bytes"] > info["hidden_bytes"] > 0
    assert info["settings"] == {"dtype": "float32"}
    assert [run["counts"]["forwarded"] for run in info["runs"]] == [24]  # an object, not JSON text
    assert [(run["inputs"], run["output"]) for run in info["runs"]] == [([str(inputs)], str(output))]
    human = runner.invoke(app, ["checkpoint", "info", str(output) + ".ckpt"])
    assert "keys: 24" in human.stdout
    assert "dtype: float32\n" in human.stdout and '"' not in human.stdout  # no JSON quotes
    assert f"  inputs: {inputs}\n  output: {output}\n" in human.stdout
    missing = runner.invoke(app, ["checkpoint", "info", str(inputs.parent)])
    assert missing.exit_code == 2 and "is not a clef checkpoint" in missing.stderr


@pytest.mark.slow  # the quick loop's budget (issue 36.12): CI's whole run has it
def test_checkpoint_info_says_a_shard_is_damaged(job):
    inputs, output = job
    checkpoint = Path(str(output) + ".ckpt")
    assert in_process(inputs, output, "--hidden-states", "drop", "--max-batch-size", "4").exit_code == 0
    entries = [json.loads(line) for line in (checkpoint / "journal.jsonl").read_text().splitlines()]
    shard = checkpoint / "shards" / entries[1]["files"]["results"]["name"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = runner.invoke(app, ["checkpoint", "info", str(checkpoint), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["damaged_shards"] == [entries[1]["name"]]
    assert info["damaged_records"] == entries[1]["records"] and info["keys"] == 24 - entries[1]["records"]
    human = runner.invoke(app, ["checkpoint", "info", str(checkpoint)]).stdout
    assert f"damaged: 1 shard whose check fails ({entries[1]['records']} record" in human


def test_a_key_index_from_before_runs_named_their_files_still_opens(tmp_path):
    """An index whose runs table has no inputs/output columns (an older clef's) opens; those runs
    name no files."""
    import sqlite3

    from clef_cli.store.key_index import KeyIndex

    path = tmp_path / "keys.sqlite"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE runs (seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT UNIQUE NOT NULL, "
        "started REAL NOT NULL, finished REAL, counts TEXT);"
        "INSERT INTO runs(run_id, started, finished, counts) VALUES ('old', 1.0, 2.0, '{\"run\": 3, \"reused\": 0}');"
    )
    old.commit()
    old.close()
    index = KeyIndex(path)
    try:
        index.begin_run("new", inputs=["a.jsonl"], output="out.parquet")
        runs = index.runs()
    finally:
        index.close()
    assert [(run["run_id"], run["counts"], run["inputs"], run["output"]) for run in runs] == [
        ("old", {"run": 3, "reused": 0}, [], None),
        ("new", None, ["a.jsonl"], "out.parquet"),
    ]
    assert [run["counted"] for run in runs] == [True, False]


@pytest.mark.slow  # the quick loop's budget (issue 36.12): CI's whole run has it
def test_a_damaged_hidden_state_shard_is_computed_again_and_rehead_then_works(job, tmp_path):
    """Resume checks the hidden states as it checks the results: one flipped byte drops that
    shard, its records run again, and --rehead, which refused the damaged shard, then succeeds."""
    inputs, output = job
    checkpoint = Path(str(output) + ".ckpt")
    settings = ("--max-batch-size", "4", "--hidden-dtype", "float32")
    assert in_process(inputs, output, *settings).exit_code == 0
    second_head_release(tmp_path)

    def rehead(name: str):
        head = str(tmp_path / "head-b")
        return in_process(inputs, tmp_path / name, "--checkpoint", str(checkpoint), "--rehead", head)

    assert rehead("before.parquet").exit_code == 0
    entries = [json.loads(line) for line in (checkpoint / "journal.jsonl").read_text().splitlines()]
    damaged = entries[2]
    assert 0 < damaged["records"] < 24
    shard = checkpoint / "shards" / damaged["files"]["hidden"]["name"]
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0x01  # one bit of the stored states, not of the header
    shard.write_bytes(bytes(data))

    refused = rehead("refused.parquet")
    assert refused.exit_code == 1 and "is damaged (checksum mismatch)" in refused.stderr

    healed = in_process(inputs, output, *settings)
    assert healed.exit_code == 0, healed.output
    assert forwards(healed) == (damaged["records"], 24 - damaged["records"])
    assert f"{damaged['records']} again for damaged checkpoint shards" in healed.stderr

    after = rehead("after.parquet")
    assert after.exit_code == 0, after.output
    assert_same_rows(rows(tmp_path / "after.parquet"), rows(tmp_path / "before.parquet"))


def test_a_later_transient_result_never_replaces_a_final_one(tmp_path):
    """A key's final row, then a transient row for it in a later shard (a rerun that ran out of
    memory): the index still points at the final row, and the store still counts the key."""
    import pyarrow as pa

    from clef_cli.store.key_index import KeyIndex

    def shard(kind: str | None) -> pa.Table:
        return pa.table({"record_key": ["k"], "error_kind": [kind], "error": [None if kind is None else "oom"]})

    index = KeyIndex(tmp_path / "keys.sqlite")
    try:
        run = index.begin_run("r1")
        index.add_shard("00000001", shard(None), has_hidden=False, run_seq=run)
        index.add_shard("00000002", shard("transient"), has_hidden=True, run_seq=index.begin_run("r2"))
        assert index.locate(["k"]) == {"k": ("00000001", 0)}
        assert index.count() == 1
        index.add_shard("00000003", shard(None), has_hidden=True, run_seq=index.begin_run("r3"))
        assert index.locate(["k"]) == {"k": ("00000003", 0)}  # a later final one still wins
    finally:
        index.close()
