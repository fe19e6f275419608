"""Objects put whole or not at all, and the check that an output can be put before a job starts.

An output is put at its own key, in one request (a PUT) up to `SINGLE_PUT_BYTES`, as an S3
multipart upload above: either way the object appears only when complete (a PUT is whole or
nothing, a multipart upload's object appears at its CompleteMultipartUpload), and a failed upload
leaves the target as it was (obstore aborts the multipart upload it started). No temporary key is
copied and deleted, so no "folder" marker is made: pyarrow's S3 filesystem puts an empty `out/`
object whenever it deletes a key (to keep the "directory"), which is why puts and deletes go
through obstore (`buckets`) while reads stay pyarrow's.

A job killed during the upload of an output up to `SINGLE_PUT_BYTES` leaves nothing; above it,
an incomplete multipart upload that the store keeps (and bills) but never shows. Neither pyarrow
nor obstore can list or abort uploads it did not start, so a rerun cannot remove it: a bucket
lifecycle rule (`AbortIncompleteMultipartUpload`) does (docs/scoring.md).
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Callable
from pathlib import Path

from clef_cli.errors import UsageError
from clef_cli.locations.buckets import SMALL_PUT, bucket
from clef_cli.locations.failures import FAILING, failure_of, named
from clef_cli.locations.object_store import MissingObject, NoSuchBucket, ObjectStoreError, _retried, filesystem
from clef_cli.locations.uris import LocationProblem, is_object_uri, object_uri

SINGLE_PUT_BYTES = 64 << 20
"""Outputs up to this size are put in one request (read into memory for it); larger ones in parts."""
PART_BYTES = 16 << 20
"""A multipart upload's part (obstore sends a few at once)."""
PROBE = ".clef-probe-"


def checked_uri(text: str, option: str) -> str:
    """`text` as an output object's normalised URI: an object store's (s3://, gs://, ...), with no
    query string or fragment and not a folder; a usage error naming `option` otherwise."""
    uri = object_uri(text, option)
    if not is_object_uri(uri):
        raise UsageError(f"{option} {text!r}: not an object store's URI (s3://bucket/key, gs://..., abfs://...)")
    return uri


def check_writable(text: str, option: str) -> None:
    """Before any record is read: the output `text` names an object, not a "folder" (objects
    under it) nor a query string, and its bucket exists and takes a write (an empty probe object
    put beside the target and removed). A usage error (exit 2) for what the user must change (the
    URI, a missing bucket); the store's one line (exit 1) for credentials and the endpoint."""
    uri = checked_uri(text, option)
    fs, path = filesystem(uri)
    try:
        import pyarrow.fs as pafs

        try:
            found = _retried(uri, True, lambda: fs.get_file_info(path)).type
        except MissingObject:  # pyarrow's word for a bucket it cannot list: the probe says which
            found = pafs.FileType.NotFound
        if found == pafs.FileType.Directory:
            raise UsageError(f"{option} {text} is a folder in the store (objects lie under it); give an object's URI")
        folder, _, name = uri.rpartition("/")
        probe_writes(f"{folder}/.{name}{PROBE}{uuid.uuid4().hex[:12]}", uri)
    except ObjectStoreError as error:  # a missing bucket (exit 2) included: one reading (failures.py)
        raise named(error, option, text) from None
    except LocationProblem as problem:
        raise failure_of(FAILING if problem.transient else "other", option, text, str(problem)) from None


class WriteRefused(ObjectStoreError):
    """A step of `probe_writes` the bucket refused (its text is the sorted failure's, `_classify`);
    `step` says which: "a write", "a conditional write", "a listing", "a delete"."""

    def __init__(self, step: str, error: BaseException) -> None:
        if isinstance(error, ObjectStoreError):  # its cause and the server's answer kept (failures.py)
            super().__init__(str(error), error.detail, error.failure, error.words)
        else:  # sorted as `check_writable` sorts a LocationProblem; its text the detail, so `named` never rebuilds one
            failure = FAILING if isinstance(error, LocationProblem) and error.transient else "other"
            super().__init__(str(error), str(error), failure)
        self.step = step

    @property
    def cause(self) -> str:
        """The refusal in a few words ("access denied"), else the sorted failure's text."""
        text = str(self)
        return "access denied" if re.search(r"access denied|AccessDenied|\b403\b", text, re.I) else text


class ConditionIgnored(ObjectStoreError):
    """The bucket wrote over an object a conditional write (`If-None-Match: *`) should have spared."""


def probe_writes(probe: str, named: str, conditional: bool = False, listed: bool = False, strict: bool = False) -> None:
    """Ask the bucket for the writes a job will make, before any record is read: an empty object put
    at `probe` (`conditional`: only where none is, `If-None-Match: *`, then again, which must be
    refused: a store that ignores the condition would let two writers commit one manifest), found
    by a listing (`listed`), and deleted at once. Failures are named by `named` (what the probe
    stands for), and a refused step is a `WriteRefused`; a refused delete is one only when
    `strict` (else a role that may put but not delete passes: an output is never deleted)."""
    import obstore
    from obstore.exceptions import AlreadyExistsError, BaseError, PreconditionError

    client = bucket(probe, quick=True)
    key = client.key(probe)

    def step(what: str, call: Callable[[], object]) -> object:
        try:
            return _retried(named, True, call, errors=(OSError, BaseError))
        except NoSuchBucket:
            raise
        except (ObjectStoreError, LocationProblem) as error:
            raise WriteRefused(what, error) from None

    def put_again() -> bool:
        try:
            obstore.put(client.store, key, b"", mode="create")
        except (AlreadyExistsError, PreconditionError):
            return False
        return True

    def delete() -> None:
        step("a delete", lambda: obstore.delete(client.store, key))

    mode = "create" if conditional else "overwrite"
    step("a conditional write" if conditional else "a write", lambda: obstore.put(client.store, key, b"", mode=mode))
    try:
        if conditional and step("a conditional write", put_again):
            raise ConditionIgnored(
                "the bucket ignores conditional writes (If-None-Match: *), on which the store's commits rely"
            )
        if listed:
            step("a listing", lambda: [item for page in obstore.list(client.store, key) for item in page])
    except BaseException:
        with contextlib.suppress(ObjectStoreError):  # the first refusal is the one to tell
            delete()
        raise
    try:
        delete()
    except WriteRefused:
        if strict:
            raise


def upload_whole(local: Path, uri: str) -> None:
    """Put `local` at `uri` as one complete object (see the module's note); an `ObjectStoreError`
    (exit 1) when the store refuses, the target as it was."""
    target = checked_uri(uri, "-o")
    try:
        _put(target, Path(local))
    except ObjectStoreError as error:
        found = named(error, "-o", target)
    except LocationProblem as problem:
        found = failure_of(FAILING if problem.transient else "other", "-o", target, str(problem))
    else:
        return
    again = f"{found}; the output was not uploaded: rerun to upload it again"
    raise ObjectStoreError(again, found.detail, found.failure, found.words) from None


def _put(uri: str, body: bytes | Path, quick: bool = False, named: str | None = None) -> None:
    """`body` at `uri`, in one request up to `SINGLE_PUT_BYTES`, else in parts; failures sorted
    and named by `named` (the output a probe stands for) or `uri`."""
    import obstore
    from obstore.exceptions import BaseError

    store = bucket(uri, quick=quick)
    key = store.key(uri)
    size = len(body) if isinstance(body, bytes) else body.stat().st_size
    multipart = size > SINGLE_PUT_BYTES

    client = store.store if isinstance(body, bytes) and size <= SMALL_PUT else store.uploads  # buckets.READ_TIMEOUT

    def put() -> None:
        obstore.put(client, key, body, use_multipart=multipart, chunk_size=PART_BYTES, max_concurrency=4)

    _retried(named or uri, True, put, errors=(OSError, BaseError))
