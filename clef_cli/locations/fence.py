"""Whether a record may read a location, and local files opened inside their roots.

Where a record came from decides what it may reach (`place`, the one fence for a media entry, the
same for keying and decoding, in every engine: the origin travels as the record's `MediaBase`):

- An object may be read when it lies under the folder of the input that names it or under a
  --media-root URI: the job's credentials must not read what the user did not point clef at.
- A record read from an object store may name no local file (`file:` URIs included) unless a
  local --media-root allows it: a bucket's records must not read the scoring machine's disk.
- Any --media-root makes the roots an allow-list for every local path too: with only `s3://`
  roots, a local path is refused.
- By default (a local input, no root) a local path may name any file the operator can read (the
  operator owns the input file).

These refusals are made from the entry's text alone, before any file is looked at, and every
message names the location as the record wrote it (never where it resolved), so an error never
tells a record's author whether a file exists. Inside local roots, a path is then resolved
(symlinks, `..`) and must still lie inside one of them; the file is then
opened by walking from the root one component at a time, each opened relative to the folder
before it and without following a symlink (openat with O_NOFOLLOW), so swapping a folder or the
file for a symlink after the check cannot lead the open outside. The bytes are read from that
descriptor.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from clef_cli.locations.uris import (
    LOCAL_SCHEMES,
    LocationProblem,
    checked,
    is_object_uri,
    is_under,
    is_uri,
    joined,
    normalized,
    shown,
)

MediaBase = Path | str | None
"""Where an input's relative media entries resolve, and where its records came from: a local
folder (a local input, stdin), an object folder's URI (`s3://b/records/`) or, for a remote input
whose URI has no usable folder (a query string), that URI (text: a remote origin, whose records
name no local file), or None (a record a library caller built, with no folder)."""


@dataclass(frozen=True)
class Roots:
    """--media-root: local folders (absolute) and object-store folders (normalised, ending in `/`)."""

    local: tuple[Path, ...] = ()
    objects: tuple[str, ...] = ()


@dataclass(frozen=True)
class Place:
    """Where a media entry leads, once fenced: `data` (the entry is its bytes), `url` (http(s),
    for the one checked fetcher), `object` (a normalised URI the record may read) or `file` (a
    local path, to open inside `Roots.local` when there are any, else as it is)."""

    kind: Literal["data", "url", "object", "file"]
    location: str | Path
    shown: str
    """The entry as the record wrote it (credentials masked, control characters escaped): what
    messages and error cells name, never a host's absolute path."""


def media_base(text: str | None) -> MediaBase:
    """A `MediaBase` carried as text (a Ray row): a URI (a remote input's) stays text, so the
    record keeps its origin."""
    if not text:
        return None
    return text if is_uri(text) else Path(text)


def local_entry(entry: str) -> Path | None:
    """The local path an absolute path or a local-filesystem URI (`file:///abs`, `file:/abs`,
    `local:///abs`) names; None for anything else (a relative path, an object URI)."""
    scheme, colon, rest = entry.partition(":")
    if colon and scheme.lower() in LOCAL_SCHEMES:
        path = "/" + rest.lstrip("/") if rest.startswith("/") else rest
        return Path(path) if path.startswith("/") else None
    return Path(entry) if Path(entry).is_absolute() else None


def names_object(entry: str, base: MediaBase) -> bool:
    """Whether a media entry (not data: or http(s)) names an object in a store: an object URI,
    or a relative path in an input that is itself an object."""
    return is_object_uri(entry) or (isinstance(base, str) and local_entry(entry) is None)


def media_location(entry: str, base: MediaBase) -> Path | str:
    """Where a media entry that is neither a data: nor an http(s) URL lies: a local path, or a
    normalised object URI; a relative entry resolves against its input's folder, local or remote
    (`..` resolved, so the confinement test sees the object that is read). A `LocationProblem`
    when it cannot resolve; no fence (`place` is the fence)."""
    checked(entry)
    if is_object_uri(entry):
        return normalized(entry)
    if names_object(entry, base):
        assert isinstance(base, str)
        return joined(base, entry)
    path = local_entry(entry)
    if path is None:
        if not isinstance(base, Path):
            raise LocationProblem(f"relative media path {shown(entry)} in an input with no folder: use absolute paths")
        path = base / entry
    return path


def allowed_object(entry: str, base: MediaBase, roots: tuple[str, ...]) -> str:
    """The normalised URI of an object entry the record may read: under the folder of the input
    that names it or under a --media-root URI; else a `LocationProblem` naming --media-root."""
    uri = media_location(entry, base)
    assert isinstance(uri, str)
    allowed = (base,) if isinstance(base, str) and is_object_uri(base) else ()
    if not any(is_under(uri, root) for root in (*allowed, *roots)):
        raise LocationProblem(f"{shown(uri)} is outside the input's folder and the media roots (--media-root)")
    return uri


def place(entry: str, base: MediaBase, roots: Roots) -> Place:
    """Where a record's media entry (text) leads, or a `LocationProblem` saying why the record may
    not read it (see the module's note). Decided from the text alone: nothing is opened here."""
    if entry.startswith("data:"):
        return Place("data", entry, "a data: URL")
    written = shown(checked(entry))
    if entry.startswith(("http://", "https://")):
        return Place("url", entry, written)
    if names_object(entry, base):
        return Place("object", allowed_object(entry, base, roots.objects), written)
    if isinstance(base, str) and not roots.local:
        raise LocationProblem(
            f"a record from {shown(base)} cannot name a local file ({written}); add a local --media-root to allow it"
        )
    path = media_location(entry, base)
    if roots.objects and not roots.local:
        raise LocationProblem(f"{written} is outside the media roots (--media-root)")
    return Place("file", path, written)


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO opens at once, then fails fstat


def confined_parts(path: Path, roots: tuple[Path, ...], name: str | None = None) -> tuple[str, list[str]]:
    """(the root `path` resolves into, the components below it); an escape is a `LocationProblem`
    naming the path as `name` (the record wrote it), never where it resolved: the answer is the same
    whether or not the file exists."""
    name = name or shown(str(path))
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        raise LocationProblem(f"not a usable path: {name}") from None
    for root in roots:
        base = os.path.realpath(root)
        if real.startswith(base.rstrip(os.sep) + os.sep):
            return base, Path(os.path.relpath(real, base)).parts
    raise LocationProblem(f"{name} is outside the media roots (--media-root)")


def open_confined(path: Path, roots: tuple[Path, ...], max_bytes: int, name: str | None = None) -> BinaryIO:
    """`path` opened for reading, if it resolves inside one of `roots` and is a regular file of
    at most `max_bytes`; else a `LocationProblem` naming why, and the path as `name`."""
    base, parts = confined_parts(path, roots, name)
    path_name = name or shown(str(path))
    descriptor = -1
    try:
        descriptor = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            inner = os.open(part, _FILE if last else _DIRECTORY, dir_fd=descriptor)
            os.close(descriptor)
            descriptor = inner
        info = os.fstat(descriptor)
    except FileNotFoundError:
        _close(descriptor)
        raise LocationProblem(f"file not found: {path_name}") from None
    except OSError as error:
        _close(descriptor)
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise LocationProblem(
                f"{path_name} changed while it was opened (a symlink appeared inside the media root)"
            ) from None
        raise LocationProblem(f"cannot read {path_name}: {error.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        _close(descriptor)
        raise LocationProblem(f"not a regular file: {path_name}")
    if info.st_size > max_bytes:
        _close(descriptor)
        raise LocationProblem(f"file is {info.st_size} bytes, over the limit of {max_bytes}: {path_name}")
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "rb")


def _close(descriptor: int) -> None:
    if descriptor >= 0:
        os.close(descriptor)
