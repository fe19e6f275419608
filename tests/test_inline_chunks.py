"""Records carrying their media (inline bytes) are held in chunks bounded by those bytes as well
as by count, so keying and planning hold about the same memory whatever the table (issue 47)."""

from __future__ import annotations

from itertools import repeat

from clef_cli.inputs.media_cells import InlineBytes
from clef_cli.inputs.record_chunks import record_chunks
from clef_cli.inputs.records import InvalidRecord, Record


def record(index: int, size: int) -> Record:
    return Record(str(index), index, "s", (), images=(InlineBytes(b"x" * size),) if size else (), audio=("a.wav",))


def test_chunks_end_at_the_inline_byte_budget_and_keep_every_record_in_order():
    carrying, naming = [record(i, 1000) for i in range(10)], [record(i, 0) for i in range(11, 20)]
    items = [*carrying, InvalidRecord("x", 10, "bad"), *naming]
    chunks = list(record_chunks(items, repeat(8), max_inline=3000))
    assert [len(chunk) for chunk in chunks] == [3, 3, 3, 8, 3]  # 3 KB ends a chunk; paths and errors weigh nothing
    assert [item.index for chunk in chunks for item in chunk] == list(range(20))
