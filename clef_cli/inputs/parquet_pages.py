"""Which cells of a Parquet row group are too large to read, told before they are copied.

A Parquet reader decompresses a column a page at a time, and a page holds at least its largest
value: a 20 KB file can hold a 600 MiB cell of zeros. So before a row group is read, each column
chunk's uncompressed size (the footer's metadata) is compared with what one page may cost
(`page_budget`: the column's cell limit, `--max-file-bytes` for a media column and
`--max-record-bytes` for any other, and at least 256 MiB, `ReadLimits.page_bytes`); a chunk over it has its page
headers read (a few bytes each, Thrift's compact encoding, parsed here), and a page over it is
never decompressed: that column is left out of the row group's read and each of its rows gets an
`OversizeCell` (the record's error naming the field; a medium's is a `media` error). Pages within
the budget are read, and each cell's size is then taken from the Arrow buffers' lengths
(`largest_values`), before any value is copied out of them: a cell over its limit gets an
`OversizeCell` too, and its neighbours are read as ever.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, BinaryIO

from clef_cli.inputs.record_size import OversizeCell, ReadLimits

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)
"""Thrift compact protocol type codes."""

if TYPE_CHECKING:  # numpy and pyarrow load where Parquet is read (not for `clef --help`)
    import numpy as np
HEADER_BYTES = 1 << 16
"""What is read for one page header (it holds the page's statistics, which writers keep short)."""


def limit_of(column: str, limits: ReadLimits) -> tuple[int, str]:
    """(bytes, option) one cell of `column` may hold."""
    if column in limits.media_columns:
        return limits.media_bytes, "--max-file-bytes"
    return limits.record_bytes, "--max-record-bytes"


def page_budget(column: str, limits: ReadLimits) -> int:
    """The largest page of `column` decompressed: its cells' limit, at least `limits.page_bytes`."""
    return max(limit_of(column, limits)[0], limits.page_bytes)


class Unreadable(Exception):
    """Page headers that do not parse: the reader then meets the damage itself."""


def refused_columns(source: Any, parquet: Any, group: int, limits: ReadLimits) -> dict[str, OversizeCell]:
    """Top-level column -> why its cells in row group `group` are not read (a page over its
    budget). `source` opens the file's bytes, only for a chunk over the budget."""
    metadata = parquet.metadata.row_group(group)
    refused: dict[str, OversizeCell] = {}
    for number in range(metadata.num_columns):
        chunk = metadata.column(number)
        column = chunk.path_in_schema.split(".")[0]
        budget = page_budget(column, limits)
        if column in refused or chunk.total_uncompressed_size <= budget:
            continue
        largest = _largest_page(source, chunk)
        if largest is not None and largest <= budget:
            continue
        size = f"a page of {largest:,} bytes" if largest is not None else f"{chunk.total_uncompressed_size:,} bytes"
        allowed, option = limit_of(column, limits)
        reason = (
            f"column {column!r} holds {size} in row group {group} of this Parquet file, more than clef "
            f"decompresses at once ({budget:,} bytes; a cell may hold {option} {allowed:,}): its cells there "
            "are not read"
        )
        refused[column] = OversizeCell(column, reason)
    return refused


def oversize_cells(batch: Any, limits: ReadLimits) -> dict[str, tuple[np.ndarray, list[OversizeCell | None]]]:
    """Column -> (rows over the limit, their `OversizeCell`s) in a batch read as Arrow, from the
    buffers' lengths: nothing is copied out of them."""
    found: dict[str, tuple[np.ndarray, list[OversizeCell | None]]] = {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        sizes = largest_values(column)
        allowed, option = limit_of(name, limits)
        over = sizes > allowed
        if over.any():
            media = name in limits.media_columns
            cells = [
                OversizeCell(name, _cell_reason(int(size), allowed, option, media)) if bad else None
                for size, bad in zip(sizes, over, strict=True)
            ]
            found[name] = (over, cells)
    return found


def _cell_reason(size: int, allowed: int, option: str, media: bool) -> str:
    if media:  # the words a medium over the limit has when its bytes are held (encoding/inline_media.py)
        return f"inline media is {size} bytes, over the limit of {allowed}"
    return f"a cell of {size:,} bytes, over {option} ({allowed:,})"


def largest_values(array: Any) -> np.ndarray:
    """Per row of an Arrow array, the length of the largest string or binary value in its cell
    (inside lists, structs and maps too); 0 where there is none."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type
    if _is(kind, TEXT_TYPES):
        return np.asarray(pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    if pa.types.is_fixed_size_binary(kind):
        return np.full(len(array), kind.byte_width, dtype=np.int64)
    if pa.types.is_dictionary(kind):
        sizes = largest_values(array.dictionary)
        if not len(sizes):
            return np.zeros(len(array), dtype=np.int64)
        indices = array.indices.fill_null(0).to_numpy(zero_copy_only=False)
        valid = array.is_valid().to_numpy(zero_copy_only=False)
        return np.where(valid, sizes[indices], 0)
    if pa.types.is_struct(kind):
        result = np.zeros(len(array), dtype=np.int64)
        for field in array.flatten():
            result = np.maximum(result, largest_values(field))
        return result
    if pa.types.is_fixed_size_list(kind):
        result = np.zeros(len(array), dtype=np.int64)
        values = pc.list_flatten(array)
        if len(values):
            parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
            np.maximum.at(result, parents, largest_values(values))
        return result
    if _is(kind, LIST_TYPES):  # lists and maps: each row's range of the (whole) child array
        offsets = array.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        sizes = largest_values(array.values.slice(0, int(offsets[-1]) if len(offsets) else 0))
        return _range_max(sizes, offsets)
    return np.zeros(len(array), dtype=np.int64)


def _range_max(sizes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The largest of `sizes[offsets[i]:offsets[i + 1]]` for each i (0 for an empty range)."""
    import numpy as np

    starts, ends = offsets[:-1], offsets[1:]
    result = np.zeros(len(starts), dtype=np.int64)
    filled = ends > starts
    if filled.any():  # the filled ranges follow one another, so each ends where the next begins
        result[filled] = np.maximum.reduceat(sizes, starts[filled])
    return result


TEXT_TYPES = ("is_binary", "is_string", "is_large_binary", "is_large_string", "is_binary_view", "is_string_view")
LIST_TYPES = ("is_list", "is_large_list", "is_map")


def _is(kind: Any, tests: tuple[str, ...]) -> bool:
    import pyarrow as pa

    return any(getattr(pa.types, test, lambda _: False)(kind) for test in tests)


def _largest_page(source: Any, chunk: Any) -> int | None:
    """The largest uncompressed page of a column chunk; None when its headers do not parse."""
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and chunk.dictionary_page_offset:
        start = min(start, chunk.dictionary_page_offset)
    end = start + chunk.total_compressed_size
    largest = 0
    try:
        with source.open_binary(decompress=False) as handle:
            window = _Window(handle)
            position = start
            while position < end:
                uncompressed, compressed, length = page_header(window.at(position, HEADER_BYTES))
                largest = max(largest, uncompressed)
                position += length + compressed
    except (Unreadable, OSError, ValueError):
        return None
    return largest


class _Window:
    """Forward reads of a file that may not seek (an object store's stream): the bytes at a
    position, from what was read already or by reading (or seeking) on to it."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.start = 0
        self.data = b""

    def at(self, position: int, count: int) -> bytes:
        if position < self.start:
            raise Unreadable("page headers out of order")
        offset = position - self.start
        if offset + count <= len(self.data):
            return self.data[offset : offset + count]
        if self.handle.seekable():
            self.handle.seek(position)
            self.start, self.data = position, self.handle.read(count)
            return self.data
        kept = self.data[offset:]
        self._skip(offset - len(self.data))
        self.start, self.data = position, kept + self.handle.read(count - len(kept))
        return self.data

    def _skip(self, count: int) -> None:
        """Read past `count` bytes after the window (none when the position is inside it)."""
        while count > 0:
            piece = self.handle.read(min(1 << 20, count))
            if not piece:
                raise Unreadable("the file ends inside a column chunk")
            count -= len(piece)


def page_header(data: bytes) -> tuple[int, int, int]:
    """(uncompressed size, compressed size, header length) of the page header starting `data`."""
    reader = _Compact(data)
    fields = reader.struct(keep=(2, 3))
    if 2 not in fields or 3 not in fields or fields[2] < 0 or fields[3] < 0:
        raise Unreadable("a page header without its sizes")
    return fields[2], fields[3], reader.position


class _Compact:
    """Just enough of Thrift's compact protocol to read a struct's integer fields and skip the rest."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.position = 0

    def byte(self) -> int:
        if self.position >= len(self.data):
            raise Unreadable("a page header longer than was read")
        value = self.data[self.position]
        self.position += 1
        return value

    def varint(self) -> int:
        result = shift = 0
        while True:
            value = self.byte()
            result |= (value & 0x7F) << shift
            if not value & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise Unreadable("a varint longer than 64 bits")

    def zigzag(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def struct(self, keep: tuple[int, ...] = (), depth: int = 0) -> dict[int, int]:
        """A struct's fields; the integer ones named in `keep` are returned, the rest skipped."""
        if depth > 32:
            raise Unreadable("structs nested too deep")
        kept: dict[int, int] = {}
        field = 0
        while True:
            head = self.byte()
            kind = head & 0x0F
            if kind == STOP:
                return kept
            delta = head >> 4
            field = field + delta if delta else self.zigzag()
            if field in keep and kind in (I16, I32, I64):
                kept[field] = self.zigzag()
            else:
                self.skip(kind, depth)

    def skip(self, kind: int, depth: int) -> None:
        if kind in (TRUE, FALSE):
            return
        if kind == BYTE:
            self.byte()
        elif kind in (I16, I32, I64):
            self.varint()
        elif kind == DOUBLE:
            self._advance(8)
        elif kind == BINARY:
            self._advance(self.varint())
        elif kind in (LIST, SET):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self._element(head & 0x0F, depth)
        elif kind == MAP:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self._element(types >> 4, depth)
                    self._element(types & 0x0F, depth)
        elif kind == STRUCT:
            self.struct(depth=depth + 1)
        else:
            raise Unreadable(f"unknown Thrift type {kind}")

    def _element(self, kind: int, depth: int) -> None:
        if kind in (TRUE, FALSE):  # a boolean inside a container takes a byte
            self.byte()
        else:
            self.skip(kind, depth + 1)

    def _advance(self, count: int) -> None:
        if count < 0 or self.position + count > len(self.data):
            raise Unreadable("a page header longer than was read")
        self.position += count
