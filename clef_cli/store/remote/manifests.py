"""The chain of manifests: manifest N names everything that counts in the store (the scoring
fingerprint, the segments, the runs, a claim), and N+1 is written only where no object is
(`If-None-Match: *`), so two writers can never both commit N+1.

A writer commits optimistically on the manifest it knows; a 412 (or 409) means another writer
committed first: it reads what was committed since, merges (a union: segments are immutable and
named by content) and tries the next number, never overwriting. A reader finds the latest manifest
from the hint (`latest.json`) and one listing from there, so opening a store costs three requests
however long its history.

A claim (`prune`, compaction) is a manifest that says who holds the store: writers wait for it to
be released or to expire (a bounded lease), so a claim left by a killed job never blocks the next
night longer than the lease. One clock, the bucket's: a claim starts at its manifest object's
`Last-Modified` and ends its lease later, whatever the clock of the machine that wrote it said
(`Chain.holding`).

No writer spins: the commit loop is bounded by attempts and time, a stop request made while it
runs ends it at once (nothing committed), and a manifest whose body names another number than its
key is an inconsistent chain, said as such.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from clef_cli.errors import ClefError, JobStopped
from clef_cli.locations.buckets import Bucket, WriteConflict, bucket
from clef_cli.locations.failures import FAILING, ObjectStoreError, failure_of, named
from clef_cli.locations.object_store import MissingObject
from clef_cli.locations.uris import LocationProblem
from clef_cli.store.remote.layout import LATEST, MANIFESTS, manifest_name, manifest_seq
from clef_cli.store.remote.segments import Segment

FORMAT = "clef-store"
VERSION = 1
HINT_EVERY = 16
"""Commits between two updates of the hint (readers list the manifests after it)."""
COMMIT_PATIENCE = 600.0
"""Seconds a writer keeps retrying after conflicts (a storm of writers) before it gives up."""
COMMIT_ATTEMPTS = 200
"""Tries of one commit before it gives up (a storm of three writers takes a few)."""
clock: Callable[[], float] = time.time
"""This machine's clock: only what a claim says for people who read it (`since`, `until`); whether
a claim holds is the bucket's clock's (`Chain.holding`). Tests skew it."""


def claim_lease() -> float:
    """Seconds a claim holds the store (`CLEF_CLAIM_LEASE_SECONDS`, default 15 minutes)."""
    return float(os.environ.get("CLEF_CLAIM_LEASE_SECONDS") or 900)


@dataclass(frozen=True)
class Manifest:
    seq: int
    fingerprint: dict[str, Any]
    segments: dict[str, Segment] = field(default_factory=dict)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    claim: dict[str, Any] | None = None
    writer: str = ""
    """Who wrote this manifest (one token per commit: a retried write knows its own)."""
    modified: float = field(default=0.0, compare=False)
    """Its object's `Last-Modified` as the bucket listed it (0: not known, asked when needed)."""

    def body(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION, "seq": self.seq, "fingerprint": self.fingerprint,
            "segments": {name: segment.described() for name, segment in self.segments.items()},
            "runs": self.runs, "claim": self.claim, "writer": self.writer, "committed": clock(),
        }  # fmt: skip

    @classmethod
    def read(cls, data: bytes, where: str) -> Manifest:
        try:
            raw = json.loads(data)
            if raw.get("format") != FORMAT:
                raise ValueError("not a clef store manifest")
            if raw.get("version") != VERSION:
                raise ClefError(f"{where} has store format {raw.get('version')}; this clef reads {VERSION}")
            segments = {name: Segment.read(name, value) for name, value in raw["segments"].items()}
            return cls(int(raw["seq"]), raw["fingerprint"], segments, raw.get("runs") or {}, raw.get("claim"),
                       str(raw.get("writer", "")))  # fmt: skip
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ClefError(f"{where} is unreadable: {error}") from None

    def active_claim(self) -> dict[str, Any] | None:
        """The claim it names, if any; whether that still holds is the bucket's clock's (`Chain.holding`)."""
        return self.claim or None

    def total(self, what: str) -> int:
        return sum(int(getattr(segment, what)) for segment in self.segments.values())


@contextlib.contextmanager
def store_problems(uri: str = "", option: str = "--checkpoint") -> Iterator[None]:
    """An object of the store that cannot be read or written (after the client's retries) stops
    the command, not a record: the bucket's `LocationProblem` becomes its error (exit 1, one line).
    The bucket's failures (locations/failures.py) are named by `option` and the store's `uri`,
    not by the object met (a manifest, the hint)."""
    try:
        yield
    except ObjectStoreError as error:
        raise (named(error, option, uri) if uri else error) from None
    except LocationProblem as problem:
        if uri and problem.transient:
            raise failure_of(FAILING, option, uri, str(problem)) from None
        raise ClefError(str(problem)) from None


def forget() -> None:
    """Forget the manifests read and the bucket's time (a test's next job starts as a fresh process does)."""
    _seen.clear()
    _anchors.clear()


def new_claim(what: str) -> dict[str, Any]:
    """A claim of `what`: its lease is named (a length, no clock's); `since` and `until` are this
    machine's clock's, for people who read the manifest, never what decides (`Chain.holding`)."""
    now, lease = clock(), claim_lease()
    owner = {"what": what, "host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex}
    return owner | {"since": now, "until": now + lease, "lease": lease}


def holder(claim: dict[str, Any]) -> str:
    """Whose claim it is: what took it, its process and host."""
    what = claim.get("what", "prune")
    held = "a compaction at the end of a `clef score` job" if what == "compaction" else f"a `clef checkpoint {what}`"
    return f"{held} (pid {claim.get('pid', '?')} on host {claim.get('host', '?')})"


def claim_line(claim: dict[str, Any], uri: str) -> str:
    """Who holds the store and for how long (the one line a waiting or refused writer shows):
    `left` as `Chain.holding` found it, by the bucket's clock."""
    left = max(0, int(float(claim.get("left", 0))))
    return f"the store {uri} is held by {holder(claim)} for at most {left} s more"


class InconsistentChain(ClefError):
    """A manifest whose body names another number than its key (an old one put back on top)."""


_seen: dict[str, Manifest] = {}
"""The latest manifest this process read of each store: the next look lists only after it."""
_anchors: dict[str, tuple[float, float]] = {}
"""Per store: the bucket's time as last read, and this process's monotonic clock then."""
ANCHOR_FOR = 600.0
"""Seconds the bucket's time read once is carried on by the monotonic clock before it is read again."""


class Chain:
    """The manifests of the store at `uri` (`s3://bucket/prefix/`)."""

    def __init__(self, uri: str, quick: bool = False) -> None:
        self.uri = uri
        self.bucket: Bucket = bucket(uri, quick=quick)
        self.prefix = self.bucket.key(uri)
        self.known: Manifest | None = _seen.get(uri)
        """The latest manifest this process has read or written."""
        self.hinted = 0

    def key(self, name: str) -> str:
        return self.prefix + name

    def latest(self) -> Manifest | None:
        """The latest manifest (None for a store with none yet), from the hint and one listing."""
        after = self.known.seq if self.known is not None else self._hint()
        listed = self.bucket.list(self.key(MANIFESTS), offset=self.key(manifest_name(after)) if after else None)
        modified = {seq: info.modified for info in listed if (seq := manifest_seq(info.key[len(self.prefix) :]))}
        seq = max(modified, default=after)
        if seq == 0:
            return None
        if self.known is not None and seq == self.known.seq:
            return self.known
        try:
            found = self.read(seq)
        except MissingObject:  # the hinted manifest was pruned: list them all
            self.known = None
            listed = self.bucket.list(self.key(MANIFESTS))
            modified = {seq: info.modified for info in listed if (seq := manifest_seq(info.key[len(self.prefix) :]))}
            if not modified:
                return None
            found = self.read(seq := max(modified))
        found = replace(found, modified=modified.get(seq, 0.0))
        self.known = _seen[self.uri] = found
        return found

    def read(self, seq: int) -> Manifest:
        """Manifest `seq`; one whose body names another number is refused (`InconsistentChain`)."""
        name = manifest_name(seq)
        found = Manifest.read(self.bucket.get(self.key(name)), self.uri + name)
        if found.seq != seq:
            raise InconsistentChain(
                f"the store {self.uri} has an inconsistent chain: manifest {self.uri + name} says {found.seq} (an "
                f"older manifest put back on top?); no writer can commit after it: remove it or put manifest {seq} back"
            )
        return found

    def server_now(self) -> float:
        """The bucket's time now: read once (the hint written again and its `Last-Modified` read,
        to the second, taken at that second's end) and carried on by this process's monotonic clock,
        which no setting of the machine's clock moves; read again after `ANCHOR_FOR` seconds."""
        anchor = _anchors.get(self.uri)
        if anchor is None or time.monotonic() - anchor[1] > ANCHOR_FOR:
            started = time.monotonic()
            seq = self.known.seq if self.known is not None else 0
            self.bucket.put(self.key(LATEST), json.dumps({"seq": seq}).encode("utf-8"))
            self.hinted = seq
            anchor = _anchors[self.uri] = (math.floor(self.bucket.head(self.key(LATEST)).modified) + 1.0, started)
        return anchor[0] + time.monotonic() - anchor[1]

    def holding(self, manifest: Manifest | None) -> dict[str, Any] | None:
        """The manifest's claim while it holds by the bucket's clock (with `left`, its seconds
        left): from its object's `Last-Modified` for its lease (the one it names, at most this
        machine's), whatever the clock of the machine that wrote it said; None when none holds."""
        if manifest is None or not manifest.claim:
            return None
        written = manifest.modified or self.bucket.head(self.key(manifest_name(manifest.seq))).modified
        lease = min(float(manifest.claim.get("lease", claim_lease())), claim_lease())
        left = math.floor(written) + lease - self.server_now()
        return manifest.claim | {"left": left} if left > 0 else None

    def _hint(self) -> int:
        try:
            return int(json.loads(self.bucket.get(self.key(LATEST)))["seq"])
        except MissingObject:
            return 0
        except (ValueError, KeyError, TypeError):
            return 0  # a damaged hint: list from the start

    def commit(
        self,
        change: Callable[[Manifest | None], Manifest | None],
        fresh: bool = False,
        stop: threading.Event | None = None,
    ) -> Manifest | None:
        """Commit `change(latest)` as the next manifest (None: nothing to commit); on a conflict,
        read what was committed since and apply `change` to it again, at most `COMMIT_ATTEMPTS`
        times within `COMMIT_PATIENCE` seconds. `fresh`: read the latest before the first try (else
        the one this process knows is tried first). `stop`: the job's stop event; set while this
        runs (not before: a stopping job's last commit is made), it ends the loop at once with
        `JobStopped`, nothing committed."""
        base = self.latest() if fresh or self.known is None else self.known
        started = time.monotonic()
        armed = stop is not None and not stop.is_set()
        tries = 0
        while tries < COMMIT_ATTEMPTS:
            tries += 1
            proposed = change(base)
            if proposed is None:
                return None
            token = uuid.uuid4().hex
            manifest = replace(proposed, seq=(base.seq if base else 0) + 1, writer=token, modified=0.0)
            name = manifest_name(manifest.seq)
            try:
                self.bucket.put(self.key(name), json.dumps(manifest.body()).encode("utf-8"), create=True)
            except WriteConflict:
                if self._is_ours(manifest.seq, token):  # our earlier try went through; its answer was lost
                    return self._committed(manifest)
                if time.monotonic() - started > COMMIT_PATIENCE:
                    break
                pause = random.uniform(0.05, 0.5)
                if armed and stop is not None and stop.wait(pause):
                    raise JobStopped from None
                if not armed:
                    time.sleep(pause)
                base = self.latest()
                continue
            return self._committed(manifest)
        took = time.monotonic() - started
        raise ClefError(
            f"could not commit to {self.uri}: other writers committed first at each of {tries} tries in {took:.0f} s"
        )

    def _is_ours(self, seq: int, token: str) -> bool:
        try:
            return self.read(seq).writer == token
        except (MissingObject, ClefError):
            return False

    def _committed(self, manifest: Manifest) -> Manifest:
        self.known = _seen[self.uri] = manifest
        if manifest.seq % HINT_EVERY == 1:
            self.write_hint()
        return manifest

    def write_hint(self) -> None:
        """Point readers at the latest manifest this process knows (overwritten: only a hint)."""
        if self.known is not None and self.known.seq != self.hinted:
            self.bucket.put(self.key(LATEST), json.dumps({"seq": self.known.seq}).encode("utf-8"))
            self.hinted = self.known.seq
