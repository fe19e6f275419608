"""Checks that are one long subprocess and nothing else in this process (the GPU check's CPU
smoke run: six fresh interpreters, most of a minute of imports) start when the session begins,
beside the in-process tests, instead of when their test comes up; the test that owns one is run
last, waits for it and asserts on its exit status and files exactly as if it had run it then.
Selected without the session hooks (a test run alone still gets them), or started by nobody, a
check starts when its test asks for it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@dataclass
class Run:
    process: subprocess.Popen
    folder: Path
    started: float

    def wait(self, timeout: float) -> int:
        """The exit status; past `timeout` seconds from its start, the whole run is killed and
        `subprocess.TimeoutExpired` raised (as `subprocess.run(timeout=...)` would)."""
        left = timeout - (time.monotonic() - self.started)
        try:
            return self.process.wait(timeout=max(left, 0.0))
        except subprocess.TimeoutExpired:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: bash and its pythons
            self.process.wait()


def _gpu_check() -> Run:
    folder = Path(tempfile.mkdtemp(prefix="clef-gpu-check-"))
    with (folder / "console.txt").open("w") as console:  # everything is also in OUT/gpu_check.log
        process = subprocess.Popen(
            ["bash", str(BENCHMARKS / "gpu_check.sh"), "--cpu-smoke"],
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OUT": str(folder / "out")},
            start_new_session=True,
        )
    return Run(process, folder, time.monotonic())


CHECKS = {"tests/test_benchmarks.py::test_gpu_check_cpu_smoke_runs_every_step": _gpu_check}
"""Test node id -> how to start its subprocess."""

_runs: dict[str, Run] = {}


def run_last(items: list) -> None:
    """Put the owners of background checks at the end, so the others run while they do."""
    owners = [item for item in items if item.nodeid in CHECKS]
    items[:] = [item for item in items if item.nodeid not in CHECKS] + owners


def start(node_ids) -> None:
    for node_id in node_ids:
        if node_id in CHECKS and node_id not in _runs:
            _runs[node_id] = CHECKS[node_id]()


def result(node_id: str) -> Run:
    """The run this test owns: started with the session, or now."""
    start([node_id])
    return _runs[node_id]


def stop_all() -> None:
    while _runs:
        run = _runs.popitem()[1]
        run.stop()
        shutil.rmtree(run.folder, ignore_errors=True)
