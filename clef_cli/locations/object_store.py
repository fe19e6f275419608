"""Objects in the stores pyarrow's filesystems open (s3://, gs://, abfs://, hdfs://), read as media.

A record's object URI is untrusted text the job's credentials would act on, so this module is
strict about what it reads: a location is normalised once (`normalized`: the scheme in lower
case, `.` and `..` resolved as in a path, no query string, which could point the credentials at
another endpoint) and the same text is then tested against the roots (`is_under`, separator
aware) and read. Stamps (size, last-modified) come from one LIST per folder, cached per process,
so a night over unchanged objects costs a LIST per prefix and no GET (`store/media_stats.py`).

Failures are sorted three ways (`_classify`): a missing object or one the record may not read is
that record's `ObjectProblem`; throttling, 5xx answers and timeouts are retried with backoff and
then a transient `ObjectProblem` (the next run retries the record); what no record can cause (no
or expired credentials, access denied listing a folder, an unknown bucket, an endpoint that does
not answer) is an `ObjectStoreError`, which ends the job with one line (exit 1).
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, BinaryIO

from clef_cli.errors import ClefError, UsageError

_OBJECT_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)(/[^?#]*)?$")
NOT_OBJECT_SCHEMES = ("http", "https", "data", "file", "local")
"""Schemes that are not an object store: http(s) media go through the checked fetcher, data: URLs
are bytes, file:/local: are local paths."""
RETRY_DELAYS = (2.0,)
"""Seconds before each further try of a throttled, failing (5xx) or timed-out request, after the
filesystem's own retries (pyarrow's S3 client already retries with backoff, for about 6 s over
some 30 requests against a store that answers 503 throughout); then the record's error is
`transient` and the next run tries it again."""
LISTINGS_KEPT = 64
"""Folders whose listing a process keeps (each one LIST, paginated): bounded, so memory stays flat."""
CHUNK = 16 << 20
"""Bytes per ranged GET: an object up to 16 MiB costs one HEAD and one GET, memory stays bounded."""


class ObjectStoreError(ClefError):
    """The store refuses the job, not a record (credentials, a bucket, the endpoint): exit 1."""


class ObjectProblem(Exception):
    """One object cannot be used: that record's media error (`transient`: try again next run)."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class ObjectStamp:
    """What the store says of an object without reading it; equal stamps mean unchanged bytes
    (a new write moves last-modified; the racy rule in media_stats covers the same second)."""

    size: int
    mtime_ns: int
    etag: str = ""


def is_object_uri(location: str) -> bool:
    """A URI of an object store (`s3://b/k`), not http(s), data: or a local-filesystem URI."""
    match = _OBJECT_URI.match(location) if "://" in location else None
    return match is not None and match.group(1).lower() not in NOT_OBJECT_SCHEMES


def normalized(uri: str, folder: bool = False) -> str:
    """`uri` with its scheme in lower case and `.`/`..`/empty segments resolved; a query string,
    a fragment or a climb above the bucket is refused (an `ObjectProblem`). `folder`: end in `/`."""
    match = _OBJECT_URI.match(uri)
    if match is None:
        raise ObjectProblem(f"not a usable object URI (no query strings or fragments): {uri!r}")
    scheme, bucket, path = match.group(1).lower(), match.group(2), match.group(3) or "/"
    if not bucket:
        raise ObjectProblem(f"no bucket in {uri!r}")
    parts: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if not parts:
                raise ObjectProblem(f"{uri!r} climbs above its bucket")
            parts.pop()
        elif segment not in ("", "."):
            parts.append(segment)
    tail = "/".join(parts)
    if folder or (path.endswith("/") and tail):
        tail = tail + "/" if tail else ""
    return f"{scheme}://{bucket}/{tail}"


def object_uri(text: str, what: str) -> str:
    """`text` as one object's normalised URI (not a folder), or a usage error naming `what` (the
    option or table it came as)."""
    try:
        uri = normalized(text)
    except ObjectProblem as problem:
        raise UsageError(f"{what} {text!r}: {problem}") from None
    if uri.endswith("/"):
        raise UsageError(f"{what} {text!r}: give an object's URI, not a folder")
    return uri


def joined(folder: str, entry: str) -> str:
    """A relative media entry resolved against an object folder, as a path is against a folder."""
    return normalized(normalized(folder, folder=True) + entry)


def is_under(uri: str, root: str) -> bool:
    """Whether normalised `uri` lies inside the folder `root` (`s3://b/media-x/a` is not under
    `s3://b/media`): the root is compared with its trailing separator."""
    return uri.startswith(normalized(root, folder=True)) and not uri.endswith("/")


def parent(uri: str) -> str:
    return uri.rsplit("/", 1)[0] + "/"


# --------------------------------------------------------------------------- the filesystems

_filesystems: dict[str, tuple[Any, str]] = {}
_readable: set[str] = set()
"""Buckets this process has read an object from: access denied there is one object's ACL (the
record's error); before any read, it is the job's credentials (the job's error)."""
_lock = threading.Lock()


def _bucket_root(uri: str) -> str:
    scheme, _, rest = uri.partition("://")
    return f"{scheme}://{rest.partition('/')[0]}"


def filesystem(uri: str) -> tuple[Any, str]:
    """(pyarrow filesystem, its path for `uri`); one filesystem per bucket and process."""
    import pyarrow.fs as pafs

    root = _bucket_root(uri)
    key = uri[len(root) + 1 :]
    with _lock:
        found = _filesystems.get(root)
    if found is None:
        try:
            found = pafs.FileSystem.from_uri(root)
        except (ValueError, OSError, ImportError) as error:
            raise ObjectProblem(f"cannot open {root}: {_short(error)}") from None
        with _lock:
            _filesystems[root] = found
    fs, base = found
    return fs, (base.rstrip("/") + "/" + key) if key else base


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return re.sub(r"\s*\(Request ID: [^)]*\)", "", text)[:300]


_TRANSIENT = ("SLOW_DOWN", "THROTTL", "SERVICE_UNAVAILABLE", "INTERNAL_FAILURE", "REQUEST_TIMEOUT", "curlCode: 28")
_TRANSIENT_STATUS = re.compile(r"HTTP (status|response code):? (5\d\d|429)|timed? ?out", re.I)
_CREDENTIALS = ("INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "EXPIRED_TOKEN", "MISSING_AUTHENTICATION")
_UNREACHABLE = ("curlCode: 6,", "curlCode: 7,", "Could not connect", "Could not resolve")


def _classify(error: OSError, uri: str, listing: bool) -> BaseException:
    """The exception a store's failure becomes (see the module's note)."""
    text = _short(error)
    if isinstance(error, FileNotFoundError):
        return ObjectProblem(f"object not found: {uri}")
    if "NO_SUCH_BUCKET" in text:
        return ObjectStoreError(f"bucket of {uri} does not exist ({text})")
    if any(mark in text for mark in _CREDENTIALS):
        return ObjectStoreError(f"the store refused the job's credentials reading {uri} ({text})")
    if any(mark in text for mark in _UNREACHABLE):
        return ObjectStoreError(f"the object store does not answer for {uri} ({text})")
    if any(mark in text for mark in _TRANSIENT) or _TRANSIENT_STATUS.search(text):
        return ObjectProblem(f"the store kept failing for {uri}: {text}", transient=True)
    if "ACCESS_DENIED" in text or "AccessDenied" in text or "403" in text:
        with _lock:
            readable = _bucket_root(uri) in _readable
        if listing or not readable:  # the folder or the bucket: every record in it would fail alike
            return ObjectStoreError(f"access denied reading {uri} (check the job's credentials): {text}")
        return ObjectProblem(f"access denied: {uri}")
    return ObjectProblem(f"cannot read {uri}: {text}")


def _retried(uri: str, listing: bool, call: Any) -> Any:
    """`call()`, retried after each of `RETRY_DELAYS` while it fails transiently."""
    for delay in (*RETRY_DELAYS, None):
        try:
            return call()
        except OSError as error:
            problem = _classify(error, uri, listing)
        if not (isinstance(problem, ObjectProblem) and problem.transient) or delay is None:
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
    except ObjectProblem as problem:
        if problem.transient:
            raise
        infos = []  # no object under the prefix (an unknown bucket is an ObjectStoreError)
    return {
        info.base_name: ObjectStamp(info.size or 0, _seconds(info.mtime_ns or 0))
        for info in infos
        if info.type == pafs.FileType.File
    }


def stamp(uri: str) -> ObjectStamp:
    """The object's size and last-modified from its folder's listing (no GET, no HEAD)."""
    found = _listing(parent(uri)).get(uri.rsplit("/", 1)[1])
    if found is None:
        raise ObjectProblem(f"object not found: {uri}")
    return found


def forget() -> None:
    """Drop the listings and filesystems this process holds: a new job lists again, with the
    credentials and endpoint its environment names now."""
    with _lock:
        _listings.clear()
        _listing_locks.clear()
        _filesystems.clear()
        _readable.clear()


def _seconds(ns: int) -> int:
    """Stores date objects to the second (HTTP dates); listings and HEADs agree on that."""
    return ns // 1_000_000_000 * 1_000_000_000


def _head_stamp(handle: Any, size: int) -> ObjectStamp:
    meta = {key.lower(): value.decode("latin-1") if isinstance(value, bytes) else str(value)
            for key, value in (handle.metadata() or {}).items()}
    mtime = 0
    if modified := meta.get("last-modified"):
        try:
            from datetime import datetime

            moment = datetime.fromisoformat(modified.replace("Z", "+00:00")) if "T" in modified else None
            mtime = int((moment or parsedate_to_datetime(modified)).timestamp()) * 1_000_000_000
        except (ValueError, TypeError):
            mtime = 0
    etag = meta.get("etag", "").strip('"') or meta.get("versionid", "")
    return ObjectStamp(size, mtime, etag)


def read_object(uri: str, max_bytes: int, into: BinaryIO) -> ObjectStamp:
    """Copy the object into `into` after checking its size against `max_bytes` (before a byte
    of it is read); its stamp as the read saw it. Errors as in the module's note."""
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
    except _Oversize as oversize:
        raise ObjectProblem(f"object is {oversize.size} bytes, over the limit of {max_bytes}: {uri}") from None
    with _lock:
        _readable.add(_bucket_root(uri))
    return found


class _Oversize(Exception):
    def __init__(self, size: int) -> None:
        self.size = size
