"""A stop request is never lost, whatever the moment (issue 45.1): a real SIGINT, sent to this
process at each phase of a `clef score` run (keying, loading, encoding, committing, after the last
commit, while the output is written, as the store closes, as the summary prints), ends the command
with 130, and the rerun continues from what was committed. In process, through the CLI's own
handler (cli/stopping.py): one signal each, so the second-request exit never runs here.

The HF engine on the tiny model runs every moment (seconds in all); the vLLM engine's, where the
load's end and the worker's shutdown were the moments a stop was lost, run through the stand-in
worker (benchmarks/feed/vllm_stand_in.py: the real worker module, its engine simulated).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app

from .support.helpers import TINY_MODEL, write_jsonl

ROOT = Path(__file__).resolve().parent.parent
STAND_IN = ROOT / "benchmarks" / "feed" / "vllm_stand_in.py"
NOUL = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
RECORDS = [{"id": f"r{n:02d}", "state": f"ticket {n} " + "word " * (n % 5), "questions": NOUL} for n in range(8)]


def score(inputs: Path, output: Path, *extra: str):
    command = ["score", str(inputs), "-o", str(output), "--model", str(TINY_MODEL), "--workers", "0",
               "--max-batch-size", "2", "--hidden-states", "drop", "--device", "cpu", "--quiet", *extra]  # fmt: skip
    return CliRunner().invoke(app, command)


class SignalOnce:
    """Sends this process one SIGINT the first time the wrapped call is reached (before it runs,
    or after it returns), as a terminal's Ctrl-C lands at that instant."""

    def __init__(self) -> None:
        self.sent = False

    def send(self) -> None:
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)

    def before(self, function):
        def wrapped(*args, **kwargs):
            self.send()
            return function(*args, **kwargs)

        return wrapped

    def after(self, function):
        def wrapped(*args, **kwargs):
            result = function(*args, **kwargs)
            self.send()
            return result

        return wrapped


def at_moment(monkeypatch, moment: str, once: SignalOnce) -> None:
    """Where the signal lands, by the function running then (the product's own, wrapped)."""
    import clef_cli.cli.score as score_command
    import clef_cli.job.lifecycle as job_module
    from clef_cli import faults
    from clef_cli.engines.local import committer, pipeline
    from clef_cli.engines.vllm import client
    from clef_cli.store import checkpoint

    places = {
        "keying": (job_module, "job_ledger", "before"),
        "loading": (pipeline.ScoreJob, "start_scorer", "before"),
        "loaded": (pipeline.ScoreJob, "start_scorer", "after"),
        "encoding": (faults, "slow_encode", "before"),
        "commit": (faults, "after_commit", "before"),
        "last commit": (committer.BackgroundCommitter, "drain", "after"),
        "output written": (faults, "before_output_rename", "before"),
        "store closing": (checkpoint.Checkpoint, "close", "before"),
        "summary": (score_command, "print_summary", "before"),
        "vllm loading": (client.VllmWorker, "_wait_for_reply", "before"),
        "vllm load answered": (client.VllmWorker, "_wait_for_reply", "after"),
        "vllm worker closing": (client.VllmWorker, "close", "before"),
    }
    owner, name, when = places[moment]
    monkeypatch.setattr(owner, name, getattr(once, when)(getattr(owner, name)))


def stopped_then_resumed(tmp_path, monkeypatch, moment: str, *extra: str) -> None:
    """The run with a stop at `moment` exits 130 and says so; the rerun finishes every record,
    running only those the stopped run did not commit."""
    inputs, output = write_jsonl(tmp_path / "in.jsonl", RECORDS), tmp_path / "out.parquet"
    once = SignalOnce()
    with monkeypatch.context() as patched:
        at_moment(patched, moment, once)
        stopped = score(inputs, output, *extra)
    assert once.sent, f"the run never reached {moment}"
    assert stopped.exit_code == 130, stopped.output
    assert "interrupted" in stopped.stderr and "Traceback" not in stopped.output
    rerun = score(inputs, output, *extra, "--stats-json", str(tmp_path / "stats.json"))
    assert rerun.exit_code == 0, rerun.output
    assert [row["id"] for row in pq.read_table(output).to_pylist()] == [record["id"] for record in RECORDS]
    assert "0 failed of 8 records" in rerun.stderr


HF_QUICK = ["output written", "summary"]
"""The quick loop's: two of the moments after the job's last check, where a stop was lost (the
vLLM case below is a third)."""
HF_MOMENTS = ["keying", "loading", "loaded", "encoding", "commit", "last commit", "store closing"]


@pytest.mark.parametrize("moment", HF_QUICK)
def test_a_stop_as_the_job_ends_exits_130_and_the_rerun_continues(tmp_path, monkeypatch, moment):
    stopped_then_resumed(tmp_path, monkeypatch, moment)


@pytest.mark.slow  # two runs each; the quick loop has the moments that once lost the request
@pytest.mark.parametrize("moment", HF_MOMENTS)
def test_a_stop_at_any_moment_of_a_run_exits_130_and_the_rerun_continues(tmp_path, monkeypatch, moment):
    stopped_then_resumed(tmp_path, monkeypatch, moment)


@pytest.fixture
def stand_in_vllm(monkeypatch):
    """clef's vLLM client pointed at the stand-in worker, in this Python (64-wide states: the
    tiny release's width, so its own head scores them)."""
    from clef_cli.engines.vllm import client

    monkeypatch.setattr(client, "WORKER", STAND_IN)
    monkeypatch.setenv("CLEF_VLLM_PYTHON", sys.executable)
    monkeypatch.setenv("CLEF_BENCH_DEVICE_RATE", "100000")
    monkeypatch.setenv("CLEF_BENCH_HIDDEN_SIZE", "64")


VLLM_MOMENTS = ["vllm loading", "vllm load answered", "commit", "last commit", "output written", "store closing"]


def test_a_stop_as_the_vllm_worker_closes_exits_130(tmp_path, monkeypatch, stand_in_vllm):
    """The moment a stop was lost with vLLM: the job done, its worker shutting down (a real
    vLLM takes seconds to), the job's own checks all behind it."""
    stopped_then_resumed(tmp_path, monkeypatch, "vllm worker closing", "--engine", "vllm", "--dtype", "float32")


@pytest.mark.slow  # each case starts the stand-in worker (torch imported) twice
@pytest.mark.parametrize("moment", VLLM_MOMENTS)
def test_a_stop_at_any_moment_of_a_vllm_run_exits_130(tmp_path, monkeypatch, stand_in_vllm, moment):
    stopped_then_resumed(tmp_path, monkeypatch, moment, "--engine", "vllm", "--dtype", "float32")


@pytest.mark.slow  # vLLM's CPU build starts twice (most of a minute each)
def test_a_stop_as_the_real_vllm_worker_closes_exits_130(tmp_path, monkeypatch):
    """The same moment with vLLM itself (CLEF_VLLM_PYTHON), whose shutdown takes seconds."""
    from tests.support.vllm_release import cached_release
    from tests.test_vllm_engine import vllm_python

    monkeypatch.setenv("CLEF_VLLM_PYTHON", vllm_python())
    options = ["--engine", "vllm", "--dtype", "float32", "--model", str(cached_release()), "--cpu-kv-cache-gib", "1"]
    stopped_then_resumed(tmp_path, monkeypatch, "vllm worker closing", *options)


def test_a_stop_as_the_first_window_is_planned_plans_no_other_window(tmp_path, monkeypatch):
    """A Ctrl-C that lands while the first window is planned: the run encodes no further window
    for nothing (engines/local/pipeline.py `_stream` checks the stop after each), and exits 130."""
    from clef_cli.cli.stopping import STOPS
    from clef_cli.engines.local import pipeline

    planned_windows, handed_out = pipeline.planned_windows, []

    def stopped_at_the_first(*args, **kwargs):
        for window in planned_windows(*args, **kwargs):
            handed_out.append(window)
            if len(handed_out) == 1:
                os.kill(os.getpid(), signal.SIGINT)
                deadline = time.monotonic() + 10
                while not STOPS.event.is_set():  # the handler has run (on the main thread)
                    assert time.monotonic() < deadline, "the stop request never reached the job"
                    time.sleep(0.01)
            yield window

    monkeypatch.setattr(pipeline, "planned_windows", stopped_at_the_first)
    records = [{**record, "id": f"{record['id']}-{copy}"} for copy in range(5) for record in RECORDS]
    stopped = score(write_jsonl(tmp_path / "in.jsonl", records), tmp_path / "out.parquet", "--window", "4")
    assert stopped.exit_code == 130, stopped.output
    assert len(handed_out) == 1
