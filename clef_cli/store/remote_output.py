"""Outputs in an object store, whole or not at all.

A store's SQLite and journals need a real filesystem, so a job whose `-o` is an object URI writes
its output into its (local) checkpoint first, atomically as every file (`atomic.py`), and uploads
it at the end. An object store has no rename, and pyarrow's upload stream completes whatever it
holds when it is closed (even after a failure), so the bytes go to a temporary key beside the
target and only a complete one is copied onto the target, server side (one CopyObject: the
target appears whole, or stays as it was). A kill or a failed upload leaves at most that
temporary key, which the next upload removes; the rerun uploads again from the checkpoint.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

from clef_cli.errors import UsageError
from clef_cli.locations.object_store import (
    ObjectProblem,
    ObjectStoreError,
    filesystem,
    is_object_uri,
    normalized,
    object_uri,
)

UPLOADS = "upload"
"""The checkpoint's folder for outputs on their way to an object store."""
TEMPORARY = ".clef-upload-"
CHUNK = 8 << 20


def staged_output(uri: str, checkpoint: Path | None, option: str = "-o") -> Path:
    """Where an output bound for `uri` is written first: its name in the checkpoint's upload
    folder. A remote output needs --checkpoint (a usage error naming it otherwise)."""
    if checkpoint is None:
        raise UsageError(
            f"{option} {uri}: an output in an object store needs --checkpoint (a local folder: "
            "the store's SQLite and journals need a real filesystem)"
        )
    return checkpoint / UPLOADS / object_uri(uri, option).rsplit("/", 1)[1]


def upload_whole(local: Path, uri: str) -> None:
    """Put `local` at `uri` as one complete object (see the module's note); an `ObjectStoreError`
    (exit 1) when the store refuses, the target untouched."""
    if not is_object_uri(uri):
        raise UsageError(f"not an object-store URI: {uri}")
    try:
        fs, path = filesystem(normalized(uri))
    except ObjectProblem as problem:
        raise ObjectStoreError(f"cannot upload the output to {uri}: {problem}") from None
    folder, name = path.rsplit("/", 1)
    _remove_leftovers(fs, folder, name)
    temporary = f"{folder}/.{name}{TEMPORARY}{uuid.uuid4().hex[:12]}"
    try:
        with open(local, "rb") as source, fs.open_output_stream(temporary) as stream:
            while chunk := source.read(CHUNK):
                stream.write(chunk)
        fs.move(temporary, path)
    except OSError as error:
        _delete_quietly(fs, temporary)
        text = " ".join(str(error).split())[:300]
        raise ObjectStoreError(f"cannot upload the output to {uri} (rerun to upload it again): {text}") from None
    except BaseException:
        _delete_quietly(fs, temporary)
        raise


def _remove_leftovers(fs: object, folder: str, name: str) -> None:
    """Temporary keys an earlier upload of the same output left (a killed job)."""
    import pyarrow.fs as pafs

    try:
        listed = fs.get_file_info(pafs.FileSelector(folder, recursive=False, allow_not_found=True))  # type: ignore[attr-defined]
    except OSError:
        return
    for info in listed:
        if info.base_name.startswith(f".{name}{TEMPORARY}"):
            _delete_quietly(fs, info.path)


def _delete_quietly(fs: object, path: str) -> None:
    with contextlib.suppress(OSError):
        fs.delete_file(path)  # type: ignore[attr-defined]
