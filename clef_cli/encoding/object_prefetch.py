"""A window's objects copied into the job's spool before its records are encoded, a few at a time.

A night that rescores records over unchanged objects (a changed state or question) keys them
from the store's cache and reads no object while keying, so without this each encoding worker
would read its records' objects itself, one after the other, and wait on the network longer than
it decodes (docs/benchmarks.md: the device busy half the time at 30 ms a request). Instead the
records of a planning window are handed to `ObjectPrefetch.records` before they are planned: the
objects not yet in the spool are read into it by `PREFETCH_REQUESTS` threads, and each record's
future is done once its own objects are there (the record is planned then).

An object still costs one HEAD and one GET per job: the encoder reads the spool's copy, or the
failure kept there, which is the record error it would have raised itself (a missing object that
record's media error, a failure worth retrying transient). Each read streams to its spool file, so
memory holds a chunk per read in flight, never a window's bytes. The fence is asked before any
request: an entry it refuses is left to the encoder, which refuses it with the same message. What
no record causes (`ObjectStoreError`: credentials, a bucket) fails the futures, so the job ends
with it as it would have in the encoder. A stop request ends the prefetch at once: reads not
started are dropped and one in flight stops at its next chunk, their records' futures failing
with `PrefetchStopped`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO

from clef_cli.encoding.media_limits import MediaLimits
from clef_cli.encoding.remote_objects import object_uris, spool_filler
from clef_cli.encoding.remote_spool import RemoteSpool
from clef_cli.inputs.records import Record
from clef_cli.locations.remote_fetch import FetchError

PREFETCH_REQUESTS = 8
"""Objects read at once. A read waits on the network (a HEAD and a GET: 60 ms at 30 ms a
request) where a worker decodes a 720p image in about 30 ms, so one worker needs two reads in
flight to never wait, and eight keep up with four workers; as many as keying reads at once
(`MediaHasher.fetch_threads`), and far below what a store serves a prefix (S3: 5,500 GETs a
second). Memory in flight is at most this many chunks (`object_store.CHUNK`)."""


class PrefetchStopped(Exception):
    """The job was asked to stop (or the prefetch closed) before a record's objects were read."""


class ObjectPrefetch:
    """Reads of one job's objects into its spool (`MediaLimits.remote_spool`), ahead of the
    encoder; a job without a spool on this machine (a dry run without one, a Ray actor on a node
    that does not see it) has nothing to fill, and every record is ready at once."""

    def __init__(
        self, limits: MediaLimits, stop: threading.Event | None = None, requests: int = PREFETCH_REQUESTS
    ) -> None:
        folder = limits.remote_spool
        self.spool = RemoteSpool(folder) if folder is not None and folder.is_dir() else None
        self.limits = limits
        self.stop = stop or threading.Event()
        self.requests = requests
        self._closed = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._reading: dict[str, Future] = {}
        """Reads started and not yet in the spool (or failed for the job, not for a record)."""
        self._lock = threading.Lock()

    def records(self, records: Iterable[Record]) -> list[Future | None]:
        """Per record, a future done when its objects are in the spool (None: none to read); all
        the records' reads are started before this returns."""
        return [self._record(record) for record in records]

    def _record(self, record: Record) -> Future | None:
        if self.spool is None or not record.has_media:
            return None
        reads = [read for uri in object_uris(record, self.limits) if (read := self._read(uri)) is not None]
        return _all_of(reads) if reads else None

    def _read(self, uri: str) -> Future | None:
        """The read of `uri` into the spool (started now, or the one already started); None when
        the spool holds it (or its failure) already."""
        assert self.spool is not None
        with self._lock:
            if (reading := self._reading.get(uri)) is not None:
                return reading
            if self.spool.holds(uri):
                return None
            if self._closed.is_set():
                reading = Future()
                reading.set_exception(PrefetchStopped())
                return reading
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.requests, thread_name_prefix="clef-prefetch")
            reading = self._reading[uri] = self._pool.submit(self._copy, uri)
            return reading

    def _stopped(self) -> bool:
        return self.stop.is_set() or self._closed.is_set()

    def _copy(self, uri: str) -> None:
        """One object into the spool, on a prefetch thread."""
        assert self.spool is not None
        if self._stopped():
            raise PrefetchStopped
        fill = spool_filler(uri, self.limits, [])
        with contextlib.suppress(FetchError):  # kept in the spool: the record's error, the encoder raises it
            self.spool.filled(uri, lambda handle: fill(_StopChecked(handle, self._stopped)))
        with self._lock:  # in the spool now: the next record naming it reads nothing
            self._reading.pop(uri, None)

    def close(self) -> None:
        """Drop the reads not started and wait for those in flight to stop at their next chunk."""
        self._closed.set()
        with self._lock:
            pool = self._pool
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ObjectPrefetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _StopChecked:
    """A spool file that takes no further chunk once the job is asked to stop."""

    def __init__(self, handle: BinaryIO, stopped: Callable[[], bool]) -> None:
        self.handle = handle
        self.stopped = stopped

    def write(self, chunk: bytes) -> int:
        if self.stopped():
            raise PrefetchStopped
        return self.handle.write(chunk)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.handle.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        return self.handle.truncate(size)


def _all_of(reads: list[Future]) -> Future:
    """A future done when every read is: its error the first read's error (a cancelled read is
    `PrefetchStopped`), never cancelled itself."""
    joined: Future = Future()
    left = [len(reads)]
    lock = threading.Lock()

    def done(read: Future) -> None:
        error = PrefetchStopped() if read.cancelled() else read.exception()
        with lock:
            left[0] -= 1
            if joined.done():
                return
            if error is not None:
                joined.set_exception(error)
            elif left[0] == 0:
                joined.set_result(None)

    for read in reads:
        read.add_done_callback(done)
    return joined
