"""The store's stat cache of media files: a local file's content digest, kept with what `stat`
said of the file when it was hashed, so that the next night keys an unchanged image or video
without reading its bytes again (a corpus of videos is read once, not every night).

A cached digest is used only when the file's device, inode, size, mtime and ctime (both in
nanoseconds) are all unchanged, and, git's rule for racy timestamps, only when the file's mtime
lies at least `RACY_NS` before the moment its entry was made: a file written within the same
timestamp tick as its caching could change again without its mtime moving, so it is hashed
again (and cached afresh) the next time. `clef score --verify-media` hashes every file again.

The cache lives in the key index's database (`media_stats`); like the index it is derived data:
losing it costs one night of reading every file again, never a wrong key.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clef_cli.store.key_index import KeyIndex

RACY_NS = 2_000_000_000
"""A file modified this close before its entry was made is rehashed: covers the coarsest usual
timestamp granularity (FAT's 2 s; ext4 and NFS ticks are finer) and clock steps between them."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS media_stats (
    path TEXT PRIMARY KEY,
    device INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    cached_ns INTEGER NOT NULL,  -- wall clock before the file was stat'ed and hashed
    digest TEXT NOT NULL
) WITHOUT ROWID
"""

Stamp = tuple[int, int, int, int, int]
"""(device, inode, size, mtime_ns, ctime_ns)."""


def stamp_of(info: os.stat_result) -> Stamp:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _open_table(index: KeyIndex, writable: bool, schema: str, table: str) -> bool:
    """Make the cache's table where the job may write; whether it is there to read."""
    with index.lock:
        if writable:
            index.db.execute(schema)
        query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        return index.db.execute(query, (table,)).fetchone() is not None


class MediaStats:
    """Lookups and new entries of one job; new entries are written with `flush` (a transaction
    per chunk of records), so keying stays a few microseconds a file."""

    def __init__(self, index: KeyIndex, writable: bool = True, trusted: bool = True) -> None:
        """`writable`: record new entries (not in a dry run); `trusted`: use the entries (not
        with --verify-media, which hashes every file and records what it found)."""
        self.index = index
        self.writable = writable
        self.trusted = trusted
        self.pending: list[tuple[str, int, int, int, int, int, int, str]] = []
        self.hits = self.misses = 0
        self.present = _open_table(index, writable, _SCHEMA, "media_stats")
        self.objects = ObjectStats(index, writable, trusted)

    @staticmethod
    def now() -> int:
        """Take before a file's stat: the entry made from that stat is dated by it."""
        return time.time_ns()

    def digest(self, path: str, stamp: Stamp) -> str | None:
        """The cached digest of `path` if its stamp is unchanged and was not racy; else None."""
        if not (self.trusted and self.present):
            self.misses += 1
            return None
        with self.index.lock:
            found = self.index.db.execute(
                "SELECT device, inode, size, mtime_ns, ctime_ns, cached_ns, digest FROM media_stats WHERE path = ?",
                (path,),
            ).fetchone()
        if found is None or tuple(found[:5]) != stamp or stamp[3] >= found[5] - RACY_NS:
            self.misses += 1
            return None
        self.hits += 1
        return str(found[6])

    def remember(self, path: str, stamp: Stamp, cached_ns: int, digest: str) -> None:
        if self.writable:
            self.pending.append((path, *stamp, cached_ns, digest))

    def flush(self) -> None:
        """Write the entries made since the last flush (one transaction)."""
        self.objects.flush()
        if not self.pending:
            return
        with self.index.transaction() as db:
            db.executemany("INSERT OR REPLACE INTO media_stats VALUES (?, ?, ?, ?, ?, ?, ?, ?)", self.pending)
        self.pending.clear()


_OBJECT_SCHEMA = """
CREATE TABLE IF NOT EXISTS object_stats (
    uri TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,  -- the store's last-modified, to the second
    etag TEXT NOT NULL,         -- ETag or version id as the download saw it ('' when not told)
    cached_ns INTEGER NOT NULL,  -- wall clock before the object was read and hashed
    digest TEXT NOT NULL
) WITHOUT ROWID
"""


class ObjectStats:
    """The same cache for objects in a store: (URI, size, last-modified) -> content digest, so a
    night over unchanged objects lists their folders and downloads nothing. A listing tells size
    and last-modified (pyarrow's listings carry no ETag); the store moves last-modified on every
    write, at one-second resolution, so an entry made less than `RACY_NS` after the object's
    last-modified is not trusted (a write within the same second could keep size and date)."""

    def __init__(self, index: KeyIndex, writable: bool = True, trusted: bool = True) -> None:
        self.index = index
        self.writable = writable
        self.trusted = trusted
        self.pending: list[tuple[str, int, int, str, int, str]] = []
        self.hits = self.misses = 0
        self.present = _open_table(index, writable, _OBJECT_SCHEMA, "object_stats")

    def digest(self, uri: str, size: int, mtime_ns: int) -> str | None:
        """The cached digest of `uri` if its size and last-modified are unchanged and not racy."""
        if not (self.trusted and self.present):
            self.misses += 1
            return None
        with self.index.lock:
            found = self.index.db.execute(
                "SELECT size, mtime_ns, cached_ns, digest FROM object_stats WHERE uri = ?", (uri,)
            ).fetchone()
        if found is None or (found[0], found[1]) != (size, mtime_ns) or mtime_ns >= found[2] - RACY_NS:
            self.misses += 1
            return None
        self.hits += 1
        return str(found[3])

    def remember(self, uri: str, size: int, mtime_ns: int, etag: str, cached_ns: int, digest: str) -> None:
        if self.writable:
            self.pending.append((uri, size, mtime_ns, etag, cached_ns, digest))

    def flush(self) -> None:
        if not self.pending:
            return
        with self.index.transaction() as db:
            db.executemany("INSERT OR REPLACE INTO object_stats VALUES (?, ?, ?, ?, ?, ?)", self.pending)
        self.pending.clear()
