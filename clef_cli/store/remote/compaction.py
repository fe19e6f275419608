"""Compaction: merging a store's small segments into one, so that a store of a thousand nights
opens in a few requests, and the claim that makes it (and prune) exclusive.

Segments merge by level, as a log-structured tree does: when `FANOUT` segments of one level are
named, they become one segment of the next level (their keys objects merged and sorted, their
results objects joined; their hidden-state objects are named, never copied), so a store holds
about `FANOUT` segments per level and a key is rewritten once per level (log_FANOUT of the
nights). A job compacts at its end when a level is full and the store is free; a claim held by
another job makes it skip, never wait.

A compaction killed at any point loses nothing: until its manifest is committed the old segments
count, and what it uploaded is an orphan that `clef checkpoint prune` deletes after its grace
period; its claim expires after its lease. A claim whose lease ran out (by the bucket's clock), or
that another job took since, commits nothing: its holder gives up (`Lapsed`), since a prune may
have taken the store and deleted what its merge names.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from clef_cli import faults
from clef_cli.errors import ClefError
from clef_cli.locations.object_store import MissingObject
from clef_cli.store.remote.manifests import Chain, Manifest, claim_line, holder, new_claim
from clef_cli.store.remote.segments import (
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

FANOUT = 8
"""Segments of one level that are merged into one of the next."""


class Held(ClefError):
    """Another job holds the store's claim."""


class Lapsed(ClefError):
    """This job's claim no longer holds the store (its lease ran out, or another job took it):
    nothing is committed."""


@contextlib.contextmanager
def claimed(chain: Chain, what: str) -> Iterator[tuple[Manifest, dict]]:
    """Hold the store (a manifest naming this claim) while the block runs; yields the manifest it
    was taken on and the claim. The block commits its result with `release` (else the claim is
    released as the block ends, failed or not); a killed one leaves it to expire after its lease."""
    claim = new_claim(what)

    def take(base: Manifest | None) -> Manifest:
        if base is None:
            raise ClefError(f"{chain.uri} holds no clef store (no manifest)")
        held = chain.holding(base)
        if held is not None and held.get("token") != claim["token"]:
            raise Held(claim_line(held, chain.uri))
        return replace(base, claim=claim)

    taken = chain.commit(take, fresh=True)
    assert taken is not None
    faults.pause_at("claimed")
    try:
        yield taken, claim
    except (Exception, KeyboardInterrupt):  # a failure or Ctrl-C: released; a kill leaves it to expire
        with contextlib.suppress(ClefError, OSError):
            release(chain, claim, lambda latest: latest)
        raise
    if not claim.get("released"):
        release(chain, claim, lambda latest: latest)


def release(chain: Chain, claim: dict, change: Callable[[Manifest], Manifest]) -> Manifest:
    """Commit `change(latest)` without this claim, while it still holds the store: its token in the
    latest manifest and its lease not run out by the bucket's clock; else `Lapsed`, nothing committed."""

    def released(base: Manifest | None) -> Manifest:
        assert base is not None
        what = f"the {claim.get('what', 'prune')}'s claim on {chain.uri}"
        if (base.claim or {}).get("token") != claim["token"]:
            taken = f"another job took the store since ({holder(base.claim)})" if base.claim else "it was broken"
            raise Lapsed(f"{what} no longer holds the store: {taken}; nothing committed")
        if chain.holding(base) is None:
            raise Lapsed(f"{what} ran out of its lease by the bucket's clock; nothing committed")
        return replace(change(base), claim=None)

    committed = chain.commit(released, fresh=True)
    assert committed is not None
    claim["released"] = True
    return committed


def due(manifest: Manifest) -> list[Segment]:
    """The segments of the lowest full level (FANOUT of them), oldest first; none when no level is full."""
    by_level: dict[int, list[Segment]] = {}
    for segment in manifest.segments.values():
        by_level.setdefault(segment.level, []).append(segment)
    for level in sorted(by_level):
        if len(by_level[level]) >= FANOUT:
            return by_level[level][:FANOUT]
    return []


def compact(chain: Chain, choose: Callable[[Manifest], list[Segment]] = due) -> Manifest | None:
    """Merge the segments `choose` picks (by default a full level) under the claim; None when
    there is nothing to merge or another job holds the store."""
    latest = chain.latest()
    if latest is None or len(choose(latest)) < 2 or chain.holding(latest) is not None:
        return None
    try:
        with claimed(chain, "compaction") as (base, claim):
            chosen = choose(base)
            if len(chosen) < 2:
                return release(chain, claim, lambda latest: latest)
            packed = merge(chain, chosen)
            upload(chain, packed)
            faults.pause_at("compaction-uploaded")
            gone = {segment.id for segment in chosen}

            def swapped(latest: Manifest) -> Manifest:
                segments = {k: v for k, v in latest.segments.items() if k not in gone}
                return replace(latest, segments=segments | {packed.segment.id: packed.segment})

            return release(chain, claim, swapped)
    except (Held, Lapsed):  # another job holds the store, or took it: its merge waits for a later job
        return None


def merge(chain: Chain, segments: list[Segment]) -> Packed:
    """One segment holding the parts of `segments`: keys merged, results joined, states named.
    Each object is checked against its name first: a segment with one missing or damaged is left
    out, so the swap drops it (its records are computed again by the job that needs them)."""
    results, parts, rows = bytearray(), [], []
    with tempfile.TemporaryDirectory(prefix="clef-compact-") as folder:
        for segment in segments:
            keys_file = Path(folder) / f"{segment.id}.keys"
            data = checked_objects(chain, segment, keys_file)
            if data is None:
                continue
            shift, offset = len(parts), len(results)
            results += data
            for part in read_parts(keys_file, chain.uri + segment.keys):
                spot = (part.results[0] + offset, part.results[1], part.results[2])
                parts.append(replace(part, results=spot))
            for batch in read_keys(keys_file):
                table = pa.Table.from_batches([batch])
                moved = pc.add(table.column("part"), pa.scalar(shift, pa.uint32()))
                rows.append(table.set_column(1, "part", moved))
    keys = keys_object(rows, parts)
    data = bytes(results)
    merged = segment_of(keys, data, parts, level=max(segment.level for segment in segments) + 1)
    return Packed(merged, keys, data, ())


def checked_objects(chain: Chain, segment: Segment, keys_file: Path) -> bytes | None:
    """The segment's keys object downloaded to `keys_file` and its results object's bytes, each
    checked against its name; None when one is missing or damaged (the segment is dead)."""
    try:
        chain.bucket.download(chain.key(segment.keys), keys_file)
        data = chain.bucket.get(chain.key(segment.results))
        read_parts(keys_file, chain.uri + segment.keys)
    except (MissingObject, DamagedObject):
        return None
    alike = named_by(keys_file, segment.keys) and content_name(data, "results") == segment.results
    return data if alike else None


def upload(chain: Chain, packed: Packed) -> None:
    """A merged segment's new objects (its hidden-state objects are the old segments')."""
    chain.bucket.put(chain.key(packed.segment.results), packed.results)
    chain.bucket.put(chain.key(packed.segment.keys), packed.keys)
