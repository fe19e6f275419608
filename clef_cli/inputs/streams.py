"""Records on stdin or from a pipe (`-`, `/dev/stdin`, `<(zcat night.jsonl.gz)`), read once.

A job reads its inputs more than once (keying, scoring, counting for progress, pass-through
columns), and a pipe gives its bytes only once. So a stream is copied into a spool file the first
time it is named, and every later reader of this process reads the spool. The spool is JSONL
(the stream's format: Parquet and gzip/zstd streams are told by their first bytes), its relative
media paths resolve against the working directory, and it is removed when the process ends.
A stream that holds a CSV or TSV (its first line is no JSON) is refused once, since nothing names
its format. A record's key never holds where the record came from, so the same line piped or in
a file in the working directory has the same key.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import stat
import sys
import tempfile
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from clef_cli.errors import UsageError
from clef_cli.inputs.formats import format_of

STDIN_NAMES = ("-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0")
MAGIC = ((b"PAR1", ".parquet"), (b"\x1f\x8b", ".jsonl.gz"), (b"\x28\xb5\x2f\xfd", ".jsonl.zst"))
"""A stream's first bytes that say it is not plain JSONL."""


@dataclass(frozen=True)
class Spool:
    """A stream's copy: the file, its size, where its media resolve, the name messages use."""

    path: str
    size: int
    base: str
    shown: str


_spooled: dict[str, Spool] = {}
_folder: list[str] = []


def stream_input(location: object) -> bool:
    """Whether an input names stdin or a pipe (a FIFO or a character device), not a file."""
    if not isinstance(location, (str, Path)):
        return False
    text = str(location)
    if text in STDIN_NAMES:
        return True
    try:
        mode = os.stat(text).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def _identity(location: str, key: str) -> str:
    """Which stream a name stands for: `-` and `/dev/stdin` are one; a later pipe is another."""
    try:
        found = os.fstat(sys.stdin.fileno()) if key == "stdin" else os.stat(location)
    except (AttributeError, OSError, ValueError):  # a test runner's stdin stand-in has no descriptor
        return f"{key}:{id(sys.stdin)}"
    return f"{key}:{found.st_dev}:{found.st_ino}"


def spooled_stream(location: str) -> Spool:
    """The spool of stdin or a pipe, made the first time this process names it."""
    key = "stdin" if location in STDIN_NAMES else location
    identity = _identity(location, key)
    if identity not in _spooled:
        _spooled[identity] = _spool(location, key)
    return _spooled[identity]


def _spool(location: str, key: str) -> Spool:
    if key == "stdin" and sys.stdin is not None and sys.stdin.isatty():
        raise UsageError(f"{location}: stdin is a terminal; pipe records into clef (`zcat x.jsonl.gz | clef score -`)")
    if not _folder:
        _folder.append(tempfile.mkdtemp(prefix="clef-stdin-"))
        atexit.register(shutil.rmtree, _folder[0], True)
    target = Path(_folder[0]) / f"{len(_spooled)}.spool"
    try:
        with _open_stream(location, key) as source, open(target, "wb") as spool:
            head = source.read(4)
            spool.write(head)
            shutil.copyfileobj(source, spool, 1 << 20)
    except OSError as error:
        raise UsageError(f"cannot read {location}: {error}") from None
    suffix = next((suffix for magic, suffix in MAGIC if head.startswith(magic)), ".jsonl")
    named = target.rename(target.with_name(target.stem + suffix))
    if suffix != ".parquet":
        _check_jsonl(named, location)
    return Spool(str(named), named.stat().st_size, os.getcwd(), key)


HEAD_BYTES = 1 << 16
"""How much of a text stream's start is read to tell JSONL from a CSV or TSV."""


def _check_jsonl(spool: Path, location: str) -> None:
    """A stream is read as JSONL: one whose first line is neither a JSON value nor the start of
    an object or array (a CSV or TSV header: `id,state`) is refused once, rather than read as a
    job of records that are all "invalid JSON". A first JSONL line that is broken stays that
    record's error, as in a file."""
    import json

    import pyarrow as pa

    found = format_of(spool.name)
    compression = found.compression if found is not None else None
    try:
        with pa.input_stream(str(spool), compression=compression) as stream:
            head = stream.read(HEAD_BYTES)
    except OSError:
        return  # a damaged compressed stream: its reading names the problem
    line = next((line for line in head.decode("utf-8", "replace").splitlines() if line.strip()), "")
    line = line.lstrip("\ufeff").strip()
    if not line or line.startswith(("{", "[")):
        return
    try:
        json.loads(line)
    except ValueError:
        raise UsageError(
            f"{location}: a stream is read as JSONL (or Parquet, or gzip/zstd JSONL), and its first line "
            f"{line[:60]!r} is not JSON: a CSV or TSV header? save it as a file named .csv or .tsv and give "
            "that path (`... > export.csv && clef score export.csv ...`)"
        ) from None


def _open_stream(location: str, key: str) -> AbstractContextManager[BinaryIO]:
    """The stream to copy; stdin itself stays open (only this process's view of it is read)."""
    if key != "stdin":
        return open(location, "rb")
    if sys.stdin is None:
        raise UsageError(f"{location}: this process has no stdin")
    return contextlib.nullcontext(sys.stdin.buffer)
