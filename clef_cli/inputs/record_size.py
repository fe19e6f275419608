"""How large one record may be where it is read (`--max-record-bytes`), checked before it is held.

A record that is too large is that record's error, never the job's end: a JSONL line over the
limit is read past to its newline in pieces, never held whole (so a `.gz` that inflates to 1 GiB
costs a piece, not the GiB), and a Parquet cell over it is refused from the file's own metadata
(inputs/parquet_pages.py) before any page holding it is decompressed. The records after it keep
their numbers and ids.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from clef_cli.inputs.fields import MEDIA_FIELDS

MAX_RECORD_BYTES = 64 << 20
"""`--max-record-bytes`'s default: one JSONL line, table cell or state (as UTF-8)."""
PIECE_BYTES = 1 << 20
"""What is read at once of a line already known to be over the limit."""
MAX_FILE_BYTES = 256 << 20
"""`--max-file-bytes`'s default (encoding/media_limits.py, which the readers cannot import)."""


PAGE_BYTES = 256 << 20
"""The least a Parquet page may hold to be decompressed: a table of 1 MiB images written in one
batch of rows has pages of many images, each within --max-file-bytes."""


@dataclass(frozen=True)
class ReadLimits:
    """The sizes a reader refuses before holding them: a record's (`--max-record-bytes`) and an
    inline medium's (`--max-file-bytes`, for the cells of `media_columns`); and the largest
    Parquet page decompressed (`page_bytes`, or a cell's limit where that is larger)."""

    record_bytes: int = MAX_RECORD_BYTES
    media_bytes: int = MAX_FILE_BYTES
    media_columns: tuple[str, ...] = MEDIA_FIELDS
    page_bytes: int = PAGE_BYTES


@dataclass(frozen=True)
class Oversize:
    """A line longer than the limit, read past: how many bytes it held (its newline included)."""

    size: int


def bounded_lines(handle: BinaryIO, limit: int) -> Iterator[bytes | Oversize]:
    """Each line of `handle` (its newline kept), or `Oversize` for one of more than `limit` bytes
    before its newline, which is read past a piece at a time and never held."""
    while True:
        line = handle.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit or line.endswith(b"\n"):
            yield line
            continue
        size = len(line)
        while True:
            piece = handle.readline(PIECE_BYTES)
            size += len(piece)
            if not piece or piece.endswith(b"\n"):
                break
        yield Oversize(size)


def oversize_line(file_name: str, line_number: int, size: int, limit: int) -> str:
    """The problem of a line over the limit, as the record's error."""
    return f"{file_name} line {line_number}: a line of {size:,} bytes, over --max-record-bytes ({limit:,})"


@dataclass(frozen=True)
class OversizeCell:
    """A table cell refused unread (its column's pages are larger than the limit allows): the
    record's error naming the field, or for a media field its `media` error (media_cells.py)."""

    column: str
    reason: str
