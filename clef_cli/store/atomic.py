"""Writing a file so that it is either absent, the old version, or complete: never half-written.

Torch-free on purpose, so commands that only read outputs (`clef eval`, `clef calibrate`) can
write their files the same way without importing the model's stack.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def fsync_path(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_atomically(path: Path, write: Any, before_rename: Callable[[], None] | None = None) -> None:
    """`write(temporary_path)`, fsync, then rename into place: never a half-written `path`."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(temporary)
        fsync_path(temporary)
        if before_rename is not None:
            before_rename()  # crash tests stop here: the old file must still be whole
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    fsync_path(path.parent)
