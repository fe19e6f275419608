"""A lock file holding the owner's pid and host, so that cron firing twice never runs two jobs on
one checkpoint or output.

The file is held with `flock` for the job's whole life. The kernel drops that lock when the owner
dies, however it dies (SIGKILL, OOM killer, reboot), so a lock left by a dead process is simply
taken over; the pid and host written inside only serve to name the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from clef_cli.errors import ClefError
from clef_cli.store import durable
from clef_cli.store.atomic import is_character_device

_held: dict[int, JobLock] = {}
"""The locks this process holds now, by id: what a process ended at once lets go (`abandon_held`)."""


class LockedError(ClefError):
    """Another live job holds the lock."""


def _read_owner(descriptor: int) -> dict[str, object] | None:
    os.lseek(descriptor, 0, os.SEEK_SET)
    raw = os.read(descriptor, 4096)
    try:
        owner = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return owner if isinstance(owner, dict) else None


class JobLock:
    """`with JobLock(path, what):` holds `path` for this process until the block ends."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self.owner = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        self.took_over: dict[str, object] | None = None
        self._descriptor: int | None = None

    def acquire(self) -> None:
        durable.mkdir(self.path.parent, durable=False)
        while True:
            descriptor = durable.open_or_create(self.path)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_owner(descriptor) or {}
                os.close(descriptor)
                raise LockedError(
                    f"{self.what} is in use by another clef job (pid {owner.get('pid', '?')} on host "
                    f"{owner.get('host', '?')}); lock file {self.path}"
                ) from None
            # The previous holder may have unlinked the file between our open and our flock.
            try:
                same_file = os.stat(self.path).st_ino == os.fstat(descriptor).st_ino
            except FileNotFoundError:
                same_file = False
            if same_file:
                break
            os.close(descriptor)
        self.took_over = _read_owner(descriptor)  # a dead job's lock: its owner, for the record
        durable.truncate(descriptor, self.path, 0)
        durable.write_at(descriptor, self.path, json.dumps(self.owner).encode("utf-8"))
        durable.fsync(descriptor, self.path)
        self._descriptor = descriptor
        _held[id(self)] = self

    def release(self) -> None:
        _held.pop(id(self), None)
        if self._descriptor is None:
            return
        with contextlib.suppress(FileNotFoundError):
            durable.unlink(self.path, missing_ok=False)
        os.close(self._descriptor)
        self._descriptor = None

    def __enter__(self) -> JobLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def abandon_held() -> None:
    """Remove the lock files this process holds, for a process about to end at once (a second
    Ctrl-C, `cli/stopping.py`): the kernel drops the `flock` itself, and without this the files
    would stay until the next run took them over. Only a file that is still this lock's (same
    inode) goes; nothing here raises."""
    for lock in list(_held.values()):
        descriptor = lock._descriptor
        if descriptor is None:
            continue
        with contextlib.suppress(OSError):
            if os.stat(lock.path).st_ino == os.fstat(descriptor).st_ino:
                durable.unlink(lock.path)


@contextlib.contextmanager
def job_locks(output: Path, checkpoint: Path) -> Iterator[JobLock]:
    """Hold a job's output and its checkpoint (a custom --checkpoint may be shared by several
    outputs, and an output written from several checkpoints); yields the output's lock. A
    character device (`-o /dev/null`) is not locked: nothing is made beside it, and jobs streaming
    into it at once harm nothing."""
    checkpoint_lock = JobLock(checkpoint.with_name(checkpoint.name + ".lock"), f"checkpoint {checkpoint}")
    if is_character_device(output):
        with checkpoint_lock:
            yield checkpoint_lock
        return
    with JobLock(output.with_name(output.name + ".lock"), f"output {output}") as output_lock, checkpoint_lock:
        yield output_lock
