"""The one seam through which clef changes the disk: every create, write, fsync, rename, unlink,
truncate, mkdir and directory fsync of the store (shards, journal, manifest, hidden-state shards,
prune's rewrites, the lock files) and of the outputs goes through these functions.

Why one seam: what survives a power loss depends on the order of these operations and on which of
them an fsync covers (a write not yet fsynced may be lost or cut short; a new name whose folder was
not fsynced may be lost). With every operation here, a test can record the sequence a job makes and
build each state a crash could leave (tests/support/crash_model.py), and inject a full disk at any step.

SQLite (the key index) journals its own writes; `sqlite_opened` and `sqlite_closed` mark where its
files are in use. Observers (`observe`) see each operation before it is made and may raise (an
injected `OSError`); without one, each call costs a list check.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

Observer = Callable[[str, Path, dict[str, Any]], None]
"""`observer(operation, path, details)`: operations are create, write, fsync, fsync_dir, rename,
unlink, mkdir, rmdir, truncate, rmtree, sqlite_open, sqlite_txn and sqlite_close."""

_observers: list[Observer] = []


@contextlib.contextmanager
def observe(observer: Observer) -> Iterator[None]:
    """Show every durable operation to `observer` while the block runs (tests: record, inject)."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)


def observed() -> bool:
    return bool(_observers)


def _note(operation: str, path: Path | str, **details: Any) -> None:
    for observer in list(_observers):
        observer(operation, Path(path), details)


# ----------------------------------------------------------------------------- files


def create(path: Path) -> BinaryIO:
    """A new (or emptied) file open for writing."""
    _note("create", path)
    return open(path, "wb")


def open_or_create(path: Path) -> int:
    """A descriptor open for reading and writing on `path`, created (empty) when missing; an
    existing file is not emptied (a lock file another process holds)."""
    if not os.path.lexists(path):
        _note("create", path)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def wrote(path: Path, handle: BinaryIO) -> None:
    """`handle` (open on `path`) has its whole content: flush it and tell observers (who read
    the bytes back from the file, so a streamed write costs nothing when nobody observes)."""
    handle.flush()
    if _observers:
        _note("write", path, offset=0, data=Path(path).read_bytes())


def fsync(handle: BinaryIO | int, path: Path) -> None:
    _note("fsync", path)
    os.fsync(handle if isinstance(handle, int) else handle.fileno())


def fsync_dir(path: Path) -> None:
    """Make the names created, renamed or removed in folder `path` durable."""
    _note("fsync_dir", path)
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def append(path: Path, data: bytes) -> None:
    """Append `data` to `path` and fsync it; a file this creates has its folder fsynced too, so
    that its name survives a power loss as its content does."""
    created = not path.exists()
    if created:
        _note("create", path)
    with open(path, "ab") as handle:
        offset = handle.tell()
        _note("write", path, offset=offset, data=data)
        handle.write(data)
        handle.flush()
        fsync(handle, path)
    if created:
        fsync_dir(path.parent)


def write_at(descriptor: int, path: Path, data: bytes, offset: int = 0) -> None:
    """Write `data` at `offset` of an open descriptor (the lock file's owner)."""
    _note("write", path, offset=offset, data=data)
    os.lseek(descriptor, offset, os.SEEK_SET)
    os.write(descriptor, data)


def truncate(descriptor: int, path: Path, size: int = 0) -> None:
    _note("truncate", path, size=size)
    os.ftruncate(descriptor, size)


def rename(source: Path, target: Path) -> None:
    _note("rename", source, target=Path(target))
    os.replace(source, target)


def unlink(path: Path, missing_ok: bool = True) -> None:
    if missing_ok and not os.path.lexists(path):
        return
    _note("unlink", path)
    Path(path).unlink(missing_ok=missing_ok)


def mkdir(path: Path, durable: bool = True) -> list[Path]:
    """Create folder `path` and any missing parents; `durable`: fsync each new folder's parent,
    so the folder (and what is later made durable in it) survives a power loss. Returns the
    folders it made, deepest first (what `rmdir_empty` removes when they end empty)."""
    path = Path(path)
    if path.is_dir():
        return []
    missing = [path, *(parent for parent in path.parents if not parent.exists())]
    for folder in reversed(missing):
        _note("mkdir", folder)
        folder.mkdir(exist_ok=True)
        if durable:
            fsync_dir(folder.parent)
    return missing


def rmdir_empty(folders: list[Path]) -> None:
    """Remove each of `folders` (deepest first) that is empty, stopping at the first that is not
    or is gone: a command that made a folder and wrote nothing in it leaves no folder behind."""
    for folder in folders:
        try:
            with os.scandir(folder) as entries:
                if any(entries):
                    return
            _note("rmdir", folder)
            os.rmdir(folder)
        except OSError:  # gone, or filled meanwhile by another process: left as it is
            return


def rmtree(path: Path, ignore_errors: bool = False) -> None:
    """Remove a folder and everything in it (nothing when it is missing)."""
    if not os.path.lexists(path):
        return
    _note("rmtree", path)
    shutil.rmtree(path, ignore_errors=ignore_errors)


# ----------------------------------------------------------------------------- SQLite


def sqlite_opened(path: Path, lock: Any = None) -> None:
    """The key index's database is open (SQLite writes `path`, `path`-wal and `path`-shm
    itself); `lock` serializes its use, so an observer can copy the files between transactions."""
    _note("sqlite_open", path, lock=lock)


def sqlite_closed(path: Path) -> None:
    _note("sqlite_close", path)


def sqlite_transaction(path: Path, connection: Any) -> None:
    """A transaction of the database at `path` is about to begin (on `connection`): the points
    between transactions are where a crash leaves the index (synchronous=FULL)."""
    _note("sqlite_txn", path, connection=connection)
