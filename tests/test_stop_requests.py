"""How cli/stopping.py counts stop requests: the second ends the process at once, and one made
before a job's `deferring()` reaches that job. Real signals, sent by the process to itself; the
second-request exit (`os._exit`) runs in a child Python, so it cannot end the test's process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from clef_cli.cli.stopping import EXIT_INTERRUPTED, SECOND, StopRequests

ROOT = Path(__file__).resolve().parent.parent


def wait_for(condition, what: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def default_sigint():
    """Python's own SIGINT handler for the test, as in a terminal: a pytest started in the
    background (`cmd &` in a script, `nohup`) inherits SIGINT ignored, and the handlers a command
    puts back after it would then be that, not Python's."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_second_request_during_a_deferred_job_ends_the_process_at_once():
    """The first request only sets the job's event; the second exits 130 there and then, while
    the job would go on (here: a job that never checks its event)."""
    child = textwrap.dedent(f"""
        import os, signal, time
        from clef_cli.cli.stopping import StopRequests
        stops = StopRequests()
        with stops.command(), stops.deferring() as event:
            os.kill(os.getpid(), signal.SIGINT)
            while not event.is_set():
                time.sleep(0.01)
            print("first request: event set", flush=True)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep({2.0})
            print("still running after the second request", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == EXIT_INTERRUPTED, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == "first request: event set\n"
    assert SECOND in done.stderr


def test_a_request_made_before_the_job_defers_reaches_the_job(default_sigint):
    """A Ctrl-C as the command starts (before its job runs inside `deferring()`) is recorded; the
    job then starts with its event already set, so it stops at its first check."""
    stops = StopRequests()
    with stops.command():
        with contextlib.suppress(KeyboardInterrupt):  # not deferred yet: Python's own interrupt
            os.kill(os.getpid(), signal.SIGINT)
            wait_for(stops.requested, "the handler")
        assert stops.requests == 1
        with stops.deferring() as event:
            assert event.is_set()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the test's handler is back
