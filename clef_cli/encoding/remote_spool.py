"""A job's remote media (http(s) URLs, objects in a store), fetched once: the record key hashes
a URL's bytes when the job keys its records, and the encoding workers decode those same bytes
from here instead of asking again.
So a URL costs one request per job, and a key never describes bytes other than the ones decoded
(a file replaced under the same URL gets a new key and is scored again).

Each URL's body lives in a file named by the URL's SHA-256; a URL that was not fetched leaves
why (and whether that may pass) in `NAME.failed`, so the record's error is the same everywhere.
The folder lives only as long as its job.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from clef_cli.locations.remote_fetch import FetchError, FetchPolicy, Resolver, fetch_into, resolve
from clef_cli.release import file_sha256


class RemoteSpool:
    """The fetched bytes of one job's remote media, in `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @classmethod
    def fresh(cls, folder: Path) -> RemoteSpool:
        """An empty spool (whatever a killed job left there is dropped)."""
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return cls(folder)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def _paths(self, url: str) -> tuple[Path, Path]:
        name = hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()
        return self.folder / name, self.folder / f"{name}.failed"

    def digest(self, url: str, policy: FetchPolicy, resolver: Resolver = resolve) -> str:
        """The SHA-256 of the bytes `url` gave this job, fetching it if no one has yet; a
        `FetchError` (the stored one, for a URL that failed before)."""
        return self.digest_with(url, lambda handle: fetch_into(url, policy, handle, resolver))

    def digest_with(self, name: str, fill: Callable[[BinaryIO], object]) -> str:
        """`digest` for any source: `fill` writes the bytes of `name` (a URL or an object's URI)
        into the handle it is given, or raises a `FetchError`, which is kept as that name's."""
        return file_sha256(self.filled(name, fill))

    def holds(self, name: str) -> bool:
        """Whether this job already has `name`'s bytes or its failure (nothing to fetch)."""
        body, failed = self._paths(name)
        return body.exists() or failed.exists()

    def filled(self, name: str, fill: Callable[[BinaryIO], object]) -> Path:
        """The file of `name`'s bytes, written by `fill` if no one has yet (`digest_with`)."""
        body, failed = self._paths(name)
        if body.exists():
            return body
        self._raise_failure(failed)
        partial = self.folder / f".{body.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with partial.open("wb") as handle:
                fill(handle)
        except FetchError as error:
            partial.unlink(missing_ok=True)
            record = json.dumps({"message": str(error), "transient": error.transient})
            failed_partial = partial.with_suffix(".failed")
            failed_partial.write_text(record, encoding="utf-8")
            os.replace(failed_partial, failed)
            raise
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        os.replace(partial, body)
        return body

    def stored(self, url: str) -> bytes | None:
        """The bytes this job fetched for `url` (or its stored `FetchError`); None when the job
        never fetched it (a Ray actor on another machine, a URL not keyed by this job)."""
        body, failed = self._paths(url)
        try:
            return body.read_bytes()
        except FileNotFoundError:
            pass
        self._raise_failure(failed)
        return None

    @staticmethod
    def _raise_failure(failed: Path) -> None:
        try:
            record = json.loads(failed.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return
        raise FetchError(record["message"], transient=bool(record["transient"]))
