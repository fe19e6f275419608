"""A lock file holding the owner's pid and host, so that cron firing twice never runs two jobs on
one checkpoint or output.

The file is held with `flock` for the job's whole life. The kernel drops that lock when the owner
dies, however it dies (SIGKILL, OOM killer, reboot), so a lock left by a dead process is simply
taken over; the pid and host written inside name the holder.

A killed job's lock file would stay until a job took the same lock, which a dated output never
does: so a job that takes a lock removes the other lock files beside it that are stale, those no
process holds whose owner is a process of this host that is gone (`sweep_stale`). A live
owner's, or one of another host (a shared folder), is never removed. Folders a lock made for
itself go with it when they end empty (a refused command leaves no empty folder).
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

SUFFIX = ".lock"
STALE_WAITS = (0.05, 0.1, 0.2, 0.4)
"""Seconds to wait before taking again a lock whose holder is a gone process of this host: a
sweep (`sweep_stale`) holds such a file for a moment while it removes it."""

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
        self._made: list[Path] = []
        """Folders `acquire` made for the file: removed by `release` when they end empty."""
        self.swept: list[Path] = []
        """Stale lock files beside this one that `acquire` removed."""

    def acquire(self) -> None:
        self._made = durable.mkdir(self.path.parent, durable=False)
        waits = iter(STALE_WAITS)
        while True:
            try:
                descriptor = durable.open_or_create(self.path)
            except FileNotFoundError:  # its folder, made by another command, removed as that one ended
                self._made += durable.mkdir(self.path.parent, durable=False)
                continue
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_owner(descriptor) or {}
                os.close(descriptor)
                if stale_owner(owner) and (wait := next(waits, None)) is not None:
                    time.sleep(wait)  # another job's sweep is removing this dead job's file
                    continue
                raise LockedError(
                    f"{self.what} is in use by another clef job (pid {owner.get('pid', '?')} on host "
                    f"{owner.get('host', '?')}); lock file {self.path}"
                ) from None
            # The previous holder (or a sweep) may have unlinked the file between our open and our flock.
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
        self.swept = sweep_stale(self.path.parent, self.path)

    def release(self) -> None:
        _held.pop(id(self), None)
        if self._descriptor is None:
            return
        with contextlib.suppress(FileNotFoundError):
            durable.unlink(self.path, missing_ok=False)
        os.close(self._descriptor)
        self._descriptor = None
        made, self._made = self._made, []
        durable.rmdir_empty(made)

    def __enter__(self) -> JobLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM), or a pid this system cannot have
        return True
    return True


def stale_owner(owner: dict[str, object]) -> bool:
    """Whether a lock's owner (its file's JSON) is a process of this host that is gone."""
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or "started" not in owner:
        return False
    return owner.get("host") == socket.gethostname() and not _alive(pid)


def sweep_stale(folder: Path, own: Path | None = None) -> list[Path]:
    """Remove the stale lock files in `folder` (see the module's note), but `own`; the removed.
    Nothing here raises: a file that cannot be read or held is left as it is."""
    try:
        with os.scandir(folder) as entries:
            names = [entry.name for entry in entries if entry.name.endswith(SUFFIX) and entry.is_file()]
    except OSError:
        return []
    return [folder / name for name in sorted(names) if folder / name != own and _remove_if_stale(folder / name)]


def _remove_if_stale(path: Path) -> bool:
    """Remove `path` when no process holds it (its `flock` is free) and its owner is stale;
    held while it goes, so no job takes it meanwhile (one that tries waits, `STALE_WAITS`)."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        owner = _read_owner(descriptor)
        if owner is None or not stale_owner(owner) or os.stat(path).st_ino != os.fstat(descriptor).st_ino:
            return False
        durable.unlink(path)
        return True
    except OSError:  # held (BlockingIOError), or gone meanwhile
        return False
    finally:
        os.close(descriptor)


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
def job_locks(output: Path, checkpoint: Path, held: JobLock | None = None) -> Iterator[JobLock]:
    """Hold a job's output and its checkpoint (a custom --checkpoint may be shared by several
    outputs, and an output written from several checkpoints); yields the output's lock. A
    character device (`-o /dev/null`) is not locked: nothing is made beside it, and jobs streaming
    into it at once harm nothing. `held`: the checkpoint's lock, taken already (a bucket store's
    cache folder, chosen and locked in one step: store/location.lock_slot); released here too,
    also when the output's cannot be taken."""
    with contextlib.ExitStack() as locks:
        if held is not None:
            locks.callback(held.release)
        output_lock = None
        if not is_character_device(output):
            output_lock = locks.enter_context(JobLock(output.with_name(output.name + SUFFIX), f"output {output}"))
        checkpoint_lock = held or locks.enter_context(
            JobLock(checkpoint.with_name(checkpoint.name + SUFFIX), f"checkpoint {checkpoint}")
        )
        yield output_lock or checkpoint_lock
