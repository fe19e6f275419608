"""The sync: beside the job, every `--sync-every` seconds and once at its end, the shards the
cache committed since the last sync are packed into one segment, uploaded, and named by a new
manifest (store/remote/manifests.py: a conflict re-reads and merges, never overwrites).

It runs on its own thread and never holds what the job needs: the job commits shards to the cache
as it always does, and the sync reads them after their journal line is written. A SIGKILL of the
machine therefore loses at most the last `--sync-every` seconds of work; a failing bucket never
stops the scoring at once: a failed sync is said on stderr when it happens (then once every
`REPEAT_EVERY` seconds while the syncs keep failing) and tried again at the next turn; once they
have failed for `--sync-failure-limit` seconds (`DEFAULT_SYNC_FAILURE_LIMIT`) the syncer sets the job's
stop event, and the job ends with exit 1 naming this machine and its cache folder, where what it
committed stays for a rerun there to upload. While a prune or a compaction holds the store, syncs
wait for its claim to end (bounded by its lease, by the bucket's clock): no failure. A commit that
lands after others committed since its segment went up checks that the segment's objects are still
there (a prune may have deleted them as unnamed), and puts those that are not again, before naming
them. A stop request made while a commit retries or waits for a claim ends it at once
(`JobStopped`, exit 130): nothing is committed, the cache keeps it for a rerun.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from clef_cli import faults
from clef_cli.choices import DEFAULT_SYNC_EVERY, DEFAULT_SYNC_FAILURE_LIMIT
from clef_cli.errors import ClefError, JobStopped
from clef_cli.locations.object_store import MissingObject
from clef_cli.locations.uris import LocationProblem
from clef_cli.store import durable
from clef_cli.store.checkpoint import Checkpoint, ShardEntry
from clef_cli.store.manifest import comparable
from clef_cli.store.remote.cache import Mark
from clef_cli.store.remote.layout import RUNS
from clef_cli.store.remote.manifests import Chain, Manifest, claim_line
from clef_cli.store.remote.segments import Packed, pack

REPEAT_EVERY = 180.0
"""Seconds between two lines saying the syncs still fail (the first failure is said at once)."""
CLAIM_POLL = 2.0
KEYS_BATCH = 65536
"""Keys per batch of a run's keys object (as a segment's: segments.BATCH_ROWS)."""


class Claimed(ClefError):
    """A prune or a compaction holds the store (its claim has not ended)."""

    def __init__(self, claim: dict[str, Any], uri: str) -> None:
        super().__init__(claim_line(claim, uri))
        self.claim = claim


class Syncer:
    """Uploads a checkpoint's new shards to its store (see the module's note)."""

    def __init__(
        self,
        checkpoint: Checkpoint,
        chain: Chain,
        mark: Mark,
        every: float | None = DEFAULT_SYNC_EVERY,
        say: Callable[[str], None] | None = None,
        failure_limit: float = DEFAULT_SYNC_FAILURE_LIMIT,
        job_stop: threading.Event | None = None,
    ) -> None:
        self.checkpoint = checkpoint
        self.chain = chain
        self.mark = mark
        self.every = every
        """Seconds between two syncs; None for a reader (`--rehead`): no thread, no shard ever
        uploaded, only its run's record committed at its end, so every machine's history has it."""
        self.say = say
        """Where the job's lines about its syncs go: failures, and the end waiting for a claim."""
        self.failure_limit = failure_limit
        """Seconds the syncs may keep failing before `job_stop` is set (the job ends with exit 1)."""
        self.job_stop = job_stop
        self.clock: Callable[[], float] = time.monotonic
        """What `failing_since` and the limit are measured by (a test's clock may run faster)."""
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.sent_run: dict[str, Any] | None = None
        """This run's record as the last committed manifest has it (None: not in the store yet)."""
        self.keys_object: str | None = None
        """This run's `runs/RUN.keys` once put: never put again (a turn that meets a claim or a
        failing bucket after it sends the manifest only)."""
        self.thread: threading.Thread | None = None
        self.synced = 0
        """Syncs of this run that committed a manifest."""
        self.failures = 0
        """Syncs of this run that failed (the stats JSON's `sync_failures`)."""
        self.failing = 0
        """Syncs that failed in a row since the last that committed (0: the last one went through)."""
        self.failing_since: float | None = None
        """`clock()` at the first of those failures; None while the syncs go through."""
        self.last_error: str | None = None
        """What the last failed sync met."""
        self.gave_up = False
        """The syncs failed for `failure_limit` seconds: the job was told to stop."""
        self.report: Callable[[int, int], None] | None = None
        """Told (`synced`, `failing`) after each turn of the thread (a cron log's progress line)."""
        self._said = 0.0

    def start(self) -> None:
        if self.every is None:
            return
        self.thread = threading.Thread(target=self._loop, name="clef-sync", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        assert self.every is not None
        while not self.stop.wait(self.every):
            # a claim that ends, a bucket that answers again: the next turn commits (or the job's end)
            try:
                self.sync()
            except Claimed:
                continue  # bounded by its lease: the syncs wait, nothing failed
            except JobStopped:
                return  # the job stops: its end syncs what is left
            except (ClefError, LocationProblem, OSError) as error:
                if self._failed(error):
                    return
            else:
                self._went_through()
            if self.report is not None:
                self.report(self.synced, self.failing)

    @property
    def failing_for(self) -> float:
        """Seconds the syncs have failed in a row (0 while they go through)."""
        return 0.0 if self.failing_since is None else self.clock() - self.failing_since

    def _failed(self, error: BaseException) -> bool:
        """Count a failed sync and say it (the first at once, then every `REPEAT_EVERY` s); past
        `failure_limit`, stop the job (True: the thread ends, what is left is the cache's)."""
        now = self.clock()
        self.failures += 1
        self.failing += 1
        self.last_error = str(error)
        if self.failing_since is None:
            self.failing_since = now
        if self.failing_for >= self.failure_limit:
            self.gave_up = True
            self._tell(f"{self._failing_line()}: the job stops after its current batch")
            if self.job_stop is not None:
                self.job_stop.set()
            return True
        if self.failing == 1 or now - self._said >= REPEAT_EVERY:
            self._said = now
            self._tell(
                f"{self._failing_line()}; the job goes on committing to this machine's cache and stops if the "
                f"syncs keep failing for {self.failure_limit:g} s"
            )
        return False

    def _went_through(self) -> None:
        if self.failing:
            self._tell(f"the sync to the store {self.chain.uri} went through again after {self.failing} failed")
        self.failing, self.failing_since = 0, None

    def _failing_line(self) -> str:
        many = f"the syncs to the store {self.chain.uri} have failed {self.failing} times in a row for "
        what = f"{int(self.failing_for)} s" if self.failing > 1 else ""
        first = f"a sync to the store {self.chain.uri} failed"
        return f"{many + what if self.failing > 1 else first} ({self.last_error})"

    def _tell(self, line: str) -> None:
        if self.say is not None:
            self.say(line)

    def close(self, quiet: bool = False) -> None:
        """Stop the thread, then commit what is left (waiting out a claim); after the syncs failed
        past the limit, nothing is tried again. `quiet`: the job is failing anyway, so a failure
        here is not raised over its own."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        if self.gave_up:
            if not quiet:
                raise ClefError(self._kept(f"the syncs failed for {self.failure_limit:g} s ({self.last_error})"))
            return
        try:
            self._final(failed=quiet)
        except (ClefError, LocationProblem, OSError) as error:
            self.failures += 1
            if not quiet:
                raise ClefError(self._kept(error)) from None

    def _final(self, failed: bool = False) -> None:
        said, armed = False, self.job_stop is not None and not self.job_stop.is_set()
        while True:
            try:
                self.sync(final=True, failed=failed)
                return
            except Claimed as claimed:
                if self.say is not None and not said:
                    self.say(f"{claimed}: the job's last commit waits for it")
                    said = True
                pause = min(CLAIM_POLL, max(0.1, float(claimed.claim.get("left", 0))))
                if armed and self.job_stop is not None and self.job_stop.wait(pause):
                    raise JobStopped from None  # a stop request while waiting: nothing committed, the cache keeps it
                if not armed:
                    time.sleep(pause)

    def _kept(self, error: BaseException | str) -> str:
        unsynced = sum(entry.records for entry in self._fresh())
        host = socket.gethostname()  # the cache is this machine's: a rerun elsewhere has none of it
        return (
            f"could not commit to the store {self.chain.uri}: {error}; the {unsynced} records this machine "
            f"committed since its last sync are kept in its cache {self.checkpoint.path} on {host}: rerun the same "
            "command here to upload them"
        )

    # ------------------------------------------------------------------ one sync

    def _fresh(self) -> list[ShardEntry]:
        """The cache's own shards committed since the last sync (in commit order; none for a reader)."""
        if self.every is None:
            return []
        through = self.mark.synced_through
        return [
            entry
            for entry in list(self.checkpoint.entries)
            if entry.remote is None and entry.name.isdigit() and int(entry.name) > through
        ]

    def sync(self, final: bool = False, failed: bool = False) -> Manifest | None:
        """Upload the new shards as a segment and commit a manifest naming it (and this run's
        record, at the end with the keys it used). Nothing to send: nothing done. A run's record
        first goes with its first segment or at its end (`final`), never at the end of a job that
        `failed` first: a job refused before its first record puts nothing in the bucket."""
        with self.lock:
            if self.mark.pending:  # the last commit failed, perhaps after its manifest went through
                self.mark.settle(self.chain.latest())
                self.mark.save(self.checkpoint.path)
            fresh = self._fresh()
            if not fresh and self.sent_run is None and (failed or not final):
                return None
            run = self._run_record()
            if not fresh and run is None:
                return None
            self._wait_for_claim()
            if run is not None and run["keys"] is not None and self.keys_object is None:
                self.keys_object = self._upload_used_keys()  # once: a retried turn names the same object
            packed = pack(fresh, self.checkpoint.shards_path) if fresh else None
            uploaded_on = self.chain.known.seq if self.chain.known is not None else 0
            if packed is not None:
                self._upload(packed)
                through = max(int(entry.name) for entry in fresh)
                names = [entry.name for entry in fresh]
                self.mark.pending = {"segment": packed.segment.id, "shards": names, "through": through}
                self.mark.save(self.checkpoint.path)
                faults.pause_at("segment-uploaded")
            committed = self.chain.commit(lambda base: self._merged(base, packed, run, uploaded_on), stop=self.job_stop)
            faults.pause_at("manifest-committed")
            self.mark.settle(committed or self.chain.known)
            if committed is not None:
                self.synced += 1
                self.mark.seq = committed.seq
                self.sent_run = run or self.sent_run
            self.mark.save(self.checkpoint.path)
            if final and committed is not None:
                self.chain.write_hint()
            return committed

    def _wait_for_claim(self) -> None:
        """A claim met at the last try is read again; while it holds nothing is packed or sent (a
        prune may hold the store for minutes, and every turn would upload the segment again)."""
        known = self.chain.known
        if known is None or known.active_claim() is None:
            return
        claim = self.chain.holding(self.chain.latest())
        if claim is not None:
            raise Claimed(claim, self.chain.uri)

    def _merged(
        self, base: Manifest | None, packed: Packed | None, run: dict[str, Any] | None, uploaded_on: int = 0
    ) -> Manifest | None:
        """The next manifest: what `base` names, this segment and this run's record (its objects
        checked again when others committed since they went up, manifest `uploaded_on`)."""
        fingerprint = self.checkpoint.manifest
        if base is None and packed is None:
            return None  # a run that committed nothing makes no store
        if base is not None:
            if comparable(base.fingerprint) != comparable(fingerprint):
                raise ClefError(f"the store {self.chain.uri} was restarted by another job with another model meanwhile")
            claim = self.chain.holding(base)
            if claim is not None:
                raise Claimed(claim, self.chain.uri)
            if base.seq != uploaded_on:
                self._still_there(packed, run)
        segments = dict(base.segments) if base is not None else {}
        for segment in self.mark.set_aside:  # found missing or damaged (cache.py): its records are computed again
            segments.pop(segment, None)
        if packed is not None:
            segments[packed.segment.id] = packed.segment
        runs = dict(base.runs) if base is not None else {}
        if run is not None:
            runs[self.checkpoint.run_id] = run
        return Manifest(0, base.fingerprint if base is not None else fingerprint, segments, runs)

    def _still_there(self, packed: Packed | None, run: dict[str, Any] | None) -> None:
        """Others committed since this turn's objects went up (a prune among them may have deleted
        them as unnamed): each is asked for (HEAD) and put again when gone, before a manifest names it."""
        bucket, key = self.chain.bucket, self.chain.key
        names = list(packed.segment.objects()) if packed is not None else []
        for name in [*names, *([run["keys"]] if run is not None and run.get("keys") else [])]:
            try:
                bucket.head(key(name))
            except MissingObject:
                if packed is not None and name in packed.segment.objects():
                    self._upload(packed, only=name)
                else:
                    self._upload_used_keys()

    def _upload(self, packed: Packed, only: str | None = None) -> None:
        """The segment's objects, the keys last (every object is named by content: a retry after
        a kill writes the same bytes under the same name); `only`: that one object."""
        bucket, key = self.chain.bucket, self.chain.key
        if only in (None, packed.segment.results):
            bucket.put(key(packed.segment.results), packed.results)
        if packed.hidden_files and only in (None, packed.hidden_object):
            bucket.put(key(packed.hidden_object), lambda: _chunks(packed))
        if only in (None, packed.segment.keys):
            bucket.put(key(packed.segment.keys), packed.keys)

    # ------------------------------------------------------------------ the run's record

    def _run_record(self) -> dict[str, Any] | None:
        """This run's record as the manifest keeps it, when it changed since the last sync; once
        the ledger is built it names `runs/RUN.keys`, the keys the run's records have (`sync` puts
        it once: `prune --keep-runs` keeps what a kept run used, and a killed run's record has
        them too)."""
        index = self.checkpoint.index
        if index is None:
            return None
        found = [run for run in index.runs(count_keys=False) if run["run_id"] == self.checkpoint.run_id]
        if not found:
            return None
        fields = ("started", "finished", "counts", "inputs", "output", "interrupted")
        run = {name: found[0][name] for name in fields}
        sent = self.sent_run or {}
        run["keys"] = self.keys_object
        if run["keys"] is None and self.checkpoint.ledger is not None:  # the ledger is built: its keys
            run["keys"] = self._keys_name()
        if self.sent_run is not None and all(sent.get(name) == run.get(name) for name in (*fields, "keys")):
            return None
        return run

    def _upload_used_keys(self) -> str:
        """The keys this run's records have, sorted, as `runs/RUN.keys` (an Arrow file), written a
        batch at a time to a file in the cache folder and uploaded from it: a night of 100M
        records holds one batch of keys in memory, never the night's."""
        index = self.checkpoint.index
        assert index is not None
        name = self._keys_name()
        path = self.checkpoint.path / f".{self.checkpoint.run_id}.keys.tmp"
        schema = pa.schema([("key", pa.binary(32))])
        try:
            with index.lock, pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, schema) as writer:
                rows = index.db.execute("SELECT DISTINCT key FROM temp.job WHERE key IS NOT NULL ORDER BY key")
                while batch := rows.fetchmany(KEYS_BATCH):
                    keys = pa.array([bytes.fromhex(key) for (key,) in batch], pa.binary(32))
                    writer.write_batch(pa.record_batch([keys], schema=schema))
            self.chain.bucket.put(self.chain.key(name), path)
        finally:
            durable.unlink(path)
        return name

    def _keys_name(self) -> str:
        return f"{RUNS}{self.checkpoint.run_id}.keys"


def _chunks(packed: Packed):  # type: ignore[no-untyped-def]
    """The hidden-state files one after another, 8 MiB at a time (a multipart upload)."""
    for path in packed.hidden_files:
        with open(path, "rb") as handle:
            while chunk := handle.read(8 << 20):
                yield chunk
