"""The record key's part for media in an object store: the SHA-256 of the object's bytes, so
the same bytes key alike from a local file, a data: URL or a bucket (`record_key.py`).

An object is looked up in its folder's listing (one LIST per folder per job): an unchanged one
(same size and last-modified, `media_stats.ObjectStats`) is keyed from the store's cache with no
GET; any other is read once, hashed and, in a job, spooled for the encoding workers
(`remote_spool`), so the key hashes exactly the bytes decoded. An entry that cannot be used is
keyed by why (`refused:`, `missing:`, `oversize:`, `unfetched:` for a failure worth retrying), so
the record is tried again once that changes. Errors no record causes (`ObjectStoreError`) end the
job instead.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import BinaryIO

from clef_cli.encoding.media_limits import MediaLimits
from clef_cli.encoding.remote_objects import spool_filler
from clef_cli.encoding.remote_spool import RemoteSpool
from clef_cli.locations.object_store import ObjectStamp, read_object, stamp
from clef_cli.locations.remote_fetch import FetchError
from clef_cli.locations.uris import LocationProblem
from clef_cli.store.media_stats import ObjectStats


class _HashingSink:
    """A write-only handle that hashes what is written (an object keyed without a spool)."""

    def __init__(self) -> None:
        self.hasher = hashlib.sha256()

    def write(self, chunk: bytes) -> int:
        self.hasher.update(chunk)
        return len(chunk)

    def seek(self, offset: int) -> int:  # a retried read starts again
        self.hasher = hashlib.sha256()
        return 0

    def truncate(self) -> int:
        return 0


@dataclass
class ObjectKeys:
    """Keys of object entries for one job (a bounded cache: an object named twice is keyed once)."""

    limits: MediaLimits
    stats: ObjectStats | None = None
    cache_size: int = 65536
    _keys: OrderedDict[str, str] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def entry(self, uri: str) -> str:
        """The key part of an object the fence allowed (`fence.place`: a normalised URI); threads
        may call it at once (`MediaHasher.prefetch`)."""
        with self._lock:
            if uri in self._keys:
                self._keys.move_to_end(uri)
                return self._keys[uri]
        keyed = self._key(uri)
        with self._lock:
            self._keys[uri] = keyed
            if len(self._keys) > self.cache_size:
                self._keys.popitem(last=False)
        return keyed

    def _key(self, uri: str) -> str:
        try:
            listed = stamp(uri)
        except LocationProblem as problem:
            return f"unfetched:{uri}" if problem.transient else f"missing:{uri}"
        if listed.size > self.limits.max_file_bytes:
            return f"oversize:{uri}:{listed.size}"
        if self.stats is not None and (cached := self.stats.digest(uri, listed.size, listed.mtime_ns)) is not None:
            return cached
        before = time.time_ns()  # dates the cache entry: taken before the read (media_stats.py)
        seen: list[ObjectStamp] = []
        try:
            digest = "sha256:" + self._read(uri, seen)
        except (LocationProblem, FetchError) as problem:
            return f"unfetched:{uri}" if problem.transient else f"refused:{uri}:{problem}"
        if self.stats is not None and seen:
            read = seen[-1]
            self.stats.remember(uri, read.size, read.mtime_ns or listed.mtime_ns, read.etag, before, digest)
        return digest

    def _read(self, uri: str, seen: list[ObjectStamp]) -> str:
        if self.limits.remote_spool is not None:
            return RemoteSpool(self.limits.remote_spool).digest_with(uri, spool_filler(uri, self.limits, seen))
        sink = _HashingSink()
        seen.append(read_object(uri, self.limits.max_file_bytes, _as_handle(sink)))
        return sink.hasher.hexdigest()


def _as_handle(sink: _HashingSink) -> BinaryIO:
    return sink  # type: ignore[return-value]
