"""Where a store lives: a local folder, or a bucket's prefix with a local cache folder. A job's
plan (`job/plan.py`) resolves `--checkpoint` into this once; everything above store/ passes it on without asking which
it is (store/opening.py opens either)."""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from clef_cli.errors import UsageError
from clef_cli.locations.uris import is_object_uri, local_path
from clef_cli.store.locks import SUFFIX, JobLock, LockedError
from clef_cli.store.remote.layout import cache_folder, store_uri

MAX_SLOTS = 16
"""Cache folders one machine tries for one store before waiting for the first (`--cache-dir`)."""

UPLOADS = "upload"
"""The store folder's folder for outputs on their way to an object store (`job/output.py`)."""


@dataclass(frozen=True)
class StoreLocation:
    folder: Path
    """The store itself, or the cache folder of a store in a bucket."""
    uri: str | None = None
    """The bucket store's normalised URI (`s3://bucket/prefix/`); None for a local folder."""
    option: str = "--checkpoint"
    """What named the store on the command line (`checkpoint info`'s is its DIRECTORY): messages say so."""

    @property
    def remote(self) -> bool:
        return self.uri is not None

    def __str__(self) -> str:
        return self.uri or str(self.folder)


def store_location(text: str | Path, cache_dir: Path | None = None, option: str = "--checkpoint") -> StoreLocation:
    """A store named on the command line: a bucket's prefix (`s3://bucket/store/`) or a folder."""
    if isinstance(text, str) and is_object_uri(text):
        return remote_location(text, cache_dir, option)
    path = local_path(text)
    if path is None:
        raise UsageError(f"{option} {text}: neither a local folder nor a store in a bucket")
    return StoreLocation(path, option=option)


def remote_location(text: str, cache_dir: Path | None = None, option: str = "--checkpoint") -> StoreLocation:
    """A bucket store and the first cache folder no running job on this machine holds: where its
    cache will likely be, for the checks before the store is opened. The folder a job uses is the
    one `lock_slot` takes."""
    uri = store_uri(text, option)
    for slot in range(1, MAX_SLOTS + 1):
        folder = cache_folder(uri, cache_dir, slot)
        if not _held(folder.with_name(folder.name + SUFFIX)):
            return StoreLocation(folder, uri, option)
    return StoreLocation(cache_folder(uri, cache_dir), uri, option)


def lock_slot(location: StoreLocation) -> tuple[StoreLocation, JobLock]:
    """A bucket store's cache folder chosen and locked in one step: the first whose lock this
    process takes (one another job holds is skipped), so jobs started together on one machine each
    get their own folder; the lock is the caller's to release (its folders go with it when they
    end empty). All `MAX_SLOTS` held: the first one's `LockedError`, naming its holder."""
    assert location.uri is not None
    root = location.folder.parent.parent  # cache_folder: ROOT/stores/NAME
    first: LockedError | None = None
    for slot in range(1, MAX_SLOTS + 1):
        folder = cache_folder(location.uri, root, slot)
        lock = JobLock(folder.with_name(folder.name + SUFFIX), f"cache {folder}")
        try:
            lock.acquire()
        except LockedError as held:
            first = first or held
            continue
        return StoreLocation(folder, location.uri, location.option), lock
    assert first is not None
    raise first


def _held(lock: Path) -> bool:
    """Whether a live process holds this lock file (store/locks.py's `flock`)."""
    try:
        descriptor = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)
    return False
