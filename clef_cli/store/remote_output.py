"""Outputs in an object store, staged in the checkpoint.

A job whose `-o` is an object URI writes its output into its checkpoint's local folder first (the
store itself, or a bucket store's cache folder), atomically as every file (`atomic.py`), and
uploads it whole at the end (`locations/uploads.py`); the rerun uploads again from the store.
"""

from __future__ import annotations

from pathlib import Path

from clef_cli.errors import UsageError
from clef_cli.locations.uploads import checked_uri

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
