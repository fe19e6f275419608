"""Progress without a terminal (cron, a pipe, a log file): plain lines on stderr, one at least
every `--log-every` seconds from a timer thread, so a log shows how far a job got even when the
job is killed or a batch hangs (docs/scoring.md, "Progress in a cron log")."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import typer

from clef_cli.progress import Progress
from clef_cli.sizes import plural

DEFAULT_LOG_EVERY = 60.0
"""`--log-every`: the option lives here, beside the lines it paces (score_options is at its size limit)."""
LogEveryOption = Annotated[
    float,
    typer.Option(
        "--log-every",
        metavar="SECONDS",
        help="Without a terminal (cron, a pipe, a log file): write a plain progress line on stderr at least this "
        "often (records done of total, records/s, ETA, the bucket store's syncs). Above 0.",
    ),
]


def duration(seconds: float) -> str:
    """`45 s`, `8 min 12 s`, `2 h 05 min`: a span as a log reader reads it."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


@dataclass
class Counts:
    """What the job has said so far (the `Progress` calls), read by the timer under a lock."""

    total: int | None = None
    done: int = 0
    """Records done of `total`: those the checkpoint had at the start, and this run's."""
    ran: int = 0
    """Records this run finished (scored or failed): the rate's numerator."""
    failed: int = 0
    syncs: int | None = None
    """Syncs of a bucket store that committed (None: no bucket store, or none reported yet)."""
    failing: int = 0
    """Syncs that failed in a row since the last that committed."""


def progress_line(counts: Counts, elapsed: float, scoring: float, idle: float | None, doing: str | None) -> str:
    """The periodic line: done of total, failures, rate since scoring began, ETA at that rate,
    the syncs, and (`idle`: seconds without a finished record, shown when given) what the job
    was last doing. `elapsed`: since the command began; `scoring`: since scoring began."""
    rate = counts.ran / scoring if scoring > 0 else 0.0
    if counts.total is None:
        parts = [f"{counts.done:,} records"]
    else:
        share = counts.done / counts.total if counts.total else 1.0
        parts = [f"{counts.done:,} of {counts.total:,} records ({share:.1%})"]
    if counts.failed:
        parts.append(f"{counts.failed:,} failed")
    parts.append(f"{rate:,.1f} records/s")
    if counts.total is not None:
        left = max(0, counts.total - counts.done)
        parts.append("eta 0 s" if not left else f"eta {duration(left / rate)}" if rate > 0 else "eta unknown")
    if counts.syncs is not None:
        failing = f", the last {counts.failing} failed" if counts.failing else ""
        parts.append(f"syncs: {counts.syncs:,} done{failing}")
    if idle is not None:
        parts.append(f"no record finished for {duration(idle)}" + (f" ({doing})" if doing else ""))
    return f"progress after {duration(elapsed)}: " + ", ".join(parts)


def stderr_lines() -> Callable[[str], None]:
    """A writer of lines to stderr as it is now, the command's: a timer that outlived its command
    (a job left hanging in a thread of a test's process) never writes into another's."""
    stream = sys.stderr

    def write(line: str) -> None:
        try:
            stream.write(line + "\n")
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or file: the job goes on without its log
            pass

    return write


class LineProgress(Progress):
    """Plain lines (no ANSI, no redraw): a line when scoring starts, each note as it comes, and
    from a timer a progress line every `every` seconds, whether or not a record finished (a hung
    batch says for how long none did)."""

    def __init__(
        self,
        every: float = DEFAULT_LOG_EVERY,
        write: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every = every
        self.write = write or stderr_lines()
        self.clock = clock
        self.counts = Counts()
        self.began = self.last_record = clock()
        self.scoring_since: float | None = None
        self.doing: str | None = "starting"
        """The last note or phase since the last finished record (None: records are finishing)."""
        self.doing_since = self.began
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="clef-progress-lines", daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            self.write(self.line())

    def line(self) -> str:
        """What the timer writes now."""
        now = self.clock()
        with self._lock:
            if self.scoring_since is None:
                return f"{self.doing or 'starting'}: {duration(now - self.doing_since)} so far"
            idle = now - self.last_record
            shown = idle if idle >= self.every else None
            return progress_line(self.counts, now - self.began, now - self.scoring_since, shown, self.doing)

    def start(self, total: int | None, done: int) -> None:
        with self._lock:
            self.counts.total, self.counts.done = total, done
            self.scoring_since = self.last_record = self.clock()
            self.doing = None
        if total is None:
            self.write("scoring records (how many is not known yet)")
        else:
            self.write(f"scoring {plural(total, 'record')}: {done:,} done already, {total - done:,} to run")

    def advance(self, records: int, tokens: int, failed: int) -> None:
        with self._lock:
            self.counts.done += records
            self.counts.ran += records
            self.counts.failed += failed
            self.last_record = self.clock()
            self.doing = None

    def syncs(self, done: int, failing: int) -> None:
        with self._lock:
            self.counts.syncs, self.counts.failing = done, failing

    def phase(self, description: str | None) -> None:
        """A phase is named by the timer's line (`keying the records: 40 s so far`), not at once:
        a job refused in its first second reads as its one error line."""
        self._doing(description)

    def note(self, message: str) -> None:
        self._doing(message)
        self.write(message)

    def _doing(self, what: str | None) -> None:
        with self._lock:
            self.doing, self.doing_since = what, self.clock()

    def warn(self, message: str) -> None:
        self.write(f"warning: {message}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
