"""Crash-test hooks: pauses at the instants where a kill is most dangerous, so tests can SIGKILL a
job there deterministically instead of racing it. Inert unless the environment asks for them."""

from __future__ import annotations

import multiprocessing
import os
import signal
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


HANG_ON = "CLEF_TEST_HANG_ON"
"""A record id: a Ray scoring actor that meets it never returns (for the stall watchdog)."""
KILL_ACTOR_ON = "CLEF_TEST_KILL_ACTOR_ON"
"""`RECORD_ID:MARKER_PATH`: the first Ray scoring actor that meets the record creates the marker
and SIGKILLs its own process, mid-block (later actors find the marker and carry on)."""


def ray_env() -> dict[str, str]:
    """The crash-test variables that are set, for the Ray workers' environment."""
    return {key: value for key, value in os.environ.items() if key.startswith("CLEF_TEST_")}


def in_ray_actor(record_id: str) -> None:
    if os.environ.get(HANG_ON) == record_id:
        while True:
            time.sleep(3600)
    target, _, marker = os.environ.get(KILL_ACTOR_ON, "").partition(":")
    if target == record_id and marker:
        try:
            descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(descriptor, str(os.getpid()).encode())
        os.close(descriptor)
        os.kill(os.getpid(), signal.SIGKILL)


def slow_encode() -> None:
    seconds = os.environ.get(SLOW_ENCODE)
    if seconds:
        time.sleep(float(seconds))


PAUSE_AT = "CLEF_TEST_PAUSE_AT"
"""`POINT:MARKER`: a store in a bucket that reaches POINT (`segment-uploaded`, `manifest-committed`,
`claimed`, `compaction-uploaded`, `prune-committed`) creates MARKER and waits 60 s, for a test to
kill the process there (store/remote/)."""


def pause_at(point: str) -> None:
    target, _, marker = os.environ.get(PAUSE_AT, "").partition(":")
    if target == point and marker:
        Path(marker).touch()
        time.sleep(60)
