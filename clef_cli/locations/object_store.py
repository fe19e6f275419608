"""The one client for objects in the stores pyarrow's filesystems open (s3://, gs://, abfs://,
hdfs://): one filesystem per bucket, retries, listings, stamps and reads. Locations come here
normalised (`uris.normalized`) and already fenced (`fence`). Stamps (size, last-modified) come
from one LIST per folder, cached per process, so a night over unchanged objects costs a LIST per
prefix and no GET (`store/media_stats.py`).

Every object the job touches goes through here, wherever it is (an input, a record's media, the
output, the store), so a store's failure reads the same and takes the same time everywhere:

- One timeout policy (`filesystem`): an S3 request gets `CONNECT_SECONDS` to connect and fails
  when no byte comes for `REQUEST_SECONDS`, tried `ATTEMPTS` times by the client with its own
  backoff, so an endpoint that does not answer ends the job in about ten seconds.
- One sorting of failures (`_classify`, the contract every caller of a store follows, pyarrow's
  or another client's; `_retried` asks through it): a missing object, or one the record may not
  read, is that record's `LocationProblem`; throttling, 5xx answers and timeouts of a store that
  has answered this process are retried after each of `RETRY_DELAYS` and then a transient
  `LocationProblem` (the next run retries the record); what no record can cause is an
  `ObjectStoreError` with one line (exit 1): missing, expired or refused credentials, access
  denied listing a folder or before any object of the bucket was read, an unknown bucket
  (`NoSuchBucket`, exit 2), an endpoint that has not answered this process (refused, unknown, or timed
  out, however often tried). The causes, their words and exit codes: `failures.py`.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, BinaryIO

from clef_cli.locations.failures import GIVE_UP_SECONDS as GIVE_UP_SECONDS
from clef_cli.locations.failures import NO_BUCKET, classify, failure_of, named
from clef_cli.locations.failures import MissingObject as MissingObject
from clef_cli.locations.failures import NoSuchBucket as NoSuchBucket
from clef_cli.locations.failures import ObjectStoreError as ObjectStoreError
from clef_cli.locations.uris import LocationProblem, bucket_root, parent

RETRY_DELAYS = (2.0,)
"""Seconds before each further try of a throttled, failing (5xx) or timed-out request of a store
that has answered this process, after the client's own `ATTEMPTS`; then the record's error is
`transient` and the next run tries it again."""
CONNECT_SECONDS = 2.0
"""An S3 connection not made in this time is a failed try (the AWS SDK's default is 1 s)."""
REQUEST_SECONDS = 3.0
"""A request that receives no byte for this long is a failed try (curl's low-speed limit; the
time a large object takes to arrive does not count)."""
ATTEMPTS = 3
"""Tries of one request by the S3 client (with its backoff), then `RETRY_DELAYS` for a store that
has answered: an endpoint that never answers fails in about 3 × 2-3 s plus the backoff."""
LISTINGS_KEPT = 64
"""Folders whose listing a process keeps (each one LIST, paginated): bounded, so memory stays flat."""
CHUNK = 16 << 20
"""Bytes per ranged GET: an object up to 16 MiB costs one HEAD and one GET, memory stays bounded."""


@dataclass(frozen=True)
class ObjectStamp:
    """What the store says of an object without reading it; equal stamps mean unchanged bytes
    (a new write moves last-modified; the racy rule in media_stats covers the same second)."""

    size: int
    mtime_ns: int
    etag: str = ""


# --------------------------------------------------------------------------- the filesystems

_filesystems: dict[str, tuple[Any, str]] = {}
_readable: set[str] = set()
"""Buckets this process has read an object from: access denied there is one object's ACL (the
record's error); before any read, it is the job's credentials (the job's error)."""
_answered: set[str] = set()
"""Buckets whose store has answered a request of this process: a timeout there is the moment's
(retried, then transient); before any answer, the endpoint's (the job's error)."""
_lock = threading.Lock()


def filesystem(uri: str) -> tuple[Any, str]:
    """(pyarrow filesystem, its path for `uri`); one filesystem per bucket and process."""
    import pyarrow.fs as pafs

    root = bucket_root(uri)
    key = uri[len(root) + 1 :]
    with _lock:
        found = _filesystems.get(root)
    if found is None:
        try:
            opened, base = pafs.FileSystem.from_uri(root)
            found = _with_policy(opened), base
        except (ValueError, OSError, ImportError) as error:
            raise LocationProblem(f"cannot open {root}: {_short(error)}") from None
        with _lock:
            _filesystems[root] = found
    fs, base = found
    return fs, (base.rstrip("/") + "/" + key) if key else base


def _with_policy(fs: Any) -> Any:
    """`fs` (as `from_uri` configured it from the URI and the environment) with the module's
    timeouts and tries; a filesystem other than S3 as it is."""
    import pyarrow.fs as pafs

    if not isinstance(fs, pafs.S3FileSystem):
        return fs
    _, (options,) = fs.__reduce__()  # every option from_uri set (region, endpoint, credentials)
    options |= {"connect_timeout": CONNECT_SECONDS, "request_timeout": REQUEST_SECONDS}
    return pafs.S3FileSystem(**options, retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=ATTEMPTS))


def _short(error: BaseException) -> str:
    text = str(error).split("Debug source:", 1)[0]  # obstore appends its error's whole tree
    text = " ".join(text.split())
    return re.sub(r"\s*\(Request ID: [^)]*\)", "", text)[:300]


def _classify(error: BaseException, uri: str, listing: bool = False) -> BaseException:
    """What a store's failure for `uri` becomes, the same wherever the object is and whichever
    client met it (`failures.classify`; the module's note). `listing`: a folder's listing."""
    root = bucket_root(uri)
    with _lock:
        answered, readable = root in _answered, root in _readable
    return classify(error, uri, answered, readable, listing)


def _retried(uri: str, listing: bool, call: Any, errors: tuple[type[BaseException], ...] = (OSError,)) -> Any:
    """`call()`, a request to the store of `uri`, its failure sorted (`_classify`) and retried
    after each of `RETRY_DELAYS` while transient; the store marked as having answered. `errors`:
    the failures of the client `call` uses (pyarrow's are `OSError`s)."""
    for delay in (*RETRY_DELAYS, None):
        try:
            found = call()
        except errors as error:
            problem = _classify(error, uri, listing)
        else:
            with _lock:
                _answered.add(bucket_root(uri))
            return found
        if not (isinstance(problem, LocationProblem) and problem.transient) or delay is None:
            raise problem
        time.sleep(delay)
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- stamps and bytes

_listings: OrderedDict[str, dict[str, ObjectStamp]] = OrderedDict()
_listing_locks: dict[str, threading.Lock] = {}


def _listing(folder: str) -> dict[str, ObjectStamp]:
    """Name -> stamp of the objects directly in `folder`: one LIST (paginated) per process."""
    with _lock:
        one_at_a_time = _listing_locks.setdefault(folder, threading.Lock())
    with one_at_a_time:  # threads keying the same folder wait for its one LIST
        with _lock:
            if folder in _listings:
                _listings.move_to_end(folder)
                return _listings[folder]
        found = _list(folder)
        with _lock:
            _listings[folder] = found
            while len(_listings) > LISTINGS_KEPT:
                _listing_locks.pop(_listings.popitem(last=False)[0], None)
        return found


def _list(folder: str) -> dict[str, ObjectStamp]:
    import pyarrow.fs as pafs

    fs, path = filesystem(folder)
    selector = pafs.FileSelector(path.rstrip("/"), recursive=False)
    try:
        infos = _retried(folder, True, lambda: fs.get_file_info(selector))
    except LocationProblem as problem:
        if problem.transient:
            raise
        infos = []  # no object under the prefix (an unknown bucket is an ObjectStoreError)
    return {
        info.base_name: ObjectStamp(info.size or 0, _seconds(info.mtime_ns or 0))
        for info in infos
        if info.type == pafs.FileType.File
    }


def stamp(uri: str, what: str = "media") -> ObjectStamp:
    """The object's size and last-modified from its folder's listing (no GET, no HEAD); the
    job's error named by `what` and `uri`, not the folder listed."""
    try:
        found = _listing(parent(uri)).get(uri.rsplit("/", 1)[1])
    except ObjectStoreError as error:
        raise named(error, what, uri) from None
    if found is None:
        raise LocationProblem(f"object not found: {uri}")
    return found


def check_bucket(uri: str, what: str) -> None:
    """After an object was not found: a `NoSuchBucket` naming `what` and `uri` when its bucket is
    not there either (a HEAD of an object in a missing bucket is a bare 404, as a missing object's)."""
    import pyarrow.fs as pafs

    fs, _ = filesystem(uri)
    root = bucket_root(uri)
    try:
        found = _retried(root, True, lambda: fs.get_file_info(root.partition("://")[2])).type
    except MissingObject:
        found = pafs.FileType.NotFound
    except ObjectStoreError as error:
        raise named(error, what, uri) from None
    if found == pafs.FileType.NotFound:
        raise failure_of(NO_BUCKET, what, uri)


def forget() -> None:
    """Drop the listings and filesystems this process holds: a new job lists again, with the
    credentials and endpoint its environment names now."""
    with _lock:
        _listings.clear()
        _listing_locks.clear()
        _filesystems.clear()
        _readable.clear()
        _answered.clear()


def _seconds(ns: int) -> int:
    """Stores date objects to the second (HTTP dates); listings and HEADs agree on that."""
    return ns // 1_000_000_000 * 1_000_000_000


def _head_stamp(handle: Any, size: int) -> ObjectStamp:
    meta = {
        key.lower(): value.decode("latin-1") if isinstance(value, bytes) else str(value)
        for key, value in (handle.metadata() or {}).items()
    }
    mtime = 0
    if modified := meta.get("last-modified"):
        try:
            from datetime import datetime

            try:  # ISO (pyarrow's S3), else an HTTP date (whose "GMT" has a T too)
                moment = datetime.fromisoformat(modified.replace("Z", "+00:00"))
            except ValueError:
                moment = parsedate_to_datetime(modified)
            mtime = int(moment.timestamp()) * 1_000_000_000
        except (ValueError, TypeError):
            mtime = 0
    etag = meta.get("etag", "").strip('"') or meta.get("versionid", "")
    return ObjectStamp(size, mtime, etag)


def read_object(uri: str, max_bytes: int, into: BinaryIO, what: str = "media") -> ObjectStamp:
    """Copy the object into `into` after checking its size against `max_bytes` (before a byte
    of it is read); its stamp as the read saw it. Errors as in the module's note, the job's
    named by `what` (the option, or a record's media) and `uri`."""
    fs, path = filesystem(uri)

    def copy() -> ObjectStamp:
        into.seek(0)
        into.truncate()
        with fs.open_input_file(path) as handle:
            size = handle.size()
            if size > max_bytes:
                raise _Oversize(size)
            found = _head_stamp(handle, size)
            while chunk := handle.read(CHUNK):
                into.write(chunk)
        return found

    try:
        found = _retried(uri, False, copy)
    except ObjectStoreError as error:
        raise named(error, what, uri) from None
    except _Oversize as oversize:
        raise LocationProblem(f"object is {oversize.size} bytes, over the limit of {max_bytes}: {uri}") from None
    with _lock:
        _readable.add(bucket_root(uri))
    return found


class _Oversize(Exception):
    def __init__(self, size: int) -> None:
        self.size = size
