"""A store's missing or damaged objects: how one is named (the object, its segment, the manifest
that names it, the way on), what `checkpoint info --verify` checks and what `checkpoint repair`
drops.

A damaged object costs its segment's records, never the store: a reader sets the segment aside
(store/remote/cache.py), the job that needs its records computes them again and its commit drops
the segment (store/remote/sync.py); `repair` drops every dead segment now, in one commit under
the store's claim.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from clef_cli.locations.object_store import MissingObject
from clef_cli.store.checkpoint import ShardEntry
from clef_cli.store.remote.layout import manifest_name
from clef_cli.store.remote.manifests import Chain, Manifest
from clef_cli.store.remote.segments import DamagedObject, Segment, named_by, read_parts

NOT_NAMED = "its bytes are not those its name was made of"


def damaged(chain: Chain, segment: str, obj: str, why: Exception | str) -> DamagedObject:
    """The error of a segment's object found missing or damaged, naming it and its manifest."""
    seq = chain.known.seq if chain.known is not None else 0
    where = chain.uri + obj if obj else f"an object of the segment {segment} of {chain.uri}"
    cause = "is missing" if isinstance(why, MissingObject) else f"is damaged ({why})"
    return DamagedObject(f"{where} (named by {chain.uri}{manifest_name(seq)}) {cause}", chain.uri + obj, segment)


def set_aside_line(damage: DamagedObject, records: int) -> str:
    """What a command that met a damaged object says: what is lost and the way on."""
    return (
        f"{damage}: its segment's {records} records are set aside in this machine's cache; the next `clef score` "
        "that needs them computes them again and drops the segment from the store (`clef checkpoint repair` drops "
        "it now)"
    )


def set_aside_entries(manifest: Manifest | None, set_aside: dict[str, str]) -> list[ShardEntry]:
    """The set-aside segments as a checkpoint's damaged shards (what a job's note and `checkpoint
    info` count: one per segment, with its records)."""
    named = manifest.segments if manifest is not None else {}
    return [ShardEntry(segment, named[segment].records, {}, "") for segment in set_aside if segment in named]


@dataclass(frozen=True)
class Lost:
    segment: str
    records: int
    why: str


def verify(chain: Chain, manifest: Manifest, hashes: bool = False) -> list[Lost]:
    """The segments with an object missing or not of the size the manifest names (a HEAD a
    object); `hashes`: keys and results objects downloaded and checked by their content hash too."""
    lost = []
    with tempfile.TemporaryDirectory(prefix="clef-verify-") as folder:
        for segment in manifest.segments.values():
            why = _checked(chain, segment, Path(folder) if hashes else None)
            if why:
                lost.append(Lost(segment.id, segment.records, why))
    return lost


def _checked(chain: Chain, segment: Segment, folder: Path | None) -> str:
    """What is wrong with the segment's objects ("" when nothing is)."""
    sizes = {}
    for obj in (segment.keys, segment.results, *segment.hidden):
        try:
            sizes[obj] = chain.bucket.head(chain.key(obj)).size
        except MissingObject:
            return f"{chain.uri}{obj} is missing"
    for obj, size in ((segment.keys, segment.keys_bytes), (segment.results, segment.results_bytes)):
        if sizes[obj] != size:
            return f"{chain.uri}{obj} holds {sizes[obj]} bytes, not {size}"
    if sum(sizes[obj] for obj in segment.hidden) < segment.hidden_bytes:
        return f"the hidden-state objects of {segment.id} hold fewer bytes than its parts name"
    if folder is not None:
        for obj in (segment.keys, segment.results):
            target = folder / obj.rsplit("/", 1)[-1]
            try:
                chain.bucket.download(chain.key(obj), target)
            except MissingObject:
                return f"{chain.uri}{obj} is missing"
            if not named_by(target, obj):
                return f"{chain.uri}{obj} is damaged ({NOT_NAMED})"
        try:
            read_parts(folder / segment.keys.rsplit("/", 1)[-1], chain.uri + segment.keys)
        except DamagedObject as damage:
            return str(damage)
    return ""


def repair(uri: str, dry_run: bool = False) -> tuple[list[Lost], int]:
    """Drop every dead segment of the store at `uri` (checked by `verify` with hashes) in one
    commit under the store's claim; (what was lost, how many segments were checked)."""
    from clef_cli.errors import UsageError
    from clef_cli.store.remote.compaction import claimed, release

    chain = Chain(uri)
    latest = chain.latest()
    if latest is None:
        raise UsageError(f"{uri} holds no clef store (no manifest)")
    if dry_run:
        return verify(chain, latest, hashes=True), len(latest.segments)
    with claimed(chain, "repair") as (base, claim):
        lost = verify(chain, base, hashes=True)
        dead = {item.segment for item in lost}

        def dropped(latest: Manifest) -> Manifest:
            return replace(latest, segments={k: v for k, v in latest.segments.items() if k not in dead})

        release(chain, claim, dropped)
    return lost, len(base.segments)
