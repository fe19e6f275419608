"""Long, self-contained jobs that the quick loop runs beside its in-process tests: each is a
subprocess, run one after another from when the session begins (only those that a selected test
needs), and the tests that own one wait for it and assert on what it left, exactly as they
asserted before.

- `gpu-check`: `benchmarks/gpu/gpu_check.sh --cpu-smoke`, six fresh interpreters (most of a minute
  of imports); its test runs last, so the whole session runs beside it.
- `crash`: the pipeline job whose encoding process dies on a record (three worker-process
  starts, each importing torch and transformers; tests/support/background_jobs.py).
- `planted`: the train-head module's planted task, scored and trained once (tests/support/background_jobs.py).
- `planted-TASK`: the whole-suite's full-size case of each planted task (scored, trained, reheaded).

A job that nothing started (no session hook saw its tests) starts when a test asks for it. The
session's end kills whatever is still running and removes the jobs' folders.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import planted

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


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

    def result(self, timeout: float = 900) -> dict:
        """A Python job's result.json, once it has exited 0."""
        status = self.wait(timeout)
        console = (self.folder / "console.txt").read_text(errors="replace")
        assert status == 0, console[-3000:]
        return json.loads((self.folder / "result.json").read_text())

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


def _launch(name: str, command: list[str], env: dict[str, str] | None = None) -> Run:
    folder = Path(tempfile.mkdtemp(prefix=f"clef-{name}-"))
    process = subprocess.Popen(
        [part.replace("{folder}", str(folder)) for part in command],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **{k: v.replace("{folder}", str(folder)) for k, v in (env or {}).items()}},
        start_new_session=True,
    )
    drained = threading.Thread(target=_drain, args=(process.stdout, folder / "console.txt"), daemon=True)
    drained.start()
    return Run(process, folder, time.monotonic(), drained)


def _drain(stream, path: Path) -> None:
    with stream, path.open("wb") as console:
        shutil.copyfileobj(stream, console)


@dataclass(frozen=True)
class Job:
    command: list[str]
    """Its argv; `{folder}` is the job's own temporary folder."""
    owns: Callable[[Any], bool]
    """Whether a collected test item waits for it."""
    env: dict[str, str] = field(default_factory=dict)
    last: bool = False
    """Run its tests at the end of the session (nothing else waits for them)."""


def _python_job(name: str) -> list[str]:
    return [sys.executable, "-m", "tests.support.background_jobs", name, "{folder}"]


GPU_CHECK_TEST = "tests/test_benchmarks.py::test_gpu_check_cpu_smoke_runs_every_step"
CRASH_TEST = "tests/test_pipeline.py::test_a_record_that_kills_its_encoding_process_fails_alone"


def _full_size(task: str) -> str:
    return f"tests/test_train_head.py::test_planted_tasks_reach_the_probe_at_full_size[{task}]"


JOBS = {
    "gpu-check": Job(
        ["bash", str(BENCHMARKS / "gpu" / "gpu_check.sh"), "--cpu-smoke"],
        lambda item: item.nodeid == GPU_CHECK_TEST,
        env={"OUT": "{folder}/out", "PYTHON": sys.executable},  # the interpreter running the tests
        last=True,
    ),
    "crash": Job(_python_job("crash"), lambda item: item.nodeid == CRASH_TEST),
    "planted": Job(
        _python_job("planted"),
        lambda item: item.nodeid.startswith("tests/test_train_head.py::") and "planted" in item.fixturenames,
    ),
    **{
        f"planted-{task}": Job(_python_job(f"planted-{task}"), lambda item, task=task: item.nodeid == _full_size(task))
        for task in planted.TASKS
    },
}

_runs: dict[str, Run] = {}
_lock = threading.Lock()
_stopping = threading.Event()


def run_last(items: list) -> None:
    """Put the tests of `last` jobs at the end, so the others run while their jobs do."""
    waiting = [item for item in items if any(job.last and job.owns(item) for job in JOBS.values())]
    items[:] = [item for item in items if item not in waiting] + waiting


def start_for(items: list) -> None:
    """Run the jobs these tests wait for one after another, the one needed first first: one
    core for them, the other left to the tests (several at once slowed the tests down more
    than they saved)."""
    order: list[str] = []
    for item in items:
        order += [name for name, job in JOBS.items() if name not in order and job.owns(item)]
    if order:
        threading.Thread(target=_one_after_another, args=(order,), name="clef-background", daemon=True).start()


def _one_after_another(names: list[str]) -> None:
    for name in names:
        started = run(name)
        if started is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):  # killed; its test reports it
            started.wait(timeout=900)


def run(name: str) -> Run | None:
    """The job's run: started by the session's queue, or now, when a test wants it first (None
    once the session is ending)."""
    with _lock:
        if name not in _runs and not _stopping.is_set():
            job = JOBS[name]
            _runs[name] = _launch(name, job.command, job.env)
        return _runs.get(name)


def stop_all() -> None:
    with _lock:
        _stopping.set()
        runs = list(_runs.values())
        _runs.clear()
    for run in runs:
        run.stop()
        shutil.rmtree(run.folder, ignore_errors=True)
