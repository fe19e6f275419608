"""Local media paths fenced into --media-root folders, for operators who want a fence.

By default a local path may name any file the operator can read: the operator owns the input
file. With roots, a path is resolved (symlinks, `..`) and must lie inside one of them; the file
is then opened by walking from the root one component at a time, each opened relative to the
folder before it and without following a symlink (openat with O_NOFOLLOW), so swapping a folder
or the file for a symlink after the check cannot lead the open outside. The bytes are read from
that descriptor.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from clef_cli.encoding.media_limits import MediaError

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO opens at once, then fails fstat


def confined_parts(path: Path, roots: tuple[Path, ...]) -> tuple[str, list[str]]:
    """(the root `path` resolves into, the components below it); an escape is a `MediaError`."""
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError) as error:
        raise MediaError(f"not a usable path ({error}): {path}") from None
    for root in roots:
        base = os.path.realpath(root)
        if real.startswith(base.rstrip(os.sep) + os.sep):
            return base, Path(os.path.relpath(real, base)).parts
    shown = path if str(path) == real else f"{path} (resolved: {real})"
    raise MediaError(f"{shown} is outside the media roots (--media-root)")


def open_confined(path: Path, roots: tuple[Path, ...], max_bytes: int) -> BinaryIO:
    """`path` opened for reading, if it resolves inside one of `roots` and is a regular file of
    at most `max_bytes`; else a `MediaError` naming why."""
    base, parts = confined_parts(path, roots)
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
        raise MediaError(f"file not found: {path}") from None
    except OSError as error:
        _close(descriptor)
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise MediaError(f"{path} changed while it was opened (a symlink appeared inside the media root)") from None
        raise MediaError(f"cannot read {path}: {error.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        _close(descriptor)
        raise MediaError(f"not a regular file: {path}")
    if info.st_size > max_bytes:
        _close(descriptor)
        raise MediaError(f"file is {info.st_size} bytes, over the limit of {max_bytes}: {path}")
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "rb")


def _close(descriptor: int) -> None:
    if descriptor >= 0:
        os.close(descriptor)
