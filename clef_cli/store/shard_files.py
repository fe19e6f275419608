"""A shard file's bytes and its journal description (name, size, checksum): what a commit, a
prune's rewrite and a `--ray` actor's hidden shard all write the same way."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from clef_cli.store.atomic import write_file


def write_shard_file(
    folder: Path, file_name: str, data: bytes | Sequence[bytes | memoryview], checksum: str
) -> dict[str, Any]:
    """Write a shard file atomically; its size and checksum (sha256 or crc32) come from the bytes
    in memory, so nothing is read back from disk. `data`: the bytes, or their pieces in order
    (written and summed one by one, never joined)."""
    chunks = [data] if isinstance(data, bytes) else list(data)
    write_file(folder / file_name, lambda handle: [handle.write(chunk) for chunk in chunks])
    return described_file(file_name, chunks, checksum)


def described_file(file_name: str, chunks: Sequence[bytes | memoryview], checksum: str) -> dict[str, Any]:
    """A shard file's journal description: name, size and checksum (sha256 or crc32) of its bytes."""
    if checksum == "sha256":
        hasher = hashlib.sha256()
        for chunk in chunks:
            hasher.update(chunk)
        digest: str | int = hasher.hexdigest()
    else:
        digest = 0
        for chunk in chunks:
            digest = zlib.crc32(chunk, digest)
    return {"name": file_name, "bytes": sum(memoryview(chunk).nbytes for chunk in chunks), checksum: digest}


def ipc_bytes(table: pa.Table) -> bytes:
    """A results shard's bytes: the table as an Arrow IPC file."""
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def put_hidden_shard(target: str, payload_chunks: Sequence[bytes | memoryview]) -> dict[str, Any]:
    """A hidden-state shard written where a store's writers put them (`Checkpoint.hidden_target`):
    a local shards folder (the file, not yet counted), or a store in a bucket (an object named by
    its content under `segments/`, uploaded now: a `--ray` actor on a node that shares no disk
    with the driver). The journal description names the object as `object` then."""
    import uuid

    from clef_cli.locations.uris import is_object_uri

    name = f"ray-{uuid.uuid4().hex}.hidden.safetensors"
    if not is_object_uri(target):
        return write_shard_file(Path(target), name, payload_chunks, "crc32")
    from clef_cli.locations.buckets import bucket

    chunks = list(payload_chunks)
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    obj = f"segments/{digest.hexdigest()[:32]}.hidden"
    store = bucket(target)
    store.put(store.key(target) + obj, lambda: iter(chunks))
    return described_file(name, chunks, "crc32") | {"object": obj}
