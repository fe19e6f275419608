"""`clef score --ray` never hangs a cron job: a plan that cannot fit the cluster is fitted or
refused, a stalled job stops itself, quiet runs print one summary line, and kills (the whole job,
or one actor) lose and repeat nothing.

The command-line runs are subprocesses with timeouts, so a hang fails the test instead of CI.
They join this session's 2-CPU local cluster (started once) rather than each starting their own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from clef_cli.engines.local.pipeline import ScoreJob
from clef_cli.engines.ray.resources import fit_actors
from clef_cli.errors import UsageError
from clef_cli.store.checkpoint import Checkpoint

from .support.helpers import SMALL_JOB, TINY_MODEL, assert_same_rows, require_ray, settings_for, write_jsonl

ray = require_ray()

RECORDS = 100
QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "level": {"type": "score", "criteria": ["low", "mid", "high"]},
}


# ----------------------------------------------------------------------------- fitting the plan


def test_actors_share_the_cpus_that_ray_data_leaves():
    assert fit_actors([{"CPU": 2.0}], 2, None, 0.0).cpus == 0.5
    assert fit_actors([{"CPU": 2.0}], 1, None, 0.0).cpus == 1.0
    assert fit_actors([{"CPU": 16.0, "GPU": 8.0}], 8, None, 1.0).cpus == 1.0
    assert fit_actors([{"CPU": 8.0, "GPU": 8.0}], 8, None, 1.0).cpus == 0.875
    assert fit_actors([{"CPU": 2.0}], 2, 0.5, 0.0).cpus == 0.5


def test_a_plan_that_cannot_fit_is_refused_with_its_numbers():
    with pytest.raises(UsageError) as error:
        fit_actors([{"CPU": 2.0}], 2, 1.0, 0.0)
    assert str(error.value) == (
        "the Ray plan needs 2 actors x 1 CPU + 1 CPU for Ray Data's read tasks = 3 CPUs, but the cluster has 2; "
        "it would wait forever. Use --ray-actors 1 or --cpus-per-worker 0.5 or no --cpus-per-worker "
        "(fit automatically)"
    )
    with pytest.raises(UsageError, match=r"needs 3 actors x 1 GPU, but the cluster has 2 GPUs \(room for 2 actors\)"):
        fit_actors([{"CPU": 8.0, "GPU": 1.0}, {"CPU": 8.0, "GPU": 1.0}], 3, None, 1.0)
    with pytest.raises(UsageError, match="no Ray node has 3 CPUs"):
        fit_actors([{"CPU": 2.0}, {"CPU": 2.0}], 1, 3.0, 0.0)
    with pytest.raises(UsageError, match="0 GPUs"):
        fit_actors([{"CPU": 8.0}], 1, None, 1.0)


# ----------------------------------------------------------------------------- command-line runs


@pytest.fixture(scope="module")
def clean_input(tmp_path_factory) -> Path:
    # distinct prompts: the store runs a repeated prompt once, and these tests count every record's run
    rows = [
        {"id": f"s{i}", "state": f"order {i} " + "order " * (i % 25), "questions": QUESTIONS} for i in range(RECORDS)
    ]
    return write_jsonl(tmp_path_factory.mktemp("faults") / "records.jsonl", rows)


@pytest.fixture(scope="module")
def local_rows(clean_input, tmp_path_factory):
    folder = tmp_path_factory.mktemp("faults-local")
    ScoreJob(settings_for(folder, [clean_input], "local.parquet", **SMALL_JOB)).run()
    return pq.read_table(folder / "local.parquet").to_pylist()


def clef(address: str, *args: str, hidden: str = "drop") -> list[str]:
    settings = ["-m", str(TINY_MODEL), "--device", "cpu", "--max-length", "4096", "--hidden-states", hidden]
    return [sys.executable, "-m", "clef_cli", "score", *args, *settings, "--ray", "--ray-address", address]


def run_clef(address: str, *args: str, timeout: float, env: dict[str, str] | None = None):
    return subprocess.run(
        clef(address, *args),
        capture_output=True,
        text=True,
        timeout=timeout,  # a hang fails the test
        env={**os.environ, **(env or {})},
    )


def journaled(checkpoint: Path) -> list[int]:
    """Every committed record index, once per time it was committed."""
    opened = Checkpoint.open_existing(checkpoint)
    tables = [opened.shard_table(entry.name) for entry in opened.entries]
    return [index for table in tables for index in table.column("record_index").to_pylist()]


@pytest.mark.ray
@pytest.mark.slow
def test_two_actors_on_two_cpus_finish_and_print_one_line(cluster, clean_input, local_rows, tmp_path):
    output = tmp_path / "out.parquet"
    started = time.monotonic()
    done = run_clef(cluster, str(clean_input), "-o", str(output), "--ray-actors", "2", "--block-records", "25",
                    timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_same_rows(pq.read_table(output).to_pylist(), local_rows, probability_tolerance=1e-5)
    lines = done.stderr.splitlines()  # stderr is a pipe: a cron job's view
    assert len(lines) == 1 and lines[0].startswith(f"{RECORDS} scored, 0 failed of {RECORDS} records"), done.stderr
    log = (tmp_path / "out.parquet.ckpt" / "ray.log").read_text()
    assert "Ray" in log  # what Ray said went to the checkpoint's log instead
    print(f"two actors on two CPUs: {time.monotonic() - started:.1f} s")


@pytest.mark.slow  # the quick loop's budget (issue 36.12): CI's whole run has it
@pytest.mark.ray
def test_a_plan_that_cannot_fit_exits_2_at_once(cluster, clean_input, tmp_path):
    done = run_clef(cluster, str(clean_input), "-o", str(tmp_path / "out.parquet"), "--ray-actors", "2",
                    "--cpus-per-worker", "1", timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: the Ray plan needs 2 actors x 1 CPU + 1 CPU for Ray Data's read tasks = 3 CPUs, but the cluster "
        "has 2; it would wait forever. Use --ray-actors 1 or --cpus-per-worker 0.5 or no --cpus-per-worker "
        "(fit automatically)"
    ]
    assert not (tmp_path / "out.parquet").exists()
    assert not (tmp_path / "out.parquet.ckpt").exists()  # refused: the store it made goes with it


@pytest.mark.ray
@pytest.mark.slow
def test_a_stalled_job_stops_itself_and_keeps_what_is_committed(cluster, clean_input, tmp_path):
    output = tmp_path / "out.parquet"
    done = run_clef(cluster, str(clean_input), "-o", str(output), "--ray-actors", "2", "--block-records", "10",
                    "--stall-timeout", "60", timeout=300, env={"CLEF_TEST_HANG_ON": "s55"})  # fmt: skip
    assert done.returncode == 1, done.stderr
    # clef's error line; Ray's own shutdown may log after it (seen: an `internal_kv_get` ERROR line)
    message = next(line for line in reversed(done.stderr.splitlines()) if line.startswith("error: "))
    assert message.startswith("error: no block came back from Ray for 60 s; Ray is waiting for: pending demands")
    assert "; actors: " in message and "alive (" in message and "ScoreActor" in message
    assert "rerun the same command to continue" in message
    assert not output.exists()
    committed = journaled(tmp_path / "out.parquet.ckpt")
    assert 55 not in committed and len(committed) == len(set(committed))
    assert f"the {len(committed)} records committed this run are kept" in message


@pytest.mark.ray
@pytest.mark.slow
def test_killing_the_whole_job_then_rerunning_repeats_nothing(cluster, clean_input, local_rows, tmp_path):
    from .test_ray import ray_job

    output = tmp_path / "out.parquet"
    checkpoint = tmp_path / "out.parquet.ckpt"
    job = subprocess.Popen(
        clef(cluster, str(clean_input), "-o", str(output), "--ray-actors", "2", "--block-records", "10"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "CLEF_TEST_SLOW_COMMIT": "1"},
        start_new_session=True,  # its own process group, killed as a whole
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and job.poll() is None:
            journal = checkpoint / "journal.jsonl"
            if journal.exists() and len(journal.read_text().splitlines()) >= 2:
                break
            time.sleep(0.2)
        assert job.poll() is None, "the job ended before it could be killed"
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
    first = journaled(checkpoint)
    assert 20 <= len(first) < RECORDS
    second = ray_job(settings_for(tmp_path, [clean_input], "out.parquet", **SMALL_JOB)).run()
    assert second.reused == len(first)
    assert second.committed == RECORDS - len(first)  # nothing committed is scored again
    everything = journaled(checkpoint)
    assert sorted(everything) == list(range(RECORDS))  # each record committed exactly once
    assert_same_rows(pq.read_table(output).to_pylist(), local_rows, probability_tolerance=1e-5)


@pytest.mark.ray
@pytest.mark.slow
def test_an_actor_killed_mid_block_is_replaced_and_nothing_is_lost_or_repeated(
    cluster, clean_input, local_rows, tmp_path, monkeypatch
):
    from clef_cli.engines.ray.job import RayScoreJob, RaySettings

    marker = tmp_path / "killed"
    monkeypatch.setenv("CLEF_TEST_KILL_ACTOR_ON", f"s37:{marker}")
    settings = RaySettings(num_workers=2, block_records=10)
    summary = RayScoreJob(settings_for(tmp_path, [clean_input], "out.parquet", **SMALL_JOB), settings).run()
    killed = int(marker.read_text())
    assert killed > 0  # an actor met the record and SIGKILLed itself mid-block
    assert summary.records == RECORDS and summary.committed == RECORDS
    assert sorted(journaled(tmp_path / "out.parquet.ckpt")) == list(range(RECORDS))
    assert_same_rows(pq.read_table(tmp_path / "out.parquet").to_pylist(), local_rows, probability_tolerance=1e-5)


def test_quiet_output_goes_to_the_log_file(tmp_path):
    log = tmp_path / "ray.log"
    script = (
        "import os, sys, logging\n"
        "from clef_cli.engines.ray.logs import ray_output_to\n"
        "from pathlib import Path\n"
        f"with ray_output_to(Path({str(log)!r})):\n"
        "    logging.getLogger('ray').warning('python warning')\n"
        "    os.write(2, b'C-level line\\n')\n"
        "    os.system('echo child process >&2')\n"
        "print('after', file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stderr == "after\n"
    assert log.read_text().splitlines() == ["python warning", "C-level line", "child process"]


@pytest.mark.ray
@pytest.mark.slow
def test_hidden_states_kept_by_ray_feed_rehead_like_a_local_run(cluster, clean_input, tmp_path):
    from clef_cli.engines.ray.job import RayScoreJob, RaySettings
    from clef_cli.engines.rehead import rehead

    from .test_checkpoint import second_head_release

    second_head_release(tmp_path)

    def keep(name: str, checkpoint: str | None = None):
        settings = settings_for(tmp_path, [clean_input], name, **SMALL_JOB)
        settings.hidden_states, settings.hidden_dtype = "keep", "float32"
        if checkpoint:
            settings.checkpoint, settings.rehead = tmp_path / checkpoint, tmp_path / "head-b"
        return settings

    ScoreJob(keep("local.parquet")).run()
    RayScoreJob(keep("ray.parquet"), RaySettings(num_workers=2, block_records=25)).run()
    shards = Checkpoint.open_existing(tmp_path / "ray.parquet.ckpt").hidden_shards()
    assert sum(shard.records for shard in shards) == RECORDS and all(shard.verify() for shard in shards)
    assert all(shard.path.name.startswith("ray-") for shard in shards)  # written by the actors
    rehead(keep("local-b.parquet", "local.parquet.ckpt"))
    rehead(keep("ray-b.parquet", "ray.parquet.ckpt"))
    local_b = pq.read_table(tmp_path / "local-b.parquet").to_pylist()
    assert_same_rows(pq.read_table(tmp_path / "ray-b.parquet").to_pylist(), local_b, probability_tolerance=1e-5)
    first = pq.read_table(tmp_path / "ray.parquet").to_pylist()
    assert first[0]["answers"] != local_b[0]["answers"]  # the other head really scored them


def start_and_kill_when(command: list[str], ready, env: dict[str, str]) -> None:
    """Start a job in its own process group and SIGKILL the whole group once `ready()` holds."""
    job = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **env}, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and job.poll() is None and not ready():
            time.sleep(0.2)
        assert job.poll() is None, "the job ended before it could be killed"
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)


@pytest.mark.ray
@pytest.mark.slow
def test_a_killed_job_keeping_hidden_states_leaves_no_orphan_shard_and_reheads(cluster, clean_input, tmp_path):
    """SIGKILL of a `--ray --hidden-states keep` job, then the same command again: every hidden-state
    file in shards/ is one a journal line names (a killed run's unjournaled files are gone), each
    record is committed once, and `--rehead` scores as a full run with that head does."""
    from clef_cli.engines.rehead import rehead

    from .test_checkpoint import second_head_release

    output, checkpoint = tmp_path / "out.parquet", tmp_path / "out.parquet.ckpt"
    command = clef(cluster, str(clean_input), "-o", str(output), "--ray-actors", "2", "--block-records", "10",
                   "--hidden-dtype", "float32", hidden="keep")  # fmt: skip
    journal = checkpoint / "journal.jsonl"
    start_and_kill_when(
        command, lambda: journal.exists() and len(journal.read_text().splitlines()) >= 2, {"CLEF_TEST_SLOW_COMMIT": "1"}
    )
    first = journaled(checkpoint)
    assert 10 <= len(first) < RECORDS
    killed = Checkpoint.open_existing(checkpoint)  # reads, changes nothing
    left = {path.name for path in (checkpoint / "shards").iterdir()}
    left -= {described["name"] for entry in killed.entries for described in entry.files.values()}
    assert any(name.endswith(".hidden.safetensors") for name in left)  # actors ran ahead of the commits
    done = subprocess.run([*command, "--quiet"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    opened = Checkpoint.open_existing(checkpoint)
    named = {described["name"] for entry in opened.entries for described in entry.files.values()}
    on_disk = {path.name for path in (checkpoint / "shards").iterdir()}
    assert on_disk == named, f"orphans: {sorted(on_disk - named)}; left by the kill: {sorted(left)}"
    assert sorted(journaled(checkpoint)) == list(range(RECORDS))  # each record committed exactly once
    shards = opened.hidden_shards()
    assert sum(shard.records for shard in shards) == RECORDS and all(shard.verify() for shard in shards)

    release_b = second_head_release(tmp_path)
    settings = settings_for(tmp_path, [clean_input], "reheaded.parquet", **SMALL_JOB)
    settings.hidden_states, settings.hidden_dtype = "keep", "float32"
    settings.checkpoint, settings.rehead = checkpoint, tmp_path / "head-b"
    summary = rehead(settings)
    assert summary.records == RECORDS
    full = settings_for(tmp_path, [clean_input], "full-b.parquet", **SMALL_JOB)
    full.model = str(release_b)
    ScoreJob(full).run()
    assert_same_rows(
        pq.read_table(tmp_path / "reheaded.parquet").to_pylist(),
        pq.read_table(tmp_path / "full-b.parquet").to_pylist(),
        probability_tolerance=1e-5,
    )
