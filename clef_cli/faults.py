"""Crash-test hooks: pauses at the instants where a kill is most dangerous, so tests can SIGKILL a
job there deterministically instead of racing it. Inert unless the environment asks for them."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

SLOW_COMMIT = "CLEF_TEST_SLOW_COMMIT"
"""Seconds to sleep after each committed shard."""
CRASH_ON = "CLEF_TEST_CRASH_ON"
"""A record id: a background encoding process that meets it dies on the spot, as a media decoder
crashing on a hostile file would."""
HOLD_OUTPUT = "CLEF_TEST_HOLD_OUTPUT"
"""A marker path: the output writer creates it once the temporary output is complete, then waits
(up to 60 s) before renaming it into place."""
SLOW_ENCODE = "CLEF_TEST_SLOW_ENCODE"
"""Seconds to sleep after encoding each record (planning or batch encoding), as slow media would."""


def after_commit() -> None:
    seconds = os.environ.get(SLOW_COMMIT)
    if seconds:
        time.sleep(float(seconds))


def before_output_rename() -> None:
    marker = os.environ.get(HOLD_OUTPUT)
    if marker:
        Path(marker).touch()
        time.sleep(60)


def maybe_crash(record_id: str) -> None:
    if os.environ.get(CRASH_ON) == record_id and multiprocessing.parent_process() is not None:
        os._exit(70)


def slow_encode() -> None:
    seconds = os.environ.get(SLOW_ENCODE)
    if seconds:
        time.sleep(float(seconds))
