"""Outputs in an object store, staged in the checkpoint.

A job whose `-o` is an object URI writes its output into its checkpoint's local folder first (the
store itself, or a bucket store's cache folder), atomically as every file (`atomic.py`), and
uploads it whole at the end (`locations/uploads.py`); the rerun uploads again from the store.

The staged copy goes once its upload succeeded (a dated output a night would otherwise pile up in
a cache a machine keeps), unless `--keep-staged-output`; a failed upload keeps it and says where.
"""

from __future__ import annotations

from pathlib import Path

from clef_cli.errors import UsageError
from clef_cli.locations.object_store import ObjectStoreError
from clef_cli.locations.uploads import checked_uri, upload_whole
from clef_cli.store import durable

UPLOADS = "upload"
"""The checkpoint's folder for outputs on their way to an object store."""


def staged_output(uri: str, checkpoint: Path | None, option: str = "-o") -> Path:
    """Where an output bound for `uri` is written first: its name in the checkpoint's upload
    folder. A remote output needs --checkpoint (a usage error naming it otherwise)."""
    name = checked_uri(uri, option).rsplit("/", 1)[1]  # an object's URI: no query string, no folder
    if checkpoint is None:
        raise UsageError(
            f"{option} {uri}: an output in an object store needs --checkpoint (a local folder, or a store in a "
            "bucket: s3://bucket/store/)"
        )
    return checkpoint / UPLOADS / name


def upload_staged(staged: Path, uri: str, keep: bool = False) -> None:
    """Put the staged output `staged` at `uri`, then remove it unless `keep`. A failed upload (an
    `ObjectStoreError`, exit 1) keeps it, and its message names where it is."""
    try:
        upload_whole(staged, uri)
    except ObjectStoreError as error:
        raise ObjectStoreError(f"{error} (its local copy stays at {staged})") from None
    if not keep:
        durable.unlink(staged)
