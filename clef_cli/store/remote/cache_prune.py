"""`clef checkpoint prune` on a store in a bucket also prunes this machine's cache folders of that
store (under `--cache-dir`), so that what the prune dropped does not stay on every machine that
keeps its cache.

Each cache folder no running job holds is opened as `checkpoint info` opens it: brought up to the
manifest the prune committed, which drops the parts, keys and downloaded files the store no longer
names (`Cache.refresh`), and its own work not yet in the bucket (a killed job's) is sent as a
job's end sends it. Its staged outputs (`upload/`, copies of what went to the bucket, or of what a
rerun writes again) and the stale locks beside it go too. A folder a running job holds is left as
it is, and said. A dry run changes nothing: it counts the staged outputs only.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from clef_cli.store import durable
from clef_cli.store.location import MAX_SLOTS, UPLOADS, StoreLocation
from clef_cli.store.locks import SUFFIX, JobLock, LockedError
from clef_cli.store.remote.layout import cache_folder


@dataclass
class CachePruned:
    """What pruning this machine's cache of a bucket store did (or, with `dry_run`, would do)."""

    root: Path
    folders: int = 0
    """Cache folders brought up to the store (a dry run: found)."""
    held: list[str] = field(default_factory=list)
    """Cache folders a running job holds: left as they are."""
    staged: int = 0
    """Staged outputs removed (a dry run: that would be)."""
    bytes_freed: int = 0
    """A dry run: the staged outputs' bytes only."""
    dry_run: bool = False


def prune_caches(uri: str, cache_dir: Path | None, dry_run: bool = False) -> CachePruned:
    """Prune every cache folder of the store at `uri` on this machine (see the module's note)."""
    report = CachePruned(cache_folder(uri, cache_dir).parent, dry_run=dry_run)
    for slot in range(1, MAX_SLOTS + 1):
        folder = cache_folder(uri, cache_dir, slot)
        if not folder.is_dir():
            continue
        lock = JobLock(folder.with_name(folder.name + SUFFIX), f"cache {folder}")
        try:
            lock.acquire()
        except LockedError:
            report.held.append(str(folder))
            continue
        try:
            _prune_folder(StoreLocation(folder, uri), report)
        finally:
            lock.release()
    return report


def _prune_folder(location: StoreLocation, report: CachePruned) -> None:
    """One cache folder, whose lock the caller holds."""
    from clef_cli.store.remote.store import RemoteCheckpoint

    folder = location.folder
    report.folders += 1
    staged = [path for path in _files(folder / UPLOADS) if not path.name.endswith(SUFFIX)]
    report.staged += len(staged)
    if report.dry_run:
        report.bytes_freed += sum(path.stat().st_size for path in staged)
        return
    before = _size(folder)
    for path in staged:
        durable.unlink(path)
    durable.rmdir_empty([folder / UPLOADS])
    checkpoint = RemoteCheckpoint.open_remote(location, None, sync_every=None)
    checkpoint.close()
    report.bytes_freed += max(0, before - _size(folder))


def _files(folder: Path) -> list[Path]:
    try:
        with os.scandir(folder) as entries:
            return [Path(entry.path) for entry in entries if entry.is_file(follow_symlinks=False)]
    except OSError:
        return []


def _size(folder: Path) -> int:
    """Bytes of the files under `folder`."""
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):  # gone meanwhile
                total += os.lstat(os.path.join(root, name)).st_size
    return total
