"""Hidden states in a `--ray` job, kept under the checkpoint's commit protocol.

Each actor writes the hidden-state shard of every batch it runs straight into the checkpoint's
shard folder, through the same writer as the local engine (`hidden_store.hidden_payload`), and
tags that batch's result rows with the file's name, size and CRC. The driver commits the rows of
each file as one shard whose journal line names the file, so the file counts only once that line
is written; files from a killed run are never journaled and the next run deletes them.

With a folder store the actors must see its folder: on a cluster of several machines it has to
be on a filesystem every node mounts, which is checked before any work. With a store in a bucket
they upload each shard straight to the bucket instead (an object named by its content, with the
node's own credentials), and the driver's shard names that object: the nodes share nothing but
the bucket, and an upload no manifest came to name is an orphan `checkpoint prune` deletes.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from clef_cli.errors import UsageError
from clef_cli.store.checkpoint import Checkpoint
from clef_cli.store.hidden_store import HiddenPayload
from clef_cli.store.shard_files import put_hidden_shard

HIDDEN_FILE, HIDDEN_BYTES, HIDDEN_CRC = "hidden_file", "hidden_bytes", "hidden_crc32"
HIDDEN_OBJECT = "hidden_object"
TAGS = pa.schema(
    [(HIDDEN_FILE, pa.string()), (HIDDEN_BYTES, pa.int64()), (HIDDEN_CRC, pa.int64()), (HIDDEN_OBJECT, pa.string())]
)


def write_hidden(target: str, payload: HiddenPayload) -> dict[str, Any]:
    """Write one batch's hidden shard where the store's writers put them (not counted yet)."""
    return put_hidden_shard(target, payload.chunks())


def tag(results: pa.Table, described: dict[str, Any] | None) -> pa.Table:
    """The result rows of one batch, each naming the hidden shard that holds its states."""
    values = (None,) * 4
    if described is not None:
        values = (described["name"], described["bytes"], described["crc32"], described.get("object"))
    for field, value in zip(TAGS, values, strict=True):
        results = results.append_column(field, pa.array([value] * results.num_rows, type=field.type))
    return results


def commit_block(checkpoint: Checkpoint, block: pa.Table) -> None:
    """Commit a block from the actors: one shard per hidden file, one for rows without."""
    names = block.column(HIDDEN_FILE)
    results = block.drop_columns(TAGS.names)
    if names.null_count == block.num_rows:
        checkpoint.commit(results)
        return
    if names.null_count:
        checkpoint.commit(results.filter(pc.is_null(names)))
    for name in pc.unique(names.drop_null()).to_pylist():
        chosen = pc.equal(names, name)
        first = block.filter(chosen).slice(0, 1).to_pylist()[0]
        described = {"name": name, "bytes": first[HIDDEN_BYTES], "crc32": first[HIDDEN_CRC]}
        if first[HIDDEN_OBJECT]:
            described["object"] = first[HIDDEN_OBJECT]
        checkpoint.commit(results.filter(chosen), hidden_file=described)


def _exists(path: str) -> bool:
    return os.path.exists(path)


def check_every_node_sees(folder: Path) -> None:
    """Refuse to keep hidden states when some node of the cluster cannot see `folder` (a probe
    file written here, looked for by a zero-CPU task pinned to each node)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [node for node in ray.nodes() if node.get("Alive")]
    if len(nodes) <= 1:
        return
    probe = folder / f".probe-{uuid.uuid4().hex}"
    probe.touch()
    try:
        exists = ray.remote(num_cpus=0)(_exists)
        checks = [
            exists.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(
                str(probe)
            )
            for node in nodes
        ]
        seen = ray.get(checks, timeout=120)
    finally:
        probe.unlink(missing_ok=True)
    blind = [str(node.get("NodeManagerAddress")) for node, ok in zip(nodes, seen, strict=True) if not ok]
    if blind:
        raise UsageError(
            f"--hidden-states keep needs the checkpoint {folder} on a filesystem every Ray node mounts, but "
            f"{len(blind)} of {len(nodes)} nodes cannot see it ({', '.join(blind[:3])}); use --checkpoint on a "
            "shared filesystem, or --hidden-states drop"
        )
