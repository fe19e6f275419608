"""The checkpoint of a store in a bucket: the local checkpoint in its cache folder, brought up to
date from the latest manifest when it is opened, reading remote parts as they are needed, and
synced to the bucket beside the job (store/remote/sync.py). Everything else about it (commits,
the key index, the ledger, the output) is the local store's own code.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from clef_cli.choices import DEFAULT_SYNC_EVERY, DEFAULT_SYNC_FAILURE_LIMIT
from clef_cli.errors import ClefError, UsageError
from clef_cli.locations.uris import LocationProblem
from clef_cli.store.checkpoint import Checkpoint, ShardEntry, discard
from clef_cli.store.checkpoint_info import described
from clef_cli.store.location import StoreLocation, lock_slot
from clef_cli.store.locks import JobLock
from clef_cli.store.manifest import CheckpointMismatch, comparable, mismatch_message, read_manifest
from clef_cli.store.remote.cache import Cache, Mark
from clef_cli.store.remote.compaction import compact, due
from clef_cli.store.remote.damage import set_aside_entries
from clef_cli.store.remote.last_users import last_users
from clef_cli.store.remote.layout import FOLDERS, PROBE, own_name
from clef_cli.store.remote.manifests import Chain, Manifest, claim_line
from clef_cli.store.remote.segments import DamagedObject
from clef_cli.store.remote.sync import Syncer

SHOWN_STRANGERS = 3


class RemoteCheckpoint(Checkpoint):
    """A checkpoint whose truth is a bucket (see the module's note); `open_remote` makes one."""

    location: StoreLocation
    chain: Chain
    cache: Cache
    mark: Mark
    syncer: Syncer | None = None
    held: JobLock | None = None
    latest: Manifest | None = None

    @classmethod
    def open_remote(
        cls,
        location: StoreLocation,
        manifest: dict[str, Any] | None,
        restart: bool = False,
        sync_every: float | None = DEFAULT_SYNC_EVERY,
        hold_lock: bool = False,
        say: Callable[[str], None] | None = None,
        failure_limit: float = DEFAULT_SYNC_FAILURE_LIMIT,
        stop: threading.Event | None = None,
    ) -> RemoteCheckpoint:
        """Open the store for a job with this fingerprint (`manifest`), or only to read it
        (`manifest` None: the store must exist). `sync_every` None: a reader (no sync; the run it
        records, `--rehead`'s, is committed to the manifest when it closes);
        `hold_lock`: take a cache folder's lock here, the first free one (the caller holds none); `say`: where the
        lines about the syncs go (failures, the job's end waiting for a claim); `stop`: the job's
        stop event, set once the syncs have failed for `failure_limit` seconds (sync.py)."""
        assert location.uri is not None
        held: JobLock | None = None
        if hold_lock:  # chosen and locked in one step: a folder another job holds is skipped
            location, held = lock_slot(location)
        folder = location.folder
        try:
            chain = Chain(location.uri)
            latest = chain.latest()
            if latest is None:
                check_prefix(chain, reading=manifest is None, option=location.option)
            if sync_every is not None and latest is not None and (claim := chain.holding(latest)) is not None:
                raise ClefError(claim_line(claim, location.uri) + ": rerun then")
            if restart:
                latest = _restarted(chain, manifest or {})
                discard(folder)
            fingerprint = _fingerprint(location, latest, manifest)
            cached = _cached_manifest(folder)
            if cached is not None and comparable(cached) != comparable(fingerprint):
                discard(folder)  # the cache of another store (restarted since): only downloads are lost
            cache = Cache(chain, folder)
            checkpoint = cls.open(folder, fingerprint, fetch=cache.fetch)
            checkpoint.location, checkpoint.chain, checkpoint.cache, checkpoint.held = location, chain, cache, held
            checkpoint.latest = latest
            checkpoint.mark = Mark.load(folder, location.uri)
            cache.refresh(checkpoint, latest, checkpoint.mark)
            checkpoint.dropped += set_aside_entries(latest, checkpoint.mark.set_aside)  # computed again
            checkpoint._names.floor = checkpoint.mark.synced_through  # new shards are numbered after the synced
        except BaseException:
            if held is not None:
                held.release()
            raise
        syncer = Syncer(checkpoint, chain, checkpoint.mark, sync_every, say, failure_limit, stop)
        checkpoint.syncer = syncer  # a reader's: its run's record
        syncer.start()
        return checkpoint

    @property
    def where(self) -> str:
        return self.location.uri or str(self.path)

    @property
    def hidden_target(self) -> str:
        return self.location.uri or super().hidden_target

    @property
    def needs_shared_disk(self) -> bool:
        return False

    def close(self, quiet: bool = False) -> None:
        """Commit what is left to the bucket (the job's last manifest), then close the cache."""
        try:
            if self.syncer is not None:
                syncer, self.syncer = self.syncer, None
                try:
                    syncer.close(quiet)
                finally:
                    self.sync_failures = syncer.failures
                writer = syncer.every is not None
                if writer and not quiet and self.chain.known is not None and due(self.chain.known):
                    with contextlib.suppress(ClefError, LocationProblem, OSError):
                        compact(self.chain)  # best effort: the next job's end tries again
        finally:
            super().close()
            if self.held is not None:
                self.held.release()
                self.held = None

    def sync(self) -> None:
        """Commit what was committed so far (tests, and a job's end)."""
        if self.syncer is not None:
            self.syncer.sync()

    def info(self) -> dict[str, Any]:
        """`checkpoint info` from the manifest and the key index: no part is downloaded (keys with
        states: the final keys of parts with states, but for their failed records' rows, which
        the parts list)."""
        assert self.index is not None
        latest = self.chain.known
        hidden = {entry.name: entry for entry in self.entries if entry.has_hidden}
        with self.index.lock:
            rows = self.index.db.execute("SELECT shard, row FROM keys WHERE final = 1 AND hidden = 1").fetchall()
        failed: dict[str, set[int]] = {}
        with_states = 0
        for shard, row in rows:
            if shard in hidden:
                if shard not in failed:
                    failed[shard] = self._failed_rows(hidden[shard])
                with_states += row not in failed[shard]
        sizes = {kind: latest.total(f"{kind}_bytes") if latest else 0 for kind in ("keys", "results", "hidden")}
        return described(
            self, with_states, sum(sizes.values()), sizes, last_users(self), cache=str(self.path),
            segments=len(latest.segments) if latest else 0, manifest=latest.seq if latest else 0,
        )  # fmt: skip

    def set_aside_damaged(self) -> bool:
        """Before the job computes: the results of the parts that hold its reused keys, downloaded
        now (its output reads them anyway) and checked; a segment found missing or damaged is set
        aside and its parts forgotten, so this run computes its records (True: decide again)."""
        assert self.index is not None
        with self.index.lock:
            query = "SELECT DISTINCT shard FROM keys WHERE key IN (SELECT key FROM temp.job)"
            shards = {row[0] for row in self.index.db.execute(query)}
        firsts: dict[str, ShardEntry] = {}
        for entry in self.entries:
            if entry.remote is not None and entry.name in shards:
                firsts.setdefault(entry.remote["segment"], entry)
        bad = {}
        for segment, entry in firsts.items():
            try:
                self.local_file(entry, "results")
            except DamagedObject as damage:
                bad[segment] = str(damage)
        if bad:
            self.cache.forget_segments(self, set(bad))
            self.dropped += set_aside_entries(self.latest, bad)
        return bool(bad)

    def _failed_rows(self, entry: ShardEntry) -> set[int]:
        """A shard's rows that are failed records': a part's list them; the cache's own shards
        are read from its disk."""
        if entry.remote is not None:
            return {int(row) for row in entry.remote.get("errors") or ()}
        errors = pc.is_valid(self.shard_table(entry.name).column("error"))
        return set(pc.indices_nonzero(errors).to_pylist())


def _fingerprint(location: StoreLocation, latest: Manifest | None, manifest: dict[str, Any] | None) -> dict[str, Any]:
    """The store's fingerprint, checked against this run's (a store made otherwise is refused
    as a local one is: `manifest.mismatch_message`)."""
    if latest is None:
        if manifest is None:
            raise UsageError(f"{location.option} {location.uri} holds no clef store (no manifest)")
        return manifest
    if manifest is not None and comparable(latest.fingerprint) != comparable(manifest):
        raise CheckpointMismatch(mismatch_message(location.uri, latest.fingerprint, manifest))  # type: ignore[arg-type]
    return latest.fingerprint


def _cached_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        return read_manifest(folder) if folder.is_dir() else None
    except ClefError:
        return {}  # unreadable or another format: the cache is rebuilt


def _restarted(chain: Chain, manifest: dict[str, Any]) -> Manifest | None:
    """`--restart` on a bucket store: a manifest that names nothing (prune deletes the rest)."""

    def emptied(base: Manifest | None) -> Manifest:
        if base is not None and (claim := chain.holding(base)) is not None:
            raise ClefError(claim_line(claim, chain.uri) + "; --restart waits for no claim: rerun after it")
        return Manifest(0, manifest)

    return chain.commit(emptied, fresh=True)


def bucket_hidden_dtype(uri: str) -> str | None:
    """The dtype of the states in the first hidden-state object the latest manifest names (every
    such object begins with a hidden shard: a segment's are laid one after another, a `--ray`
    actor's is one); None when the store holds none."""
    from clef_cli.store.hidden_store import states_dtype

    chain = Chain(uri)
    latest = chain.latest()
    for segment in latest.segments.values() if latest is not None else ():
        for obj in segment.hidden:
            found = states_dtype(lambda start, end, obj=obj: chain.bucket.get_range(chain.key(obj), start, end))
            if found is not None:
                return found
    return None


def check_prefix(chain: Chain, reading: bool = False, option: str = "--checkpoint") -> None:
    """A prefix with no manifest must hold nothing but a store's own objects (a killed first
    sync leaves segments), by name, in its own folders too (another tool's `runs/` is no
    store's): anything else is refused (exit 2), nothing written."""
    names = []
    for name in chain.bucket.top_level(chain.prefix):
        inside = chain.bucket.top_level(chain.prefix + name) if name in FOLDERS else None
        names += [name + inner for inner in inside] if inside is not None else [name]
    strangers = [name for name in names if not own_name(name)]
    if strangers:
        shown = ", ".join(strangers[:SHOWN_STRANGERS]) + (" ..." if len(strangers) > SHOWN_STRANGERS else "")
        raise UsageError(
            f"{option} {chain.uri} holds objects that are not a clef store ({shown}): give an empty prefix or a store's"
        )
    if reading:
        raise UsageError(f"{option} {chain.uri} holds no clef store (no manifest)")


def probe_store(chain: Chain, option: str = "--checkpoint") -> None:
    """Before the model loads and any record is read: the writes a job's syncs make (a conditional
    put, a listing, a delete: `uploads.probe_writes`, one empty object under the prefix, removed at
    once), so read-only credentials end the job now (exit 1, one line), not after it computed what
    it cannot keep."""
    from clef_cli.locations.object_store import ObjectStoreError
    from clef_cli.locations.uploads import ConditionIgnored, WriteRefused, probe_writes

    probe = chain.uri + PROBE + uuid.uuid4().hex[:12]
    try:
        probe_writes(probe, chain.uri, conditional=True, listed=True, strict=True)
    except WriteRefused as refused:
        left = f"; its probe object {probe} is left there" if refused.step == "a delete" else ""
        words = f"the bucket refused {refused.step} with these credentials ({refused.cause}){left}"
    except ConditionIgnored as ignored:
        words = str(ignored)
    else:
        return
    error = ObjectStoreError(f"{option} {chain.uri}: {words}")
    error.words = words  # what `store_problems` names by the option and the URI (locations/failures.py)
    raise error
