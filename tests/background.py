"""Checks that are one long subprocess and nothing else in this process (the GPU check's CPU
smoke run: six fresh interpreters, most of a minute of imports) start when the session begins,
beside the in-process tests, instead of when their test comes up; the test that owns one is run
last, waits for it and asserts on its exit status and files exactly as if it had run it then.
A check that nothing started (no session hook saw its test) starts when its test asks for it.
The session's end kills whatever is still running and removes its folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@dataclass
class Run:
    process: subprocess.Popen
    folder: Path
    started: float
    drained: threading.Thread
    """Copies its output to `folder/console.txt` until every writer has closed it (the script's
    `tee` included, so its log is complete when the run counts as done)."""

    def wait(self, timeout: float) -> int:
        """The exit status once its output is closed, as `subprocess.run(timeout=...)` gives it;
        past `timeout` seconds from its start, the whole run is killed and TimeoutExpired raised."""
        left = lambda: max(timeout - (time.monotonic() - self.started), 0.0)  # noqa: E731
        try:
            status = self.process.wait(timeout=left())
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        self.drained.join(timeout=left())
        if self.drained.is_alive():
            self.stop()
            raise subprocess.TimeoutExpired(self.process.args, timeout)
        return status

    def stop(self) -> None:
        """Kill every process of its session: bash, and each step's `timeout` (which leads a
        process group of its own) and python, and the log's `tee`, which may outlive bash."""
        for pid in _session_members(self.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()


def _session_members(session: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session:  # after the name: state, ppid, pgrp, session
            members.append(int(stat.parent.name))
    return members


def _gpu_check() -> Run:
    folder = Path(tempfile.mkdtemp(prefix="clef-gpu-check-"))
    process = subprocess.Popen(
        ["bash", str(BENCHMARKS / "gpu_check.sh"), "--cpu-smoke"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OUT": str(folder / "out")},
        start_new_session=True,
    )
    drained = threading.Thread(target=_drain, args=(process.stdout, folder / "console.txt"), daemon=True)
    drained.start()
    return Run(process, folder, time.monotonic(), drained)


def _drain(stream, path: Path) -> None:
    with stream, path.open("wb") as console:  # everything is also in OUT/gpu_check.log
        shutil.copyfileobj(stream, console)


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
