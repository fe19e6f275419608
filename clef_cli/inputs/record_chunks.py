"""Records in chunks bounded twice: by count, and by the media bytes the records carry inside
them (a `datasets` table's images), so that a stage holding one chunk (keying, a planning
window) holds about the same memory whether records name their media or carry it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from clef_cli.inputs.media_cells import inline_size
from clef_cli.inputs.records import Record

CHUNK_INLINE_BYTES = 64 << 20
"""Media bytes the records of one chunk may carry (an 8192-record window of 100 KiB images
would otherwise hold 800 MiB, a 4096-record keying chunk 400 MiB)."""
T = TypeVar("T")


def record_chunks(items: Iterable[T], sizes: Iterator[int], max_inline: int = CHUNK_INLINE_BYTES) -> Iterator[list[T]]:
    """Consecutive chunks of `items`, the n-th at most `next(sizes)` long, each ended early once
    its records carry `max_inline` bytes of media."""
    chunk: list[T] = []
    size = next(sizes)
    carried = 0
    for item in items:
        chunk.append(item)
        if isinstance(item, Record):
            carried += inline_size(item.images, item.audio, item.videos)
        if len(chunk) >= size or carried >= max_inline:
            yield chunk
            chunk, size, carried = [], next(sizes), 0
    if chunk:
        yield chunk
