"""An interrupted `clef score` exits 130 even when records failed (issue 36): the interrupt is
checked before the failures, so a script that sees 3 never takes a stopped job for a finished one
(its output unwritten). The job holds a record that fails while it runs (a missing image: counted
in `failed` as soon as it is committed) and an invalid one; it is stopped after its first
commits, in process (seconds) and as a real process sent SIGINT, as Ctrl-C sends it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clef_cli.cli import app

from .support.helpers import TINY_MODEL, write_jsonl

ROOT = Path(__file__).resolve().parent.parent
NOUL = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
RECORDS = [
    {"id": "broken", "state": "its image is missing", "questions": NOUL, "images": ["missing.png"]},  # fails (media)
    {"id": "invalid", "state": "no questions at all"},  # invalid: never keyed, never run
]
RECORDS += [{"id": f"r{n:03d}", "state": "ticket " + "word " * (3 + n % 9), "questions": NOUL} for n in range(40)]


def score_command(inputs: Path, output: Path) -> list[str]:
    return ["score", str(inputs), "-o", str(output), "--model", str(TINY_MODEL), "--workers", "0",
            "--max-batch-size", "2", "--hidden-states", "drop", "--quiet"]  # fmt: skip


def committed(checkpoint: Path) -> int:
    """Records the job's journal says are committed (0 before its first line)."""
    journal = checkpoint / "journal.jsonl"
    total = 0
    with contextlib.suppress(FileNotFoundError):
        for line in journal.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError, KeyError):
                total += json.loads(line)["records"]
    return total


def test_a_stop_on_a_job_with_a_failed_record_exits_130(tmp_path, monkeypatch):
    """In process (seconds): one real SIGINT to this process at the first commit, taken by the
    CLI's own handler (cli/stopping.py)."""
    from clef_cli import faults

    sent: list[bool] = []

    def first_commit() -> None:
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(faults, "after_commit", first_commit)
    inputs, output = write_jsonl(tmp_path / "in.jsonl", RECORDS), tmp_path / "out.parquet"
    result = CliRunner().invoke(app, score_command(inputs, output))
    assert result.exit_code == 130, result.output
    assert "interrupted: " in result.stderr and not output.exists()


@pytest.mark.slow  # a real process: its start-up alone (torch, the model) is most of 20 s here
def test_sigint_on_a_job_with_a_failed_record_exits_130(tmp_path):
    """The same as a user meets it: SIGINT to the process group once its first batches are in."""
    inputs, output = write_jsonl(tmp_path / "in.jsonl", RECORDS), tmp_path / "out.parquet"
    process = subprocess.Popen(
        [sys.executable, "-m", "clef_cli", *score_command(inputs, output)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CLEF_TEST_SLOW_COMMIT": "0.4"},  # each commit waits: the job is still running
        start_new_session=True,
    )
    checkpoint = Path(f"{output}.ckpt")
    try:
        deadline = time.monotonic() + 120
        while committed(checkpoint) < 3:  # the failed record and the first batch are committed
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the job never committed its first batches"
            time.sleep(0.01)
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, stderr
    assert "interrupted: " in stderr and "rerun the same command to continue" in stderr
    assert committed(checkpoint) < len(RECORDS) - 1 and not output.exists()
