"""A bucket in memory for locations/' own code (uploads, object reads, bucket checks) in the test's
process: an obstore `MemoryStore` served as `s3://clef-memory` (`buckets.serve_from`) and the
same objects seen through a pyarrow filesystem (`object_store`'s reads), so each test's planted
bug is the one it runs. A server's refusals are planted at the obstore call boundary, worded as
an S3 server words them (`Refusals`)."""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import datetime

import obstore
import pyarrow as pa
import pyarrow.fs as pafs
from obstore.exceptions import GenericError, PermissionDeniedError
from obstore.store import MemoryStore

from clef_cli.locations import buckets, object_store

NAME = "clef-memory"
ROOT = f"s3://{NAME}"
_get, _head, _list, _list_with_delimiter = obstore.get, obstore.head, obstore.list, obstore.list_with_delimiter
put_object = obstore.put
"""The real calls, kept for `MemoryFS` (pyarrow's view) and a test's setup, which `Refusals` must
not refuse or record."""


def denied(key: str = "k") -> PermissionDeniedError:
    """obstore's error for S3's 403 AccessDenied."""
    return PermissionDeniedError(
        f"The operation lacked the necessary privileges to complete for path {key}: Error performing PUT "
        f"http://127.0.0.1:9/{NAME}/{key}: Server returned non-2xx status code: 403 Forbidden: "
        '<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>'
    )


def slow_down(key: str = "k") -> GenericError:
    """obstore's error for S3's 503 SlowDown, its retries spent."""
    return GenericError(
        f"Generic S3 error: Error performing PUT http://127.0.0.1:9/{NAME}/{key} after 2 retries: "
        "HTTP status server error (503 Service Unavailable): <Error><Code>SlowDown</Code></Error>"
    )


def no_such_bucket(key: str = "k") -> GenericError:
    """obstore's error for S3's 404 NoSuchBucket."""
    return GenericError(
        f"Generic S3 error: Error performing PUT http://127.0.0.1:9/{NAME}/{key}: Server returned non-2xx status "
        "code: 404 Not Found: <Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message>"
    )


def odd(key: str = "k") -> GenericError:
    """An answer no rule of `failures.classify` knows."""
    return GenericError(f"Generic S3 error: the server said something new about {key}")


class MemoryFS(pafs.FileSystemHandler):
    """pyarrow's view of `store` as the bucket `name`, S3's way: a key is a file, a prefix of keys
    a folder, the bucket itself a folder; `fail`, when set, is raised by every request."""

    def __init__(self, name: str, store: MemoryStore) -> None:
        self.name, self.store = name, store
        self.fail: BaseException | None = None
        self.exists = True
        """False: the bucket is not there (every path not found, as pyarrow's S3 answers)."""
        self.listings = 0
        """LIST requests (one per folder listed)."""

    def _key(self, path: str) -> str | None:
        path = path.strip("/")
        if path == self.name:
            return ""
        return path[len(self.name) + 1 :] if path.startswith(self.name + "/") else None

    def _info(self, path: str, meta: dict) -> pafs.FileInfo:
        moment: datetime = meta["last_modified"]
        return pafs.FileInfo(path, pafs.FileType.File, size=meta["size"], mtime_ns=int(moment.timestamp() * 1e9))

    def get_file_info(self, paths):
        if self.fail is not None:
            raise self.fail
        found = []
        for path in paths:
            key = self._key(path)
            if key is None or not self.exists:
                found.append(pafs.FileInfo(path, pafs.FileType.NotFound))
            elif key == "":
                found.append(pafs.FileInfo(path, pafs.FileType.Directory))
            else:
                try:
                    found.append(self._info(path, _head(self.store, key)))
                except FileNotFoundError:
                    under = [item for page in _list(self.store, key + "/") for item in page]
                    found.append(pafs.FileInfo(path, pafs.FileType.Directory if under else pafs.FileType.NotFound))
        return found

    def get_file_info_selector(self, selector):
        self.listings += 1
        if self.fail is not None:
            raise self.fail
        key = self._key(selector.base_dir) or ""
        if selector.recursive:  # every object under the folder, at any depth
            return [self._info(f"{self.name}/{item['path']}", item) for page in _list(self.store, key) for item in page]
        listed = _list_with_delimiter(self.store, key or None)
        folders = [pafs.FileInfo(f"{self.name}/{name}", pafs.FileType.Directory) for name in listed["common_prefixes"]]
        return folders + [self._info(f"{self.name}/{item['path']}", item) for item in listed["objects"]]

    def open_input_file(self, path):
        if self.fail is not None:
            raise self.fail
        key = self._key(path)
        try:
            data = bytes(_get(self.store, key).bytes())
        except FileNotFoundError:
            raise FileNotFoundError(
                f"Path does not exist '{path}'. Detail: [errno 2] No such file or directory"
            ) from None
        return pa.PythonFile(io.BytesIO(data), mode="r")

    def get_type_name(self):
        return "memory-bucket"

    def normalize_path(self, path):
        return path

    def equals(self, other):
        return self is other

    def _unused(self, *args, **kwargs):
        raise NotImplementedError

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = _unused
    move = copy_file = open_input_stream = open_output_stream = open_append_stream = _unused


class S3Handle:
    """An input file as pyarrow's S3 filesystem opens it: its `metadata()` the object's headers
    (a dict of bytes, as pyarrow 26 gives them)."""

    def __init__(self, native, headers: dict[str, bytes]) -> None:
        self.native, self.headers = native, headers

    def size(self) -> int:
        return self.native.size()

    def read(self, count: int) -> bytes:
        return self.native.read(count)

    def metadata(self) -> dict[str, bytes]:
        return self.headers

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.native.close()


class S3View:
    """pyarrow's filesystem over `handler`, its input files `S3Handle`s."""

    def __init__(self, handler: MemoryFS) -> None:
        self.handler, self.fs = handler, pafs.PyFileSystem(handler)
        self.opened = 0

    def get_file_info(self, what):
        return self.fs.get_file_info(what)

    def open_input_file(self, path: str) -> S3Handle:
        self.opened += 1
        native = self.fs.open_input_file(path)
        meta = _head(self.handler.store, self.handler._key(path))
        moment = meta["last_modified"].strftime("%Y-%m-%dT%H:%M:%SZ")
        headers = {"Content-Length": str(meta["size"]).encode(), "ETag": f'"{meta["e_tag"].strip(chr(34))}"'.encode()}
        return S3Handle(native, headers | {"Last-Modified": moment.encode()})


def served(monkeypatch, root: str = ROOT) -> tuple[MemoryStore, MemoryFS]:
    """A new empty bucket at `root`, served to obstore's and pyarrow's clients of this process
    (undone by `forget_served`); no retry waits."""
    store = MemoryStore()
    monkeypatch.setattr(object_store, "RETRY_DELAYS", ())
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "clef-test")  # the job has credentials: a 403 is access denied
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "clef-test-secret")
    handler = MemoryFS(root.partition("://")[2], store)
    buckets.serve_from(root, store)
    object_store._filesystems[root] = (S3View(handler), handler.name)
    return store, handler


def forget_served(*roots: str) -> None:
    for root in roots:
        buckets.serve_from(root, None)
    object_store.forget()


def keys_in(store: MemoryStore) -> dict[str, bytes]:
    """Every object in `store`, key -> bytes."""
    paths = [item["path"] for page in _list(store) for item in page]
    return {path: bytes(_get(store, path).bytes()) for path in paths}


class Refusals:
    """obstore's `put`, `delete` and `list` as this process calls them, each refused with an
    error for the keys a planted rule picks (and otherwise the real call); `calls` records
    (kind, key, keyword arguments) of every call."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[tuple[str, str, dict]] = []
        self.stores: list = []
        """The client of each call."""
        self.rules: dict[str, tuple[Callable[[str], BaseException], Callable[[str], bool]]] = {}
        for kind in ("put", "delete", "list"):
            monkeypatch.setattr(obstore, kind, self._wrapped(kind, getattr(obstore, kind)))

    def refuse(self, kind: str, error: Callable[[str], BaseException], when: Callable[[str], bool] = bool) -> None:
        """Refuse every `kind` call whose key `when` picks (every key by default) with `error(key)`."""
        self.rules[kind] = (error, when)

    def kinds(self) -> list[str]:
        return [kind for kind, _, _ in self.calls]

    def _wrapped(self, kind: str, real: Callable) -> Callable:
        def call(store, key=None, *args, **kwargs):
            self.calls.append((kind, key or "", kwargs))
            self.stores.append(store)
            if kind in self.rules:
                error, when = self.rules[kind]
                if when(key or ""):
                    raise error(key or "")
            return real(store, key, *args, **kwargs) if key is not None else real(store, *args, **kwargs)

        return call
