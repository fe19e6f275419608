"""Cron-quiet `--ray` runs: Ray's own lines go to a log file inside the checkpoint folder.

Ray talks on stderr from Python loggers, from its C++ core and from the processes it starts
(token-auth notices, "Started a local Ray instance", actor restarts, progress notices). Only the
file descriptor catches all of them, so for the length of the Ray work stderr's descriptor points
at the log file; clef's own summary and errors are printed after it is put back.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

RAY_LOG = "ray.log"
"""The file, inside the checkpoint folder, that a quiet run's Ray output goes to."""


@contextlib.contextmanager
def ray_output_to(path: Path | None) -> Iterator[None]:
    """Send everything written to stderr (fd 2) to `path` (appended) until the block ends; None
    leaves stderr alone."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log, 2)
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log)
