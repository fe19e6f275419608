"""How cli/stopping.py counts stop requests: the second ends the process at once, and one made
before a job's `deferring()` reaches that job. Real signals, sent by the process to itself; the
second-request exit (`os._exit`) runs in a child Python, so it cannot end the test's process."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from clef_cli.cli import stopping
from clef_cli.cli.stopping import EXIT_INTERRUPTED, FIRST, SECOND, SHOW_CURSOR, StopRequests

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


class Exited(BaseException):
    """`os._exit(code)` in this process, made an exception the test catches: the process ends
    nowhere, and each moment's exit runs in the test's own process (where mutation testing sees it)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Unflushable(io.StringIO):
    """A stream whose reader has gone (a closed pipe): its flush raises."""

    def flush(self) -> None:
        raise BrokenPipeError("the reader has gone")


def handled(stops: StopRequests) -> str:
    """What one request does (a KeyboardInterrupt caught here, never taken for pytest's own)."""
    try:
        stops._handle(signal.SIGINT, None)
    except Exited as exited:
        return f"exit {exited.code}"
    except KeyboardInterrupt:
        return "interrupt"
    return "deferred"


@pytest.fixture
def exits(monkeypatch):
    def exit_now(code: int) -> None:
        raise Exited(code)

    monkeypatch.setattr(stopping.os, "_exit", exit_now)


def test_a_request_outside_a_command_ends_the_process_130_at_once_saying_so(exits, capfd, tmp_path):
    """Before or after its command (the console script's parsing, its teardown), the first
    request already ends the process, its lock files removed, the line on stderr."""
    from clef_cli.store.locks import JobLock

    stops = StopRequests()
    assert not stops.requested()
    lock = JobLock(tmp_path / ".lock", "a job")
    lock.acquire()
    assert handled(stops) == f"exit {EXIT_INTERRUPTED}" and stops.requests == 1
    assert capfd.readouterr().err == f"\n{SECOND}\n"  # no cursor code: stderr is no terminal here
    assert not (tmp_path / ".lock").exists()
    lock.release()


def test_in_a_command_the_first_request_interrupts_and_the_second_ends_the_process(exits, default_sigint):
    stops = StopRequests()
    with stops.command():
        assert signal.getsignal(signal.SIGINT) == stops._handle
        assert handled(stops) == "interrupt"
        assert stops.requested() and stops.requests == 1
        assert handled(stops) == f"exit {EXIT_INTERRUPTED}"


def test_a_deferred_jobs_first_request_sets_its_event_and_says_what_comes(exits, default_sigint, capsys):
    stops = StopRequests()
    with stops.command(), stops.deferring() as event:
        assert handled(stops) == "deferred"
        assert event.is_set() and stops.requests == 1
        wait_for(lambda: FIRST in capsys.readouterr().err, "the note")
        assert stops._noting is not None and stops._noting.daemon  # it never holds a process's exit
        assert handled(stops) == f"exit {EXIT_INTERRUPTED}"


def test_a_second_request_on_a_terminal_gives_its_cursor_back(exits):
    """A live display hid the cursor; the line the process ends on shows it again."""
    import pty

    main, terminal = pty.openpty()
    saved = os.dup(2)
    os.dup2(terminal, 2)
    try:
        with pytest.raises(Exited):
            stopping.stop_now()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(terminal)
    said = os.read(main, 4096).decode()
    os.close(main)
    assert said.startswith(SHOW_CURSOR) and SECOND in said


def test_the_console_script_keeps_its_handler_and_ends_with_its_commands_status(exits, default_sigint, monkeypatch):
    """`install_for_process`: the handler stays after the command, and the last exit function
    ends the process with the command's status, even where a stream cannot be flushed."""
    import atexit

    stops = StopRequests()
    registered = atexit._ncallbacks()
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        stops.install_for_process()
        assert atexit._ncallbacks() == registered + 1
        with stops.command():
            pass
        assert signal.getsignal(signal.SIGINT) == stops._handle  # not given back after the command
    finally:
        atexit.unregister(stops._exit_when_done)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    with pytest.raises(Exited) as exited:
        StopRequests()._exit_when_done()  # no command reported a status
    assert exited.value.code == 0
    monkeypatch.setattr(sys, "stdout", Unflushable())
    for status, code in ((None, 0), (3, 3), ("an error's text", 1)):
        stops.exit_when_done(status)
        with pytest.raises(Exited) as exited:
            stops._exit_when_done()
        assert exited.value.code == code


def test_a_process_ended_at_once_ends_130_even_where_nothing_can_be_written(exits, monkeypatch):
    """stdout's reader gone and stderr a pipe nobody reads: the flush and the line fail, the
    process still ends 130."""
    monkeypatch.setattr(sys, "stdout", Unflushable())
    reading, writing = os.pipe()
    os.close(reading)
    saved = os.dup(2)
    os.dup2(writing, 2)
    try:
        with pytest.raises(Exited) as exited:
            stopping.stop_now()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(writing)
    assert exited.value.code == EXIT_INTERRUPTED


def test_a_process_ended_at_once_ends_130_whatever_its_terminal_check_or_lock_release_raise(exits, monkeypatch, capfd):
    """`stop_now` is the last thing a process does: a terminal check that raises (a closed
    descriptor 2) or a lock release that raises (a folder gone) must not keep it from ending 130
    with its line said."""
    from clef_cli.store import locks

    def raising(*args):
        raise OSError("gone")

    monkeypatch.setattr(stopping.os, "isatty", raising)
    monkeypatch.setattr(stopping, "abandon_held", raising)
    with pytest.raises(Exited) as exited:
        stopping.stop_now()
    assert exited.value.code == EXIT_INTERRUPTED
    assert capfd.readouterr().err == f"\n{SECOND}\n"
    assert locks.abandon_held is not raising  # the module's own name was the one replaced


def test_the_note_thread_is_named_for_a_thread_dump_and_prints_notes_as_written(monkeypatch, default_sigint):
    """py-spy and faulthandler dumps name threads: the note thread reads as clef's. A note is
    printed as its text, never read as rich markup, and one print that raises (a gone reader)
    does not end the thread: the notes after it are still said."""
    from clef_cli.cli import console

    printed: list[str] = []
    failures = iter([BrokenPipeError("the reader has gone")])
    original = console.stderr.print

    def printing(message, **options):
        failure = next(failures, None)
        if failure is not None:
            raise failure
        with console.stderr.capture() as capture:
            original(message, **options)
        printed.append(capture.get())

    monkeypatch.setattr(stopping.stderr, "print", printing)
    stops = StopRequests()
    with stops.command():
        assert stops._noting is not None and stops._noting.name == "clef-stop-notes"
        stops._notes.put("lost to the gone reader")
        stops._notes.put("[bold]kept[/bold] as written")
        wait_for(lambda: printed, "the second note")
    assert printed == ["[bold]kept[/bold] as written\n"]
