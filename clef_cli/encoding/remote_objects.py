"""Media in an object store, as the encoder and the record key read them.

The location comes from the one resolver (`inputs/sources.py`: relative entries against the
input's folder, `..` resolved) and must lie under that folder or a --media-root URI. The bytes are
the job's copy when keying spooled them (`remote_spool`: the key hashes exactly what is decoded,
and an object costs one GET per job); an object keyed from the store's cache is copied there the
first time the encoder reads it (else read now, where the job has no copy: a Ray actor on another
machine), the object's size checked first.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import BinaryIO

from clef_cli.encoding.media_limits import MediaError, MediaLimits
from clef_cli.encoding.remote_fetch import FetchError
from clef_cli.encoding.remote_spool import RemoteSpool
from clef_cli.inputs.sources import MediaBase, check_object_allowed, media_location
from clef_cli.locations.object_store import ObjectProblem, ObjectStamp, read_object


def object_location(entry: str, base: MediaBase, limits: MediaLimits) -> str:
    """The normalised URI of an object entry the job may read; a `MediaError` naming why not."""
    try:
        location = media_location(entry, base)
        assert isinstance(location, str)
        check_object_allowed(location, base, limits.object_roots)
    except ObjectProblem as problem:
        raise MediaError(str(problem), transient=problem.transient) from None
    return location


def object_bytes(entry: str, base: MediaBase, limits: MediaLimits) -> bytes:
    """The bytes of an object entry (see the module's note)."""
    uri = object_location(entry, base, limits)
    spool = RemoteSpool(limits.remote_spool) if limits.remote_spool is not None else None
    try:
        spooled = spool.stored(uri) if spool is not None else None
        if spooled is None and spool is not None and spool.folder.is_dir():
            # keyed from the store's cache, so not copied yet: copied now, once per job, so that
            # planning and the batch (and every record naming it) do not each ask the store
            spool.digest_with(uri, spool_filler(uri, limits, []))
            spooled = spool.stored(uri)
    except FetchError as error:
        raise MediaError(str(error), transient=error.transient) from None
    if spooled is not None:
        return spooled
    buffer = io.BytesIO()
    try:
        read_object(uri, limits.max_file_bytes, buffer)
    except ObjectProblem as problem:
        raise MediaError(str(problem), transient=problem.transient) from None
    return buffer.getvalue()


def spool_filler(uri: str, limits: MediaLimits, seen: list[ObjectStamp]) -> Callable[[BinaryIO], None]:
    """What `RemoteSpool.digest_with` calls to copy the object in (its failures as the spool
    keeps them); the stamp the read saw is appended to `seen`."""

    def fill(handle: BinaryIO) -> None:
        try:
            seen.append(read_object(uri, limits.max_file_bytes, handle))
        except ObjectProblem as problem:
            raise FetchError(str(problem), transient=problem.transient) from None

    return fill
