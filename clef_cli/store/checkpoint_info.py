"""What `clef checkpoint info` says of a store: one shape for a folder and a bucket store, each
filling in what it knows (a folder reads its shards; a bucket store answers from its manifest and
key index without downloading a part)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

Checkpoint = Any
"""A `store.checkpoint.Checkpoint` (not imported: that module imports this one)."""


def described(
    checkpoint: Checkpoint,
    keys_with_states: int,
    size_bytes: int,
    sizes: dict[str, int],
    last_used: dict[str, int] | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The info of any store: its fingerprint, keys, shards, sizes, damage and runs, and `more`.
    `last_used`: run id -> the keys it used last, where the key index alone does not know (a
    bucket store's: store/remote/last_users.py); else the index counts them."""
    manifest, index = checkpoint.manifest, checkpoint.index
    assert index is not None
    runs = index.runs(count_keys=last_used is None)
    if last_used is not None:
        runs = [run | {"keys_last_used": last_used.get(run["run_id"], 0)} for run in runs]
    return {
        "path": checkpoint.where,
        "keys": index.count(),
        "shards": len(checkpoint.entries),
        "shards_with_hidden_states": sum(entry.has_hidden for entry in checkpoint.entries),
        "keys_with_hidden_states": keys_with_states,
        "size_bytes": size_bytes,
        "results_bytes": sizes.get("results", 0),
        "hidden_bytes": sizes.get("hidden", 0),
        "model": manifest.get("model", {}),
        "settings": manifest.get("settings", {}),
        "created": manifest.get("created"),
        "damaged_shards": [entry.name for entry in checkpoint.dropped],
        "damaged_records": sum(entry.records for entry in checkpoint.dropped),
        "runs": runs,
    } | more


def local_info(checkpoint: Checkpoint) -> dict[str, Any]:
    """A folder store's info: sizes from its journal, its size on disk, its keys with states."""
    sizes = {"results": 0, "hidden": 0}
    for entry in checkpoint.entries:
        for kind, file in entry.files.items():
            sizes[kind] = sizes.get(kind, 0) + int(file["bytes"])
    on_disk = sum(path.stat().st_size for path in checkpoint.path.rglob("*") if path.is_file())
    return described(checkpoint, keys_with_states(checkpoint), on_disk, sizes)


def keys_with_states(checkpoint: Checkpoint) -> int:
    """Scored keys whose hidden states the store holds: the live rows without an error of the
    shards that have states (a failed record's row has none)."""
    assert checkpoint.index is not None
    count = 0
    for entry in checkpoint.entries:
        if entry.has_hidden:
            rows = checkpoint.index.live_rows(entry.name)
            errors = checkpoint.shard_table(entry.name).column("error").take(pa.array(rows, pa.int64()))
            count += errors.null_count
    return count
