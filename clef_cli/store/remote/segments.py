"""Segments: what a sync uploads, packed from the shards committed since the last one.

A segment is up to three immutable objects (store/remote/layout.py):

- `ID.keys`: an Arrow file of the segment's keys, sorted (32-byte binary), each with its part,
  row, whether its result is final and whether its hidden states are stored (or needed none).
  Its metadata lists the parts: records, run, where the part's results file lies in the results
  object (offset, bytes, SHA-256) and its hidden-state file in a hidden object (object, offset,
  bytes, CRC32). Its name is the hash of its bytes, which name every other byte by checksum.
- `HASH.results`: the parts' results files (Arrow), one after another; small, read whole.
- `HASH.hidden`: the parts' hidden-state files (safetensors), one after another, each read by a
  range when a command needs its states. A compacted segment names the hidden objects of the
  segments it merged (never copied: they are most of a store's bytes).

A part is one committed shard, byte for byte, so a cache folder holds a part as the shard it was.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from clef_cli.errors import RETRIED_KINDS, ClefError
from clef_cli.store.checkpoint import ShardEntry
from clef_cli.store.remote.layout import SEGMENTS

KEY_SCHEMA = pa.schema(
    [("key", pa.binary(32)), ("part", pa.uint32()), ("row", pa.uint32()), ("final", pa.bool_()), ("hidden", pa.bool_())]
)
PARTS = b"clef.parts"
BATCH_ROWS = 65536
"""Keys per record batch of a keys object: a reader holds one batch at a time."""
NAME_LENGTH = 32
"""Hex characters of a content hash in an object's name (128 bits)."""
SEGMENT_ID = re.compile(f"[0-9a-f]{{{NAME_LENGTH}}}")
OBJECT_NAME = re.compile(f"{SEGMENTS}[0-9a-f]{{{NAME_LENGTH}}}\\.(results|hidden)")
"""The names a manifest may give a segment's objects (anything else is a damaged or hostile manifest)."""


class DamagedObject(ClefError):
    """An object of the store does not match what its segment says of it (missing, changed, cut
    short or another's): `obj` names it, `segment` the segment set aside for it."""

    def __init__(self, message: str, obj: str = "", segment: str = "") -> None:
        super().__init__(message)
        self.obj = obj
        self.segment = segment


@dataclass(frozen=True)
class Part:
    records: int
    run: str
    results: tuple[int, int, str]
    """(offset, bytes, sha256) in the segment's results object."""
    hidden: tuple[str, int, int, int] | None
    """(object, offset, bytes, crc32) of its hidden-state file, or None."""
    errors: tuple[int, ...] = ()
    """Its rows that are a failed record's (no states stored for them: `checkpoint info` counts
    the keys with states without reading the results)."""

    def described(self) -> dict[str, Any]:
        return {
            "records": self.records, "run": self.run, "results": list(self.results), "hidden": self.hidden,
            "errors": list(self.errors),
        }  # fmt: skip

    @classmethod
    def read(cls, raw: dict[str, Any]) -> Part:
        hidden = raw.get("hidden")
        results = raw["results"]
        return cls(
            int(raw["records"]),
            str(raw.get("run", "")),
            (int(results[0]), int(results[1]), str(results[2])),
            (str(hidden[0]), int(hidden[1]), int(hidden[2]), int(hidden[3])) if hidden else None,
            tuple(int(row) for row in raw.get("errors") or ()),
        )


@dataclass(frozen=True)
class Segment:
    """A segment as a manifest names it."""

    id: str
    records: int
    keys_bytes: int
    results: str
    results_bytes: int
    hidden: tuple[str, ...]
    """The hidden objects its parts read from (its own, or those of the segments it merged)."""
    hidden_bytes: int
    parts: int
    level: int = 0
    """How many compactions made it (store/remote/compaction.py merges like levels)."""

    @property
    def keys(self) -> str:
        return f"{SEGMENTS}{self.id}.keys"

    def objects(self) -> tuple[str, ...]:
        return (self.keys, self.results, *self.hidden)

    def described(self) -> dict[str, Any]:
        return {
            "records": self.records, "keys_bytes": self.keys_bytes, "results": self.results,
            "results_bytes": self.results_bytes, "hidden": list(self.hidden), "hidden_bytes": self.hidden_bytes,
            "parts": self.parts, "level": self.level,
        }  # fmt: skip

    @classmethod
    def read(cls, segment_id: str, raw: dict[str, Any]) -> Segment:
        """A manifest's entry; a name no writer gives (a path, a URI, another folder) is refused."""
        names = [str(raw["results"]), *map(str, raw.get("hidden") or ())]
        if not SEGMENT_ID.fullmatch(segment_id) or not all(OBJECT_NAME.fullmatch(name) for name in names):
            raise ValueError(f"segment {segment_id[:80]!r} names objects no clef store writes")
        return cls(
            segment_id, int(raw["records"]), int(raw["keys_bytes"]), str(raw["results"]), int(raw["results_bytes"]),
            tuple(raw.get("hidden") or ()), int(raw.get("hidden_bytes", 0)), int(raw["parts"]),
            int(raw.get("level", 0)),
        )  # fmt: skip


@dataclass(frozen=True)
class Packed:
    """A segment ready to upload: its objects' bytes (hidden states as the files to stream)."""

    segment: Segment
    keys: bytes
    results: bytes
    hidden_files: tuple[Path, ...]
    hidden_object: str = ""
    """The object `hidden_files` are uploaded to, one after another ("" when there are none)."""


def content_name(data: bytes | str, suffix: str) -> str:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return f"{SEGMENTS}{hashlib.sha256(raw).hexdigest()[:NAME_LENGTH]}.{suffix}"


def named_by(path: Path, name: str) -> bool:
    """Whether the downloaded file `path` holds the bytes `name` (a `content_name`) was made of."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return name.rsplit("/", 1)[-1].split(".", 1)[0] == digest.hexdigest()[:NAME_LENGTH]


def segment_of(keys: bytes, results: bytes, parts: Sequence[Part], level: int = 0) -> Segment:
    """The segment of these objects and parts, named by its keys object's content; what it holds
    is counted from its parts, so a packed, merged or pruned segment is described alike."""
    return Segment(
        id=content_name(keys, "keys")[len(SEGMENTS) : -len(".keys")],
        records=sum(part.records for part in parts),
        keys_bytes=len(keys),
        results=content_name(results, "results"),
        results_bytes=len(results),
        hidden=tuple(dict.fromkeys(part.hidden[0] for part in parts if part.hidden)),
        hidden_bytes=sum(part.hidden[2] for part in parts if part.hidden),
        parts=len(parts),
        level=level,
    )


def key_rows(table: pa.Table, part: int, has_hidden: bool) -> pa.Table:
    """A shard's keyed rows as keys-object rows (as the key index reads them: key_index._insert_shard)."""
    keyed = table.filter(pc.is_valid(table.column("record_key")))
    rows = pc.indices_nonzero(pc.is_valid(table.column("record_key")))
    kinds = keyed.column("error_kind")
    final = pc.invert(pc.fill_null(pc.is_in(kinds, pa.array(RETRIED_KINDS)), False))
    hidden = pa.array([True] * keyed.num_rows) if has_hidden else pc.is_valid(keyed.column("error"))
    keys = pa.array([bytes.fromhex(key) for key in keyed.column("record_key").to_pylist()], pa.binary(32))
    parts = pa.array([part] * keyed.num_rows, pa.uint32())
    return pa.table([keys, parts, rows.cast(pa.uint32()), final, hidden], schema=KEY_SCHEMA)


def keys_object(rows: Sequence[pa.Table], parts: Sequence[Part]) -> bytes:
    """The keys object: every row sorted by key, the parts in its metadata."""
    table = pa.concat_tables(rows) if rows else KEY_SCHEMA.empty_table()
    table = table.take(pc.sort_indices(table, [("key", "ascending"), ("part", "ascending")]))
    metadata = {PARTS: json.dumps([part.described() for part in parts], separators=(",", ":")).encode("utf-8")}
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, KEY_SCHEMA.with_metadata(metadata)) as writer:
        writer.write_table(table, max_chunksize=BATCH_ROWS)
    return sink.getvalue().to_pybytes()


def pack(entries: Sequence[ShardEntry], shards: Path) -> Packed:
    """The segment of these committed shards (their files read from `shards`; results checked
    against their journal line, hidden states sent as they are and checked by every reader)."""
    results, spots, rows, errors = bytearray(), [], [], []
    hidden_files: list[Path] = []
    hidden_spots: list[tuple[int, int, int] | None] = []
    hidden_offset = 0
    for number, entry in enumerate(entries):
        described = entry.files["results"]
        data = (shards / described["name"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != described["sha256"]:
            raise DamagedObject(f"shard {entry.name} of the cache changed since it was committed")
        spots.append((len(results), len(data), str(described["sha256"])))
        results += data
        table = ipc.open_file(pa.py_buffer(data)).read_all()
        rows.append(key_rows(table, number, entry.has_hidden))
        errors.append(tuple(pc.indices_nonzero(pc.is_valid(table.column("error"))).to_pylist()))
        file = entry.files.get("hidden")
        if file is not None and "object" not in file:
            hidden_spots.append((hidden_offset, int(file["bytes"]), int(file["crc32"])))
            hidden_files.append(shards / file["name"])
            hidden_offset += int(file["bytes"])
        else:
            hidden_spots.append(None)
    # named by the checksums of what it holds (hashing gigabytes of states again would cost a core)
    hidden_name = content_name(json.dumps([spots, hidden_spots]), "hidden") if hidden_files else ""
    parts = [
        Part(entry.records, entry.run, spot, _hidden_place(entry, hidden_name, hidden), failed)
        for entry, spot, hidden, failed in zip(entries, spots, hidden_spots, errors, strict=True)
    ]
    keys = keys_object(rows, parts)
    data = bytes(results)
    return Packed(segment_of(keys, data, parts), keys, data, tuple(hidden_files), hidden_name)


def _hidden_place(
    entry: ShardEntry, packed: str, spot: tuple[int, int, int] | None
) -> tuple[str, int, int, int] | None:
    """Where a part's hidden states lie in the bucket: in this segment's hidden object, or in the
    object a `--ray` actor uploaded them to (whole), or nowhere."""
    file = entry.files.get("hidden")
    if file is None:
        return None
    if "object" in file:
        return (str(file["object"]), 0, int(file["bytes"]), int(file["crc32"]))
    assert spot is not None
    return (packed, *spot)


def read_parts(keys_file: Path, where: str = "") -> list[Part]:
    """The parts a downloaded keys object lists (`where`: the object, as a damage names it)."""
    try:
        with pa.memory_map(str(keys_file)) as source:
            reader = ipc.open_file(source)
            if reader.schema.remove_metadata() != KEY_SCHEMA:
                raise ValueError("not a keys object's columns")
            metadata = reader.schema.metadata or {}
        return [Part.read(raw) for raw in json.loads(metadata[PARTS])]
    except (KeyError, ValueError, TypeError, IndexError, pa.ArrowException) as error:
        raise DamagedObject(f"{where or keys_file.name} is no keys object of a clef store ({error})", where) from None


def read_keys(keys_file: Path, where: str = "") -> Iterator[pa.RecordBatch]:
    """A downloaded keys object, a batch at a time (memory-mapped: bounded memory however large)."""
    try:
        with pa.memory_map(str(keys_file)) as source:
            reader = ipc.open_file(source)
            for number in range(reader.num_record_batches):
                yield reader.get_batch(number)
    except pa.ArrowException as error:
        raise DamagedObject(f"{where or keys_file.name} is no keys object of a clef store ({error})", where) from None


def split_results(source: BinaryIO, parts: Sequence[Part], where: str) -> Iterator[bytes]:
    """A results object (a file downloaded whole) cut into its parts' files, one at a time, each
    checked against its SHA-256 (a compacted segment's object may be large: never held whole)."""
    for part in parts:
        offset, size, digest = part.results
        source.seek(offset)
        piece = source.read(size)
        if hashlib.sha256(piece).hexdigest() != digest:
            raise DamagedObject(f"{where} does not hold the results its segment names (checksum mismatch)")
        yield piece
