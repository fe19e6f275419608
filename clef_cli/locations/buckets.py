"""The object-store client for what pyarrow's filesystems cannot do: conditional writes (a put
that succeeds only where no object is, `If-None-Match: *`), ranged reads, listings from an
offset. The remote store (store/remote/) commits its manifests with them; pyarrow's S3 layer
has no conditional write (apache/arrow#44281), so this room uses `obstore` (Rust object_store).

One client per bucket and process, built from the same environment as pyarrow's S3 filesystem,
so one credential story serves records, media, outputs and the store: `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` or `AWS_DEFAULT_REGION`,
`AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` (an `http://` endpoint is allowed because the URL
says so), and `AWS_PROFILE` with `~/.aws/credentials` and `~/.aws/config`
(`AWS_SHARED_CREDENTIALS_FILE`, `AWS_CONFIG_FILE`); instance roles, web identity and container
credentials come from obstore's own chain. `gs://` and `az://`/`abfs://` use obstore's readers
of their clouds' environments.

Failures are sorted by the one sorting function of every object read (`object_store._classify`):
a missing object is a `MissingObject`, throttling and 5xx answers are retried with backoff
(obstore's own, then `object_store.RETRY_DELAYS`) and then a transient `LocationProblem`, and
what the job cannot get past (credentials, an unknown bucket, an endpoint that does not answer)
an `ObjectStoreError` (exit 1, one line). A conditional write that finds an object is a
`WriteConflict`, for the caller to merge and retry.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from clef_cli.locations.failures import _profile_value
from clef_cli.locations.object_store import (
    ATTEMPTS,
    CONNECT_SECONDS,
    GIVE_UP_SECONDS,
    REQUEST_SECONDS,
    MissingObject,
    ObjectStoreError,
    _retried,
)
from clef_cli.locations.uris import LocationProblem, bucket_root

SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss")
"""The schemes a bucket client is made for (those obstore reaches)."""
CONNECT_TIMEOUT = timedelta(seconds=CONNECT_SECONDS)
"""The one connect timeout of every object client (`object_store.CONNECT_SECONDS`)."""
READ_TIMEOUT = timedelta(seconds=REQUEST_SECONDS)
"""No byte for this long fails a try (`object_store.REQUEST_SECONDS`, pyarrow's too). reqwest
counts it from the request's start, the body's upload included, so uploads go through a client
without it (`Bucket.uploads`)."""
REQUEST_TIMEOUT = timedelta(seconds=60)
"""A whole request (obstore times the request, not the wait for its next byte): a segment's upload."""
PATIENCE = timedelta(seconds=GIVE_UP_SECONDS)
"""How long obstore retries one request (5xx, throttling, a timeout) with backoff: an endpoint
that never answers ends a request in about `GIVE_UP_SECONDS` plus its last try."""
QUICK_PATIENCE = timedelta(seconds=GIVE_UP_SECONDS - 2)
"""The same for a `quick` client (the first request of a job: `ATTEMPTS` tries at most)."""
SMALL_PUT = 1 << 20
"""A put of bytes up to this size (a manifest, a hint, a probe) goes through the timed client."""

T = TypeVar("T")


class WriteConflict(Exception):
    """A conditional write found the object there (412 Precondition Failed, 409 Conflict)."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    """The object's key in its bucket (no scheme, no bucket)."""
    size: int
    modified: float
    """Seconds since the epoch."""
    etag: str = ""


def aws_config(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """obstore's S3 configuration from the environment pyarrow's S3 filesystem reads (the module's
    note): the environment first, then the profile's files."""
    env = dict(os.environ if environ is None else environ)
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    credentials = (env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials",)
    configs = (env.get("AWS_CONFIG_FILE") or "~/.aws/config",)
    named = (profile, f"profile {profile}") if profile != "default" else ("default",)

    def profile_value(name: str) -> str | None:
        return _profile_value(credentials, named, name) or _profile_value(configs, named, name)

    config: dict[str, Any] = {}
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    token = env.get("AWS_SESSION_TOKEN")
    if not (key and secret):
        key, secret = profile_value("aws_access_key_id"), profile_value("aws_secret_access_key")
        token = profile_value("aws_session_token")
    if key and secret:
        config |= {"access_key_id": key, "secret_access_key": secret} | ({"token": token} if token else {})
    elif _no_other_credentials(env):
        config["skip_signature"] = True  # as pyarrow: an unsigned request, refused by a private bucket
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or profile_value("region")
    config["region"] = region or "us-east-1"
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or profile_value("endpoint_url")
    if endpoint:
        config["endpoint"] = endpoint.rstrip("/")
    return config


def _no_other_credentials(env: dict[str, str]) -> bool:
    """No web identity or container credentials, and the instance's metadata turned off: obstore
    would otherwise wait on a metadata endpoint that is not there."""
    others = ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
    others += ("AWS_CONTAINER_CREDENTIALS_FULL_URI",)
    disabled = env.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true"
    return disabled and not any(env.get(name) for name in others)


def _make_store(root: str, quick: bool, upload: bool = False) -> Any:
    """One obstore store for the bucket `scheme://bucket`; `upload`: without the read timeout
    (`READ_TIMEOUT`), for bodies that take longer than it to send."""
    import obstore.store as stores

    scheme, _, bucket = root.partition("://")
    patience = QUICK_PATIENCE if quick else PATIENCE
    retry = {"max_retries": ATTEMPTS - 1 if quick else 10, "retry_timeout": patience}
    client: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT, "timeout": REQUEST_TIMEOUT}
    if not upload:
        client["read_timeout"] = READ_TIMEOUT
    try:
        if scheme in ("s3", "s3a"):
            config = aws_config()  # obstore reads its `token` as the session token
            client["allow_http"] = str(config.get("endpoint", "")).startswith("http://")
            return stores.S3Store(bucket, config=config, client_options=client, retry_config=retry)
        return stores.from_url(root, client_options=client, retry_config=retry)
    except Exception as error:  # obstore's configuration errors (an unknown key, a bad URL)
        text = " ".join(str(error).split())
        raise ObjectStoreError(f"{root}: cannot open it (its configuration: {text[:300]})", detail=text) from None


class Bucket:
    """One bucket's client: `uri` names objects inside it (`s3://bucket/key`). `store`: an obstore
    store to use instead of one built from the environment (`serve_from`)."""

    def __init__(self, root: str, quick: bool = False, store: Any = None) -> None:
        self.root = root
        self.store = _make_store(root, quick) if store is None else store
        self.uploads = _make_store(root, quick, upload=True) if store is None else store
        """The same without the read timeout: puts of files, streams and large bodies."""

    def key(self, uri: str) -> str:
        if bucket_root(uri) != self.root:
            raise ValueError(f"{uri} is not in {self.root}")
        return uri[len(self.root) + 1 :]

    def uri(self, key: str) -> str:
        return f"{self.root}/{key}"

    def _call(self, key: str, call: Callable[[], T]) -> T:
        """`call()`, its failures sorted (`_classify`) and transient ones tried again."""
        from obstore.exceptions import BaseError

        return _retried(self.uri(key), True, call, errors=(OSError, BaseError))

    def get(self, key: str) -> bytes:
        import obstore

        return self._call(key, lambda: bytes(obstore.get(self.store, key).bytes()))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes `start` to `end` (exclusive) of the object."""
        import obstore

        return self._call(key, lambda: bytes(obstore.get_range(self.store, key, start=start, end=end)))

    def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Several ranges of one object (obstore merges near ones into one request)."""
        import obstore

        starts, ends = [start for start, _ in ranges], [end for _, end in ranges]
        return self._call(
            key, lambda: [bytes(part) for part in obstore.get_ranges(self.store, key, starts=starts, ends=ends)]
        )

    def head(self, key: str) -> ObjectInfo:
        import obstore

        return _info(self._call(key, lambda: obstore.head(self.store, key)))

    def put(self, key: str, data: bytes | Path | Callable[[], Iterable[bytes]], create: bool = False) -> None:
        """Write the object: bytes, a local file, or a function that yields its pieces (called again
        on a retry; a multipart upload); `create`: only where none is (`If-None-Match: *`), else a
        `WriteConflict`."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        timed = isinstance(data, bytes) and len(data) <= SMALL_PUT
        store = self.store if timed else self.uploads

        def put() -> None:
            body: Any = data() if callable(data) else data
            try:
                obstore.put(store, key, body, mode="create" if create else "overwrite")
            except (AlreadyExistsError, PreconditionError) as error:
                raise WriteConflict(key) from error

        self._call(key, put)

    def download(self, key: str, target: Path) -> int:
        """Stream the object into the local file `target` (bounded memory); its size."""
        import obstore

        def copy() -> int:
            size = 0
            with open(target, "wb") as handle:
                for chunk in obstore.get(self.store, key).stream(min_chunk_size=8 << 20):
                    handle.write(chunk)
                    size += len(chunk)
            return size

        return self._call(key, copy)

    def delete(self, key: str) -> None:
        import obstore

        with contextlib.suppress(MissingObject):  # gone already
            self._call(key, lambda: obstore.delete(self.store, key))

    def list(self, prefix: str, offset: str | None = None) -> Iterator[ObjectInfo]:
        """The objects under `prefix` (a key prefix) in key order, after `offset` when given."""
        import obstore

        def pages() -> list[Any]:
            listed = obstore.list(self.store, prefix, offset=offset) if offset else obstore.list(self.store, prefix)
            return [item for page in listed for item in page]

        for item in self._call(prefix, pages):
            yield _info(item)

    def top_level(self, prefix: str) -> list[str]:
        """The names directly under the folder `prefix` (`a/b/`), folders ending in `/`: one request."""
        import obstore

        found = self._call(prefix, lambda: obstore.list_with_delimiter(self.store, prefix.rstrip("/") or None))
        folders = [name[len(prefix) :].rstrip("/") + "/" for name in found["common_prefixes"]]
        return folders + [str(item["path"])[len(prefix) :] for item in found["objects"]]


def _info(meta: Any) -> ObjectInfo:
    modified = meta.get("last_modified")
    return ObjectInfo(
        key=str(meta["path"]),
        size=int(meta.get("size") or 0),
        modified=modified.timestamp() if modified is not None else 0.0,
        etag=str(meta.get("e_tag") or "").strip('"'),
    )


_buckets: dict[tuple[str, bool], Bucket] = {}
_lock = threading.Lock()
_served: dict[str, Bucket] = {}
"""Buckets served from a store a caller gave (`serve_from`), by root (`s3://name`)."""


def serve_from(root: str, store: Any | None) -> None:
    """Serve the bucket `root` (`s3://name`) from `store`, an obstore store the caller built (a
    test's `obstore.store.MemoryStore`: the store's logic tried in process, no server), until
    `serve_from(root, None)`; `forget` leaves it. Reached only by a call from Python: no location
    a user writes names a store of this kind."""
    with _lock:
        if store is None:
            _served.pop(root, None)
        else:
            _served[root] = Bucket(root, store=store)


def bucket(uri: str, quick: bool = False) -> Bucket:
    """The client of the bucket `uri` lies in (one per bucket and process; `quick`: the
    impatient one, for a job's first request)."""
    root = bucket_root(uri)
    scheme = root.partition("://")[0]
    if scheme not in SCHEMES:
        raise LocationProblem(f"{uri}: clef's store reaches {', '.join(SCHEMES)} URIs, not {scheme}://")
    with _lock:
        found = _served.get(root) or _buckets.get((root, quick))
    if found is None:
        found = Bucket(root, quick)
        with _lock:
            _buckets[(root, quick)] = found
    return found


def forget() -> None:
    """Drop the clients: the next job builds them from its environment as it is then."""
    with _lock:
        _buckets.clear()
