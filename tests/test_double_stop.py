"""A second Ctrl-C ends `clef score` with 130, never an abort (issue 45.1). In a terminal (a
pseudo-terminal here, so rich's live progress display is on: no `-q`), Ctrl-C twice in quick
succession used to raise KeyboardInterrupt into whatever the main thread was doing (a live
refresh, a torch call) or into the interpreter's shutdown: `terminate called without an active
exception` / `Aborted` (134), or Python's own death by SIGINT. Now the second request exits 130
at once (cli/stopping.py), and the rerun continues from what was committed.

Slow: real processes (torch and the model imported in each, under a pseudo-terminal)."""

from __future__ import annotations

import contextlib
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from .helpers import TINY_MODEL, write_jsonl
from .test_interrupt_codes import committed

ROOT = Path(__file__).resolve().parent.parent
NOUL = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
RECORDS = [{"id": f"r{n:02d}", "state": f"ticket {n} " + "word " * (n % 9), "questions": NOUL} for n in range(60)]
BROKEN = ("Aborted", "terminate called", "Traceback")


def score_command(inputs: Path, output: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "clef_cli", "score", str(inputs), "-o", str(output), "--model", str(TINY_MODEL),
            "--workers", "0", "--max-batch-size", "2", "--hidden-states", "drop", "--device", "cpu",
            *extra]  # fmt: skip


class InTerminal:
    """`clef score` with a pseudo-terminal as its stdin, stdout and stderr, in a process group of
    its own (as a shell's foreground job); everything it writes is kept in `text()`."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, cwd=ROOT,
                                        env={**env, "TERM": "xterm-256color", "COLUMNS": "120"},
                                        start_new_session=True)  # fmt: skip
        os.close(slave)
        self.written = bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError):
            while data := os.read(self.master, 4096):
                self.written.extend(data)

    def text(self) -> str:
        return bytes(self.written).decode(errors="replace")

    def ctrl_c(self) -> None:
        """What a terminal's Ctrl-C does: SIGINT to the foreground process group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGINT)

    def wait(self) -> int:
        try:
            code = self.process.wait(timeout=120)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.reader.join(timeout=5)
        os.close(self.master)
        return code


def wait_until(condition, what: str, job: InTerminal, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if job.process.poll() is not None:
            time.sleep(0.5)  # what it wrote last may still be on its way through the terminal
            assert condition(), f"the job ended before {what}: {job.text()[-2000:]}"
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.mark.slow
@pytest.mark.parametrize("when", ["during a forward", "as the stopped job ends"])
def test_ctrl_c_twice_under_the_progress_display_exits_130(tmp_path, when):
    inputs, output = write_jsonl(tmp_path / "in.jsonl", RECORDS), tmp_path / "out.parquet"
    checkpoint = Path(f"{output}.ckpt")
    env = {**os.environ, "CLEF_TEST_SLOW_COMMIT": "0.05"}  # the job is still running at the first Ctrl-C
    job = InTerminal(score_command(inputs, output), env)
    wait_until(lambda: committed(checkpoint) >= 4, "the first commits", job)
    job.ctrl_c()
    if when == "during a forward":
        time.sleep(0.1)  # the next batch is running
    else:  # the first request honoured: the job has said so and is on its way out
        wait_until(lambda: "interrupted" in job.text(), "the stopped job's summary", job)
    job.ctrl_c()
    code, text = job.wait(), job.text()
    assert code == 130, text[-2000:]
    assert not [word for word in BROKEN if word in text], text[-2000:]
    assert "stopping after the current batch" in text  # the first request said what it does
    kept = committed(checkpoint)
    assert 4 <= kept < len(RECORDS) and not output.exists()
    rerun = subprocess.run(score_command(inputs, output, "--quiet"), cwd=ROOT, capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr
    assert f"{kept:,} from the checkpoint" in rerun.stderr
    assert [row["id"] for row in pq.read_table(output).to_pylist()] == [record["id"] for record in RECORDS]
