"""Opening a store wherever it lives: a local folder, or a bucket's prefix through its cache
folder (store/remote/). Jobs, `--rehead`, train-head and `checkpoint info|prune` open stores
only here, so nothing above store/ asks where a store lives."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clef_cli.choices import DEFAULT_SYNC_EVERY, DEFAULT_SYNC_FAILURE_LIMIT
from clef_cli.errors import UsageError
from clef_cli.store.checkpoint import SHARDS, Checkpoint
from clef_cli.store.location import StoreLocation
from clef_cli.store.manifest import read_manifest

if TYPE_CHECKING:
    from clef_cli.store.prune import PruneReport


def open_store(
    location: StoreLocation,
    manifest: dict[str, Any],
    restart: bool = False,
    sync_every: float = DEFAULT_SYNC_EVERY,
    say: Callable[[str], None] | None = None,
    failure_limit: float = DEFAULT_SYNC_FAILURE_LIMIT,
    stop: threading.Event | None = None,
    report: Callable[[int, int], None] | None = None,
) -> Checkpoint:
    """A job's store (made, or reused after its fingerprint is checked); the caller holds the
    folder's lock. A bucket's is synced beside the job, every `sync_every` seconds and at close
    (`say`: the lines that a sync failed, that its end waits for a prune's claim; `report`: told
    the syncs that committed and those that failed in a row after each); once its syncs have
    failed for `failure_limit` seconds, it sets `stop`, the job's stop event."""
    if not location.remote:
        return Checkpoint.open(location.folder, manifest, restart=restart)
    from clef_cli.store.remote.manifests import store_problems
    from clef_cli.store.remote.store import RemoteCheckpoint

    with store_problems(location.uri or "", location.option):
        checkpoint = RemoteCheckpoint.open_remote(
            location, manifest, restart, sync_every, say=say, failure_limit=failure_limit, stop=stop
        )
    if checkpoint.syncer is not None:
        checkpoint.syncer.report = report
    return checkpoint


def open_existing_store(location: StoreLocation, locked: bool = True) -> Checkpoint:
    """A store that must exist, opened to read it (`locked`: the caller holds its folder's lock;
    else a bucket store's cache folder is locked while it is open)."""
    if not location.remote:
        return Checkpoint.open_existing(location.folder)
    from clef_cli.store.remote.manifests import store_problems
    from clef_cli.store.remote.store import RemoteCheckpoint

    with store_problems(location.uri or "", location.option):
        return RemoteCheckpoint.open_remote(location, None, sync_every=None, hold_lock=not locked)


def stored_manifest(location: StoreLocation) -> dict[str, Any] | None:
    """The fingerprint of the store (None when there is none yet)."""
    if not location.remote:
        return read_manifest(location.folder) if location.folder.is_dir() else None
    from clef_cli.store.remote.manifests import Chain, store_problems

    with store_problems(location.uri or "", location.option):
        latest = Chain(location.uri or "", quick=True).latest()
    return latest.fingerprint if latest is not None else None


def stored_hidden_dtype(location: StoreLocation) -> str | None:
    """The dtype the store keeps its hidden states in (its first hidden shard's), so that states
    computed on demand match those stored at scoring time; None when it holds none. A bucket
    store answers from the bucket (the header of the first hidden-state object its manifest
    names: two ranged GETs), so a fresh machine answers as the one that scored."""
    from clef_cli.store.hidden_store import file_states_dtype

    if location.remote:
        from clef_cli.store.remote.manifests import store_problems
        from clef_cli.store.remote.store import bucket_hidden_dtype

        with store_problems(location.uri or "", location.option):
            found = bucket_hidden_dtype(location.uri or "")
        if found is not None:
            return found
    shards = sorted((location.folder / SHARDS).glob("*.hidden.safetensors"))
    return next((dtype for path in shards if (dtype := file_states_dtype(path)) is not None), None)


def check_store(location: StoreLocation) -> None:
    """Before any record is read: a bucket store answers (credentials, bucket, endpoint: exit 1),
    its prefix holds a store or nothing (exit 2), and it takes the job's writes (exit 1). A local
    folder is checked by settings."""
    if not location.remote:
        return
    from clef_cli.locations import buckets
    from clef_cli.store.remote import manifests
    from clef_cli.store.remote.store import check_prefix, probe_store

    buckets.forget()  # a new job: clients from the environment as it is now, manifests read afresh
    manifests.forget()
    with manifests.store_problems(location.uri or "", location.option):
        chain = manifests.Chain(location.uri or "", quick=True)
        if chain.latest() is None:
            check_prefix(chain)
        probe_store(chain, location.option)


def prune_store(
    location: StoreLocation,
    keep_runs: int | None = None,
    older_than_days: float | None = None,
    force: bool = False,
    dry_run: bool = False,
    grace_hours: float = 24.0,
    cache_dir: Path | None = None,
    no_running_jobs: bool = False,
) -> PruneReport:
    """`clef checkpoint prune` on a folder (store/prune.py) or a bucket (store/remote/pruning.py:
    objects no manifest names are deleted once older than `grace_hours`, at least a claim's lease
    plus a commit's patience unless `no_running_jobs`; then this machine's cache folders of the
    store, under `cache_dir`, are pruned to match: remote/cache_prune.py)."""
    if not location.remote:
        from clef_cli.store.prune import prune

        return prune(location.folder, keep_runs, older_than_days, force=force, dry_run=dry_run)
    from clef_cli.store.remote.cache_prune import prune_caches
    from clef_cli.store.remote.manifests import store_problems
    from clef_cli.store.remote.pruning import prune_bucket

    with store_problems(location.uri or "", location.option):
        report = prune_bucket(
            location.uri or "", keep_runs, older_than_days, force, dry_run, grace_hours * 3600, no_running_jobs
        )
        report.cache = prune_caches(location.uri or "", cache_dir, dry_run)
    return report


def verify_store(checkpoint: Checkpoint) -> list[dict[str, Any]]:
    """`checkpoint info --verify`: a bucket store's segments with an object missing or not of its
    size (HEAD requests), and those set aside as damaged when read; a folder's checkpoint checks
    its files whenever it is opened (none)."""
    from clef_cli.store.remote.damage import verify
    from clef_cli.store.remote.manifests import store_problems

    chain, latest = getattr(checkpoint, "chain", None), getattr(checkpoint, "latest", None)
    if chain is None or latest is None:
        return []
    with store_problems(chain.uri):
        lost = {item.segment: item for item in verify(chain, latest)}
    named = {entry.name: entry.records for entry in checkpoint.dropped}
    lost_list = [{"segment": item.segment, "records": item.records, "why": item.why} for item in lost.values()]
    for segment, why in checkpoint.mark.set_aside.items():  # type: ignore[attr-defined]
        if segment not in lost and segment in named:
            lost_list.append({"segment": segment, "records": named[segment], "why": why})
    return lost_list


def repair_store(location: StoreLocation, dry_run: bool = False) -> tuple[list[Any], int]:
    """`clef checkpoint repair`: a bucket store's dead segments dropped (store/remote/damage.py)."""
    from clef_cli.store.remote.damage import Lost, repair

    if not location.remote:  # opened as a job opens it: damaged shards dropped, the journal rewritten
        from clef_cli.store.checkpoint import require_folder
        from clef_cli.store.locks import SUFFIX, JobLock

        folder = location.folder
        require_folder(folder)
        with JobLock(folder.with_name(folder.name + SUFFIX), f"checkpoint {folder}"):
            manifest = read_manifest(folder)
            if manifest is None:
                raise UsageError(f"{folder} is not a clef checkpoint")
            opened = Checkpoint.open_existing(folder) if dry_run else Checkpoint.open(folder, manifest)
            opened.close()
        lost = [Lost(entry.name, entry.records, "its files fail their checks") for entry in opened.dropped]
        return lost, len(opened.entries) + len(lost)
    from clef_cli.store.remote.manifests import store_problems

    with store_problems(location.uri or "", location.option):
        return repair(location.uri or "", dry_run)


def unclaim_store(location: StoreLocation, confirm: bool) -> dict[str, Any] | None:
    """`clef checkpoint unclaim`: break a bucket store's claim (store/remote/claims.py); the claim
    broken, None when none was there. A folder store has none (its jobs hold its lock)."""
    if not location.remote:
        from clef_cli.errors import UsageError

        raise UsageError(f"{location.folder} is a folder store: it has no claim (a running job holds its lock)")
    from clef_cli.store.remote.claims import unclaim
    from clef_cli.store.remote.manifests import store_problems

    with store_problems(location.uri or "", location.option):
        return unclaim(location.uri or "", confirm)
