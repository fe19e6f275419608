"""Ctrl-C means 130 with the vLLM engine too (issue 36.3), in every phase: while vLLM loads, while
a batch runs in it and while it waits between batches. A terminal sends SIGINT to the whole
foreground process group; the worker runs in a session of its own, so clef alone gets it,
commits what it has, stops the worker and exits 130; no worker outlives it. SIGTERM likewise.
Slow: each case starts vLLM (CLEF_VLLM_PYTHON, as tests/test_vllm_engine.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.test_vllm_engine import vllm_python, write_records

WORKER = str(Path(__file__).parent.parent / "clef_cli" / "engines" / "vllm" / "worker.py")
IDS = ("ticket-001", "ticket-002", "ticket-006")
PHASES = [("loading", signal.SIGINT), ("loading", signal.SIGTERM), ("running", signal.SIGINT),
          ("running", signal.SIGTERM), ("idle", signal.SIGINT), ("idle", signal.SIGTERM)]  # fmt: skip


def command(release: Path, records: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "clef_cli", "score", str(records), "-o", str(out), "--model", str(release),
            "--engine", "vllm", "--device", "cpu", "--dtype", "float32", "--workers", "0", "--quiet",
            "--max-batch-size", "1", "--cpu-kv-cache-gib", "1"]  # fmt: skip


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def workers_alive(out: Path) -> list[int]:
    """Worker processes of this job still running (found by their command line)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if WORKER in line:
                alive.append(int(entry.name))
    return alive


@pytest.fixture(scope="module")
def release():
    from tests.support.vllm_release import cached_release

    vllm_python()
    return cached_release()


@pytest.mark.slow
@pytest.mark.parametrize(("phase", "signum"), PHASES, ids=[f"{p}-{s.name}" for p, s in PHASES])
def test_a_signal_to_the_process_group_exits_130_in_every_phase(tmp_path, release, phase, signum):
    records, out = write_records(tmp_path, IDS), tmp_path / "out.parquet"
    busy = tmp_path / "busy"
    env = {**os.environ, "CLEF_VLLM_PYTHON": vllm_python()}
    if phase == "running":
        env |= {"CLEF_TEST_VLLM_BUSY": str(busy), "CLEF_TEST_SLOW_VLLM": "6"}
    if phase == "idle":
        env |= {"CLEF_TEST_SLOW_COMMIT": "8"}
    job = subprocess.Popen(command(release, records, out), env=env, start_new_session=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    log, shards = tmp_path / "out.parquet.ckpt" / "vllm.log", tmp_path / "out.parquet.ckpt" / "shards"
    if phase == "loading":
        wait_for(lambda: log.exists() and workers_alive(out), 120, "the vLLM worker to start")
        time.sleep(3)
    elif phase == "running":
        wait_for(busy.exists, 240, "a batch in vLLM")
    else:
        wait_for(lambda: shards.exists() and any(shards.glob("*.results.*")), 240, "a committed batch")
    os.killpg(job.pid, signum)
    _, stderr = job.communicate(timeout=120)
    assert job.returncode == 130, stderr
    assert "Traceback" not in stderr and "stopped while" not in stderr
    wait_for(lambda: not workers_alive(out), 30, "the worker to end")
    committed = len(list(shards.glob("*.results.*"))) if shards.exists() else 0
    if phase != "loading":
        assert committed >= 1  # the batch in flight (running) or the one committed (idle) is kept
    if (phase, signum) != ("running", signal.SIGINT):
        return  # one rerun shows the rest: every vLLM start here costs most of a minute
    done = subprocess.run(command(release, records, out), env={**os.environ, "CLEF_VLLM_PYTHON": vllm_python()},
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = pq.read_table(out).to_pylist()
    assert [row["id"] for row in table] == list(IDS) and all(row["error"] is None for row in table)
