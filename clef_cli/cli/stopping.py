"""The one stop path: SIGINT (Ctrl-C) and SIGTERM, handled once, at the CLI boundary.

`ClefGroup.invoke` installs the handler around every command (the console script for the whole
process: a request as it parses or shuts down ends it 130 at once). A command that can stop
cleanly (`clef score`) runs its job inside `deferring()`: the first request only sets the job's stop
event, which every engine loop and phase checks (loading, encoding, forward, commit, output),
so the job commits what it has and exits 130; a request is recorded whatever the moment, so
the command ends 130 even when it came as the job was finishing. Any other command gets a
KeyboardInterrupt in the main thread, as Python's default would (exit 130 through `EXIT_TABLE`).

A second request ends the process at once with 130 (`os._exit`): no exception is raised into
whatever the main thread was doing (a rich live refresh, a torch call), and no interpreter
shutdown runs while other threads are still inside C++ (which is how `terminate called without
an active exception` / `Aborted` came about). Everything committed before it stays committed:
the checkpoint store survives a kill at any instant, and the next run continues from it. The
job's lock files go with it (`locks.abandon_held`); what else such an exit leaves is in
docs/scoring.md ("Stopping a job").

The console script ends the same way after its command (`exit_when_done`): Python's own shutdown
gives SIGINT back to its default action once the exit functions have run (`_PySignal_Fini`), so
a request during the teardown that follows (torch's, a second or more) killed the process by
SIGINT instead of exiting 130. The last exit function ends the process with the command's exit
status instead, after every other exit function ran and the streams were flushed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from clef_cli.cli.console import stderr
from clef_cli.store.locks import abandon_held

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_INTERRUPTED = 130
FIRST = "stopping after the current batch (press Ctrl-C again to stop at once)"
SECOND = "stopped at once: what was committed stays committed; rerun the same command to continue"
SHOW_CURSOR = "\x1b[?25h"
"""A live progress display hides the terminal's cursor; a process ended at once must give it back."""


class StopRequests:
    """Counts stop requests; `event` is the current job's (a fresh one per `deferring()`)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.requests = 0
        self.deferred = False
        self.in_command = False
        self._installed: dict[int, Any] = {}
        self._for_process = False
        self._notes: queue.SimpleQueue[str] = queue.SimpleQueue()
        """Lines for the note thread to print: a handler must not print (the main thread may be
        inside the console) nor start a thread (it may hold threading's own lock); a SimpleQueue
        is safe to put to from a signal handler."""
        self._noting: threading.Thread | None = None
        self.status = 0
        """The console script's exit status, once its command has ended (`exit_when_done`)."""

    def install_for_process(self) -> None:
        """The console script's: the handler for the process's whole life, so a request before
        or after the command (its parsing, the interpreter's shutdown) ends it 130 at once too.
        Call it first: its exit function must be the last to run (see the module's note)."""
        self._install()
        self._for_process = True
        atexit.register(self._exit_when_done)

    def exit_when_done(self, status: object) -> None:
        """The command ended with `status` (its `SystemExit` code): the process ends with it."""
        self.status = 0 if status is None else status if isinstance(status, int) else 1

    def _exit_when_done(self) -> None:
        """The last exit function: the streams flushed, the process ends with the command's status
        before the interpreter's teardown, where a signal would have its default action."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(self.status)

    @contextlib.contextmanager
    def command(self) -> Iterator[None]:
        """The handler for one command; in process (a library caller, CliRunner) the previous
        handlers come back after it. Off the main thread Python allows no handler: nothing changes."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        if not self._installed:
            self._install()
        self.requests, self.deferred, self.in_command = 0, False, True
        try:
            yield
        finally:
            self.in_command = False
            if not self._for_process:
                for signum, previous in self._installed.items():
                    signal.signal(signum, previous)
                self._installed = {}

    def _install(self) -> None:
        if self._noting is None:
            self._noting = threading.Thread(target=self._say, name="clef-stop-notes", daemon=True)
            self._noting.start()
        self._installed = {signum: signal.signal(signum, self._handle) for signum in SIGNALS}

    def _say(self) -> None:
        while True:
            message = self._notes.get()
            with contextlib.suppress(Exception):
                stderr.print(message, markup=False)

    @contextlib.contextmanager
    def deferring(self) -> Iterator[threading.Event]:
        """A job that stops at its own checks: requests set the event it is given instead of
        raising; one made before the job started counts too."""
        self.event = threading.Event()
        if self.requests:
            self.event.set()
        self.deferred = True
        try:
            yield self.event
        finally:
            self.deferred = False

    def requested(self) -> bool:
        return self.requests > 0

    def _handle(self, signum: int, frame: Any) -> None:
        self.requests += 1
        if self.requests > 1 or not self.in_command:
            stop_now()
        if not self.deferred:
            raise KeyboardInterrupt
        self.event.set()
        self._notes.put(FIRST)


def stop_now() -> None:
    """End the process with 130 now: the cursor shown, the line said, buffered output flushed
    where that can be done without waiting, then `os._exit` (no unwinding, no shutdown)."""
    text = f"\n{SECOND}\n"
    with contextlib.suppress(Exception):
        if os.isatty(2):
            text = SHOW_CURSOR + text
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a flush the main thread was in raises here: skipped
            stream.flush()
    with contextlib.suppress(OSError):
        os.write(2, text.encode())
    with contextlib.suppress(Exception):
        abandon_held()
    os._exit(EXIT_INTERRUPTED)


STOPS = StopRequests()
"""The process's one instance (signal handlers are per process)."""
