"""Media in an object store, as the encoder and the record key read them.

The location comes from the one resolver and fence (`locations/fence.place`: relative entries
against the input's folder, `..` resolved, under that folder or a --media-root URI). The bytes are
the job's copy when keying spooled them (`remote_spool`: the key hashes exactly what is decoded,
and an object costs one GET per job); an object keyed from the store's cache is copied there
ahead of the encoder (`object_prefetch`, a window at a time), else the first time the encoder
reads it (or read now, where there is no copy), the object's size checked first.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import BinaryIO

from clef_cli.encoding.media_limits import MediaError, MediaLimits
from clef_cli.encoding.remote_spool import RemoteSpool
from clef_cli.inputs.records import MEDIA_FIELDS, Record
from clef_cli.locations.fence import place
from clef_cli.locations.object_store import ObjectStamp, read_object
from clef_cli.locations.remote_fetch import FetchError
from clef_cli.locations.uris import LocationProblem


def object_uris(record: Record, limits: MediaLimits) -> list[str]:
    """The objects the record's media entries lead to and the fence lets it read (`place`), each
    once, in field order; an entry refused is left to whoever reads the record, which says why."""
    uris = []
    for name in MEDIA_FIELDS:
        for entry in getattr(record, name):
            if not isinstance(entry, str):  # the record's own bytes
                continue
            try:
                where = place(entry, record.base_dir, limits.roots)
            except LocationProblem:
                continue
            if where.kind == "object":
                uris.append(str(where.location))
    return list(dict.fromkeys(uris))


def object_bytes(uri: str, limits: MediaLimits) -> bytes:
    """The bytes of an object the fence allowed (`place`: a normalised URI; see the module's note)."""
    spool = RemoteSpool(limits.remote_spool) if limits.remote_spool is not None else None
    try:
        spooled = spool.stored(uri) if spool is not None else None
        if spooled is None and spool is not None and spool.folder.is_dir():
            # keyed from the store's cache, so not copied yet: copied now, once per job, so that
            # planning and the batch (and every record naming it) do not each ask the store
            spooled = spool.filled(uri, spool_filler(uri, limits, [])).read_bytes()
    except FetchError as error:
        raise MediaError(str(error), transient=error.transient) from None
    if spooled is not None:
        return spooled
    buffer = io.BytesIO()
    try:
        read_object(uri, limits.max_file_bytes, buffer)
    except LocationProblem as problem:
        raise MediaError(str(problem), transient=problem.transient) from None
    return buffer.getvalue()


def spool_filler(uri: str, limits: MediaLimits, seen: list[ObjectStamp]) -> Callable[[BinaryIO], None]:
    """What `RemoteSpool.digest_with` calls to copy the object in (its failures as the spool
    keeps them); the stamp the read saw is appended to `seen`."""

    def fill(handle: BinaryIO) -> None:
        try:
            seen.append(read_object(uri, limits.max_file_bytes, handle))
        except LocationProblem as problem:
            raise FetchError(str(problem), transient=problem.transient) from None

    return fill
