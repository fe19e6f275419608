"""Crash-test hooks: pauses at the instants where a kill is most dangerous, so tests can SIGKILL a
job there deterministically instead of racing it. Inert unless the environment asks for them."""

from __future__ import annotations

import os
import time
from pathlib import Path

SLOW_COMMIT = "CLEF_TEST_SLOW_COMMIT"
"""Seconds to sleep after each committed shard."""
HOLD_OUTPUT = "CLEF_TEST_HOLD_OUTPUT"
"""A marker path: the output writer creates it once the temporary output is complete, then waits
(up to 60 s) before renaming it into place."""


def after_commit() -> None:
    seconds = os.environ.get(SLOW_COMMIT)
    if seconds:
        time.sleep(float(seconds))


def before_output_rename() -> None:
    marker = os.environ.get(HOLD_OUTPUT)
    if marker:
        Path(marker).touch()
        time.sleep(60)
