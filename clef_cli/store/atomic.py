"""The one writer of every file clef produces: it never changes what the path is.

- A regular file or a new path is written atomically: a temporary file beside it, fsynced, then
  renamed over it, so a reader sees the old file or the complete new one, never half of one (an
  existing file keeps its permission bits).
- A symlink is followed: the file it points at is written that way, and the link stays a link.
- A named pipe, a character device (`/dev/null`) or `-` (stdout) would be destroyed by a rename,
  so the bytes are streamed into it, without a temporary file.
- An object URI (`s3://bucket/out/stats.json`) is written into a local temporary file and
  uploaded whole (`locations/uploads.py`): the object appears complete or not at all.

`ensure_writable` refuses, before any work, an output that could only fail after it (a missing or
unwritable folder, a folder given for a file). Torch-free on purpose, so commands that only read
outputs (`clef eval`, `clef calibrate`) write their files the same way without the model's stack.

Why it lives in `store/` (issue 58 asked where outputs live): the store's own files (shards, the
journal's companions, manifests, locks) are written by it too, and it rests on `store/durable`, the
seam the crash model replays. In `job/` the store would import upward; at the package root the
root would import `store/`. `store/` is the lowest room every writer already reaches.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from clef_cli.errors import ClefError, UsageError
from clef_cli.locations.uris import is_object_uri
from clef_cli.store import durable

STDOUT = "-"
Writer = Callable[[BinaryIO], object]
"""Writes the whole content into an open binary handle (which may not be seekable)."""


def is_stdout(path: Path | str) -> bool:
    return str(path) == STDOUT


def fsync_path(path: Path) -> None:
    """fsync a folder (the names made in it become durable)."""
    durable.fsync_dir(path)


def write_file(path: Path | str, write: Writer, before_rename: Callable[[], None] | None = None) -> None:
    """`write(handle)` into `path` as the module docstring says; `before_rename` runs when an
    atomic write's temporary is complete (crash tests stop there: the old file must be whole)."""
    if is_stdout(path):
        sys.stdout.flush()  # what was printed before comes first
        write(sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return
    if isinstance(path, str) and is_object_uri(path):
        _upload(path, write)
        return
    target = _resolved(Path(path))
    if _is_stream(target):
        with open(target, "wb") as handle:
            write(handle)
        return
    _replace(target, write, before_rename)


def _upload(uri: str, write: Writer) -> None:
    import tempfile

    from clef_cli.locations.uploads import upload_whole

    with tempfile.TemporaryDirectory(prefix="clef-upload-") as folder:
        local = Path(folder) / "body"
        with open(local, "wb") as handle:
            write(handle)
        upload_whole(local, uri)


def write_bytes(path: Path | str, data: bytes) -> None:
    write_file(path, lambda handle: handle.write(data))


def write_text(path: Path | str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def _replace(path: Path, write: Writer, before_rename: Callable[[], None] | None) -> None:
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with durable.create(temporary) as handle:
            write(handle)
            durable.wrote(temporary, handle)
            durable.fsync(handle, temporary)
        with contextlib.suppress(FileNotFoundError):
            os.chmod(temporary, stat.S_IMODE(path.stat().st_mode))
        if before_rename is not None:
            before_rename()
        durable.rename(temporary, path)
    finally:
        durable.unlink(temporary)
    fsync_path(path.parent)


def remove_stale_temporaries(path: Path) -> None:
    """The temporaries that runs killed mid-write left beside `path` (or beside its symlink's
    target); the caller holds the output's lock, so none of them is being written."""
    if is_stdout(path):
        return
    target = _resolved(Path(path))
    for stale in target.parent.glob(f".{target.name}.*.tmp"):
        with contextlib.suppress(OSError):
            durable.unlink(stale)


def _resolved(path: Path) -> Path:
    """The file a symlink (or a chain of them) points at; any other path as it is."""
    if not path.is_symlink():
        return path
    try:
        return path.resolve(strict=False)
    except (RuntimeError, OSError) as error:  # a symlink loop
        raise ClefError(f"{path} is a symlink that points nowhere: {error}") from None


def _is_stream(path: Path) -> bool:
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def _target_mode(path: Path | str) -> int:
    """The mode of what `path` names through symlinks; 0 for stdout, a missing path or a loop."""
    if is_stdout(path):
        return 0
    try:
        return Path(path).resolve().stat().st_mode
    except (OSError, RuntimeError):
        return 0


def is_stream(path: Path | str) -> bool:
    """A named pipe or a character device (through symlinks): streamed into, so its name needs
    no file suffix."""
    mode = _target_mode(path)
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def is_character_device(path: Path | str) -> bool:
    """A character device (`/dev/null`, through symlinks): it has no folder of its own, so nothing
    (a lock, a store) is made beside it."""
    return stat.S_ISCHR(_target_mode(path))


# ----------------------------------------------------------------------------- checks at start


def ensure_writable(path: Path | str, option: str, stdout: bool = False) -> None:
    """Refuse (exit 2, naming `option`) an output file that `write_file` could not write: `-` where
    `stdout` is not allowed, a folder or other non-file, a symlink loop, a missing or unwritable
    folder. Called before any work, so a job never fails at its end for its output's sake."""
    if is_stdout(path):
        if not stdout:
            raise UsageError(f"{option} cannot be - (stdout): give a file")
        return
    if isinstance(path, str) and is_object_uri(path):
        from clef_cli.locations.uploads import check_writable

        check_writable(path, option)  # uploaded whole at the end: the bucket is asked now
        return
    path = Path(path)
    try:
        target = _resolved(path)
    except ClefError as error:
        raise UsageError(f"{option} {error}") from None
    try:
        mode = target.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    if mode is not None and (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        if not os.access(target, os.W_OK):
            raise UsageError(f"{option} {path}: not writable")
        return
    if mode is not None and stat.S_ISDIR(mode):
        raise UsageError(f"{option} {path} is a folder; give a file")
    if mode is not None and not stat.S_ISREG(mode):
        raise UsageError(f"{option} {path} is neither a file, a named pipe nor a character device")
    _ensure_folder_writable(target.parent, option, path)


def ensure_writable_folder(path: Path, option: str) -> None:
    """The same for an output folder (train-head's release layout): an existing folder, or a new
    one in a writable folder; never a file."""
    target = _resolved(Path(path))
    if target.exists() and not target.is_dir():
        raise UsageError(f"{option} {path} is a file; give a folder")
    _ensure_folder_writable(target if target.is_dir() else target.absolute().parent, option, path)


def _ensure_folder_writable(folder: Path, option: str, path: Path) -> None:
    """Create and delete a temporary file in `folder`: the one test that holds for root, read-only
    mounts and ACLs alike."""
    folder = folder if str(folder) else Path(".")
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"{option} {path}: folder {folder} {what}")
    probe = folder / f".clef-probe.{uuid.uuid4().hex[:8]}.tmp"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as error:
        raise UsageError(f"{option} {path}: cannot write in folder {folder}: {error.strerror}") from None
    probe.unlink(missing_ok=True)
