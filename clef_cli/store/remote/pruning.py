"""`clef checkpoint prune s3://…`: the bucket store's prune, under its claim.

Under the store's claim (no job's sync nor compaction commits meanwhile, so the plan is made on the
segments it changes), which keys stay is decided as for a local store (`prune.kept_run_seqs`): a
key stays when a kept run used it, which for a store in a bucket means the run computed it (its
segments' parts name the run) or its records had it (the run's `runs/RUN.keys`). Segments that lose
keys are rewritten (their keys object filtered, their results object cut to the parts still needed;
a part's hidden states stay where they are until no segment names their object), one manifest
switches to them, and the claim is released in it.

Then the objects no manifest names any more are deleted, once they are older than the grace period:
what the prune replaced, the orphans of writers killed between an upload and their manifest, the
manifests far behind the latest. A writer's upload younger than the grace period is never touched,
so a prune never races a running job's commit: the grace period is at least a claim's lease plus a
commit's patience (`grace_floor`; shorter only for a store no job writes to meanwhile,
`no_running_jobs`), its age is the bucket's clock's, and a writer that commits after a prune puts
what it names again if the prune deleted it (sync.py).
"""

from __future__ import annotations

import math
import sqlite3
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from clef_cli import faults
from clef_cli.errors import UsageError
from clef_cli.locations.object_store import MissingObject
from clef_cli.sizes import plural
from clef_cli.store.key_index import LOOKUP_CHUNK, counts_as_run
from clef_cli.store.prune import PruneReport, check_limits, kept_run_seqs
from clef_cli.store.remote.compaction import claimed, release, upload
from clef_cli.store.remote.layout import LATEST, RUNS, SEGMENTS, manifest_seq
from clef_cli.store.remote.manifests import COMMIT_PATIENCE, Chain, Manifest, claim_lease
from clef_cli.store.remote.segments import (
    KEY_SCHEMA,
    DamagedObject,
    Packed,
    Segment,
    content_name,
    keys_object,
    named_by,
    read_keys,
    read_parts,
    segment_of,
)

KEEP_MANIFESTS = 16
"""Manifests kept behind the latest (a reader that listed a moment ago still finds its own)."""


def prune_bucket(
    uri: str,
    keep_runs: int | None = None,
    older_than_days: float | None = None,
    force: bool = False,
    dry_run: bool = False,
    grace_seconds: float = 86400.0,
    no_running_jobs: bool = False,
) -> PruneReport:
    """Prune the store at `uri` (see the module's note); a grace period under `grace_floor()` is
    refused unless `no_running_jobs` (the caller says no job writes to the store meanwhile)."""
    check_limits(keep_runs, older_than_days)
    if grace_seconds < grace_floor() and not no_running_jobs:
        raise UsageError(
            f"--grace-hours {grace_seconds / 3600:g} is under the floor of {grace_floor() / 3600:.3g} hours (a claim's "
            f"lease of {claim_lease():g} s plus a commit's patience of {COMMIT_PATIENCE:g} s): a running job's upload "
            f"would be deleted before it is named; add --no-running-jobs if no job writes to {uri} meanwhile"
        )
    chain = Chain(uri)
    latest = chain.latest()
    if latest is None:
        raise UsageError(f"{uri} holds no clef store (no manifest)")
    with tempfile.TemporaryDirectory(prefix="clef-prune-") as folder:
        if dry_run:
            report, _ = _plan(chain, latest, keep_runs, older_than_days, Path(folder))
        else:  # planned under the claim: no job's sync or compaction changes the segments meanwhile
            with claimed(chain, "prune") as (base, claim):
                report, plan = _plan(chain, base, keep_runs, older_than_days, Path(folder))
                if report.drops_every_key and not force:
                    raise UsageError(
                        f"this prune would drop all {report.keys_before:,} keys of {uri}: no kept run used any "
                        f"({plural(len(report.kept_runs), 'completed run')} with keys kept); see `clef checkpoint "
                        "prune --dry-run`, keep more runs, or add --force to drop them all"
                    )
                if plan:
                    _apply(chain, claim, plan)
        report.dry_run = dry_run
    report.objects_deleted = sweep(chain, grace_seconds, dry_run)
    return report


def grace_floor() -> float:
    """The shortest grace period (seconds) a prune may give while jobs run: an upload is named by
    a manifest within a commit's patience, after waiting at most a claim's lease."""
    return claim_lease() + COMMIT_PATIENCE


def _runs(manifest: Manifest) -> list[dict[str, Any]]:
    """The manifest's runs as the local prune reads them (numbered in the order they started)."""
    ordered = sorted(manifest.runs.items(), key=lambda item: (item[1].get("started") or 0, item[0]))
    return [{"seq": seq, "run_id": run_id, **run} for seq, (run_id, run) in enumerate(ordered, start=1)]


def _plan(
    chain: Chain, latest: Manifest, keep_runs: int | None, older_than_days: float | None, folder: Path
) -> tuple[PruneReport, dict[str, Packed | None]]:
    """What goes: segment id -> its rewrite (None: removed whole), for those that lose keys."""
    runs = _runs(latest)
    seqs = kept_run_seqs(runs, keep_runs, older_than_days)
    kept_runs = {run["run_id"] for run in runs if run["seq"] in seqs}
    report = PruneReport(kept_runs=[run["run_id"] for run in runs if run["seq"] in seqs and counts_as_run(run)])
    kept = sqlite3.connect(str(folder / "kept.sqlite"))
    kept.execute("CREATE TABLE kept (key BLOB PRIMARY KEY) WITHOUT ROWID")
    for run_id in kept_runs:
        if name := latest.runs[run_id].get("keys"):
            target = folder / "run.keys"
            chain.bucket.download(chain.key(name), target)
            for batch in read_keys(target):
                kept.executemany(
                    "INSERT OR IGNORE INTO kept VALUES (?)", ((key,) for key in batch.column(0).to_pylist())
                )
    plan: dict[str, Packed | None] = {}
    for segment in latest.segments.values():
        rewrite, total, dropped = _filtered(chain, segment, kept, kept_runs, folder)
        report.keys_before += total
        report.keys_dropped += dropped
        if dropped:
            plan[segment.id] = rewrite
            report.shards_rewritten += rewrite is not None
            report.shards_removed += rewrite is None
            report.bytes_freed += segment.results_bytes - (rewrite.segment.results_bytes if rewrite else 0)
    report.rows_dropped = report.keys_dropped
    report.drops_every_key = report.keys_before > 0 and report.keys_dropped == report.keys_before
    kept.close()
    return report, plan


def _filtered(
    chain: Chain, segment: Segment, kept: sqlite3.Connection, kept_runs: set[str], folder: Path
) -> tuple[Packed | None, int, int]:
    """The segment without the keys no kept run used: (its rewrite or None when none stay, keys,
    dropped). Its objects are checked against their names as they are read: a dead segment (one
    missing or damaged) is dropped whole, its records counted as dropped."""
    keys_file = folder / f"{segment.id}.keys"
    try:
        chain.bucket.download(chain.key(segment.keys), keys_file)
        if not named_by(keys_file, segment.keys):
            return None, segment.records, segment.records
        parts = read_parts(keys_file, chain.uri + segment.keys)
    except (MissingObject, DamagedObject):
        return None, segment.records, segment.records
    runs_kept = pa.array([part.run in kept_runs for part in parts])
    pieces, total = [], 0
    for batch in read_keys(keys_file):
        table = pa.Table.from_batches([batch])
        total += table.num_rows
        keys = table.column(0).to_pylist()
        used = set()  # this batch's keys a kept run had (bounded: one batch)
        for start in range(0, len(keys), LOOKUP_CHUNK):
            chunk = keys[start : start + LOOKUP_CHUNK]
            query = f"SELECT key FROM kept WHERE key IN ({','.join('?' * len(chunk))})"
            used.update(row[0] for row in kept.execute(query, chunk))
        by_key = pa.array([key in used for key in keys])
        pieces.append(table.filter(pc.or_(by_key, pc.take(runs_kept, table.column("part")))))
    remaining = pa.concat_tables(pieces) if pieces else KEY_SCHEMA.empty_table()
    dropped = total - remaining.num_rows
    if not dropped or not remaining.num_rows:
        return None, total, dropped
    needed = sorted(set(remaining.column("part").to_pylist()))
    renumber = {old: new for new, old in enumerate(needed)}
    moved = pa.array([renumber[part] for part in remaining.column("part").to_pylist()], pa.uint32())
    try:
        data = chain.bucket.get(chain.key(segment.results))
    except MissingObject:
        return None, total, total
    if content_name(data, "results") != segment.results:
        return None, total, total
    results, new_parts = bytearray(), []
    for old in needed:
        part = parts[old]
        offset, size, digest = part.results
        new_parts.append(replace(part, results=(len(results), size, digest)))
        results += data[offset : offset + size]
    keys = keys_object([remaining.set_column(1, "part", moved)], new_parts)
    packed = bytes(results)
    rewritten = segment_of(keys, packed, new_parts, level=segment.level)
    return Packed(rewritten, keys, packed, ()), total, dropped


def _apply(chain: Chain, claim: dict, plan: dict[str, Packed | None]) -> Manifest:
    """Upload the rewrites and switch to them in one manifest that releases the claim."""
    for packed in plan.values():
        if packed is not None:
            upload(chain, packed)

    def switched(latest: Manifest) -> Manifest:
        segments = {key: value for key, value in latest.segments.items() if key not in plan}
        segments |= {packed.segment.id: packed.segment for packed in plan.values() if packed is not None}
        return replace(latest, segments=segments)

    committed = release(chain, claim, switched)
    faults.pause_at("prune-committed")
    return committed


def sweep(chain: Chain, grace_seconds: float, dry_run: bool = False) -> int:
    """Delete what the latest manifest does not name and is older than the grace period; how many."""
    latest = chain.latest()
    if latest is None:
        return 0
    named = {LATEST} | {name for segment in latest.segments.values() for name in segment.objects()}
    named |= {run["keys"] for run in latest.runs.values() if run.get("keys")}
    now = time.time() if dry_run else chain.server_now()  # the bucket's clock (a dry run writes nothing)
    cutoff = now - grace_seconds
    deleted = 0
    for info in list(chain.bucket.list(chain.prefix)):
        name = info.key[len(chain.prefix) :]
        seq = manifest_seq(name)
        ours = seq is not None or name.startswith((SEGMENTS, RUNS))
        if not ours or name in named or (seq is not None and seq > latest.seq - KEEP_MANIFESTS):
            continue
        if math.floor(info.modified) <= cutoff:  # whole seconds, as the bucket's clock is read
            deleted += 1
            if not dry_run:
                chain.bucket.delete(info.key)
    return deleted
