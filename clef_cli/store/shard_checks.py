"""Checking a shard's files against their journal line, and remembering which hidden-state
files have been checked, so that a resume reads only the new or changed ones.

Checking every stored hidden state's CRC32 on every run made a nightly job over a growing store
read all of it again (about 2.2 s per GiB here), though it computes only the new records. A file
whose CRC32 matched at the last open, and whose size and modification time have not changed
since, is not read again; new files and any file written since are. Damage that leaves the times
alone (bit rot) is still caught by the readers (`--rehead`, train-head), which check each file as
they read it and strike a damaged one from this list, so that the next run checks it, drops it
and computes its records again.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from clef_cli.release import file_crc32, file_sha256
from clef_cli.store.atomic import write_text

VERIFIED = "hidden_verified.json"
"""In the checkpoint folder: {file name: [size, mtime_ns]} as of the last check."""

Stamp = tuple[int, int]


def stamp(path: Path) -> Stamp:
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns


def read_verified(checkpoint: Path) -> dict[str, Stamp]:
    """The memo (empty when missing or unreadable: everything is checked then)."""
    try:
        raw = json.loads((checkpoint / VERIFIED).read_text(encoding="utf-8"))
        return {str(name): (int(size), int(mtime)) for name, (size, mtime) in raw.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def write_verified(checkpoint: Path, stamps: dict[str, Stamp]) -> None:
    write_text(checkpoint / VERIFIED, json.dumps({name: list(value) for name, value in sorted(stamps.items())}))


def unchanged_since_verified(path: Path, memo: dict[str, Stamp]) -> bool:
    with contextlib.suppress(FileNotFoundError):
        return memo.get(path.name) == stamp(path)
    return False


def forget_verified(checkpoint: Path, name: str) -> None:
    """A reader found this file damaged: the next open checks it again (and drops it)."""
    memo = read_verified(checkpoint)
    if memo.pop(name, None) is not None:
        with contextlib.suppress(OSError):  # a read-only store: the check then stays as it was
            write_verified(checkpoint, memo)


def file_matches(path: Path, kind: str, described: dict[str, Any], hidden_states: bool, memo: dict[str, Stamp]) -> bool:
    """The file has its journaled size and checksum: results always, hidden states only when
    `hidden_states` and not unchanged since they last verified (reading them costs one pass over
    what may be many GB)."""
    try:
        if path.stat().st_size != described["bytes"]:
            return False
        if kind == "results":
            return file_sha256(path) == described["sha256"]
        if kind != "hidden" or not hidden_states or unchanged_since_verified(path, memo):
            return True
        return file_crc32(path) == described["crc32"]
    except (FileNotFoundError, KeyError):
        return False


def remember_verified(checkpoint: Path, hidden_files: list[Path]) -> None:
    """These files verified (or were unchanged) at this open: as they are now."""
    write_verified(checkpoint, {path.name: stamp(path) for path in hidden_files})
