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

from .support.helpers import TINY_MODEL, write_jsonl
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
@pytest.mark.parametrize("when", ["during a forward", "as the stopped job ends", "after the stop message"])
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
        if when == "after the stop message":
            time.sleep(0.1)  # the interpreter's teardown, where SIGINT had its default action (issue 51.5)
    job.ctrl_c()
    code, text = job.wait(), job.text()
    assert code == 130, text[-2000:]
    assert not list(tmp_path.glob("*.lock")), "a stopped job leaves no lock file"
    assert not [word for word in BROKEN if word in text], text[-2000:]
    assert "stopping after the current batch" in text  # the first request said what it does
    kept = committed(checkpoint)
    assert 4 <= kept < len(RECORDS) and not output.exists()
    rerun = subprocess.run(score_command(inputs, output, "--quiet"), cwd=ROOT, capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr
    assert f"{kept:,} from the checkpoint" in rerun.stderr
    assert [row["id"] for row in pq.read_table(output).to_pylist()] == [record["id"] for record in RECORDS]


TEARDOWN = """
import os, sys, time
from clef_cli.cli import main

class SlowTeardown:
    # destroyed with __main__'s globals, after Python gave SIGINT its default action back

    def __del__(self):
        os.write(1, b"teardown\\n")
        time.sleep(5)

held = SlowTeardown()
sys.argv = ["clef", "--version"]
main()
"""


def test_a_request_during_the_interpreters_teardown_is_no_death_by_signal():
    """Issue 51.5: after its command, Python's shutdown restores SIGINT's default action and then
    tears the modules down (torch's teardown takes a second or more), so Ctrl-C then killed the
    process by SIGINT (2 of 4 runs after "interrupted: ..."). The console script now ends with the
    command's own status once the exit functions have run, before that teardown."""
    job = subprocess.Popen([sys.executable, "-c", TEARDOWN], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert job.stdout is not None
    output = b""
    while chunk := job.stdout.readline():
        output += chunk
        if chunk == b"teardown\n":  # in the window: a request now
            job.send_signal(signal.SIGINT)
    code = job.wait(timeout=60)
    assert code == 0, (code, output, job.stderr.read() if job.stderr else "")
    assert output.startswith(b"clef ")


@pytest.mark.slow  # a real `clef score` process loads the model (about 15 s)
def test_a_job_stopped_at_once_leaves_no_lock_and_the_next_run_takes_over_what_it_left(tmp_path):
    """Issue 51.5: a second request while the job holds its locks (here: as the output is being
    written) ends it at once with 130; its lock files go with it and what is left is what
    docs/scoring.md says (the output's temporary), which the next run removes."""
    inputs, output = write_jsonl(tmp_path / "in.jsonl", RECORDS[:6]), tmp_path / "out.parquet"
    marker = tmp_path / "writing"
    env = {**os.environ, "CLEF_TEST_HOLD_OUTPUT": str(marker), "PYTHONPATH": str(ROOT)}
    job = subprocess.Popen(score_command(inputs, output, "--quiet"), cwd=ROOT, env=env, stderr=subprocess.PIPE,
                           text=True)  # fmt: skip
    deadline = time.monotonic() + 180
    while not marker.exists():
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.05)
    assert sorted(path.name for path in tmp_path.glob("*.lock")) == ["out.parquet.ckpt.lock", "out.parquet.lock"]
    job.send_signal(signal.SIGINT)
    time.sleep(0.3)
    job.send_signal(signal.SIGINT)
    _, said = job.communicate(timeout=60)
    assert job.returncode == 130, said
    assert said.rstrip().endswith("stopped at once: what was committed stays committed; rerun the same command to "
                                  "continue"), said  # fmt: skip
    left = sorted(path.name for path in tmp_path.iterdir() if path.name not in ("in.jsonl", "writing"))
    assert [name for name in left if not name.startswith(".out.parquet.")] == ["out.parquet.ckpt"], left
    assert len(left) == 2 and left[0].endswith(".tmp"), left  # the output's temporary, as documented
    info = subprocess.run([sys.executable, "-m", "clef_cli", "checkpoint", "info", f"{output}.ckpt"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "not finished (failed, killed, stopped at once" in info.stdout, info.stdout
    rerun = subprocess.run(score_command(inputs, output, "--quiet"), cwd=ROOT, capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr
    expected = ["in.jsonl", "out.parquet", "out.parquet.ckpt", "writing"]
    assert sorted(path.name for path in tmp_path.iterdir()) == expected
