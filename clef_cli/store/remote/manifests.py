"""The chain of manifests: manifest N names everything that counts in the store (the scoring
fingerprint, the segments, the runs, a claim), and N+1 is written only where no object is
(`If-None-Match: *`), so two writers can never both commit N+1.

A writer commits optimistically on the manifest it knows; a 412 (or 409) means another writer
committed first: it reads what was committed since, merges (a union: segments are immutable and
named by content) and tries the next number, never overwriting. A reader finds the latest manifest
from the hint (`latest.json`) and one listing from there, so opening a store costs three requests
however long its history.

A claim (`prune`, compaction) is a manifest that says who holds the store until when: writers
wait for it to be released or to expire (a bounded lease), so a claim left by a killed job never
blocks the next night longer than the lease.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from clef_cli.errors import ClefError
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

    def body(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION, "seq": self.seq, "fingerprint": self.fingerprint,
            "segments": {name: segment.described() for name, segment in self.segments.items()},
            "runs": self.runs, "claim": self.claim, "writer": self.writer, "committed": time.time(),
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

    def active_claim(self, now: float | None = None) -> dict[str, Any] | None:
        """The claim, while it holds (not released, not past its lease)."""
        if self.claim and float(self.claim.get("until", 0)) > (now or time.time()):
            return self.claim
        return None

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
    """Forget the manifests read (a test's next job starts as a fresh process does)."""
    _seen.clear()


def new_claim(what: str) -> dict[str, Any]:
    now = time.time()
    owner = {"what": what, "host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex}
    return owner | {"since": now, "until": now + claim_lease()}


def claim_line(claim: dict[str, Any], uri: str) -> str:
    """Who holds the store and for how long (the one line a waiting or refused writer shows)."""
    left = max(0, int(float(claim.get("until", 0)) - time.time()))
    what = claim.get("what", "prune")
    holder = "a compaction at the end of a `clef score` job" if what == "compaction" else f"a `clef checkpoint {what}`"
    return (
        f"the store {uri} is held by {holder} (pid {claim.get('pid', '?')} on host {claim.get('host', '?')}) "
        f"for at most {left} s more"
    )


_seen: dict[str, Manifest] = {}
"""The latest manifest this process read of each store: the next look lists only after it."""


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
        seqs = [seq for info in listed if (seq := manifest_seq(info.key[len(self.prefix) :])) is not None]
        seq = max(seqs, default=after)
        if seq == 0:
            return None
        if self.known is not None and seq == self.known.seq:
            return self.known
        try:
            found = self.read(seq)
        except MissingObject:  # the hinted manifest was pruned: list them all
            self.known = None
            listed = self.bucket.list(self.key(MANIFESTS))
            seqs = [seq for info in listed if (seq := manifest_seq(info.key[len(self.prefix) :])) is not None]
            if not seqs:
                return None
            found = self.read(max(seqs))
        self.known = _seen[self.uri] = found
        return found

    def read(self, seq: int) -> Manifest:
        name = manifest_name(seq)
        return Manifest.read(self.bucket.get(self.key(name)), self.uri + name)

    def _hint(self) -> int:
        try:
            return int(json.loads(self.bucket.get(self.key(LATEST)))["seq"])
        except MissingObject:
            return 0
        except (ValueError, KeyError, TypeError):
            return 0  # a damaged hint: list from the start

    def commit(self, change: Callable[[Manifest | None], Manifest | None], fresh: bool = False) -> Manifest | None:
        """Commit `change(latest)` as the next manifest (None: nothing to commit); on a conflict,
        read what was committed since and apply `change` to it again. `fresh`: read the latest
        before the first try (else the one this process knows is tried first)."""
        base = self.latest() if fresh or self.known is None else self.known
        deadline = time.monotonic() + COMMIT_PATIENCE
        while True:
            proposed = change(base)
            if proposed is None:
                return None
            token = uuid.uuid4().hex
            manifest = replace(proposed, seq=(base.seq if base else 0) + 1, writer=token)
            name = manifest_name(manifest.seq)
            try:
                self.bucket.put(self.key(name), json.dumps(manifest.body()).encode("utf-8"), create=True)
            except WriteConflict:
                if self._is_ours(manifest.seq, token):  # our earlier try went through; its answer was lost
                    return self._committed(manifest)
                if time.monotonic() > deadline:
                    raise ClefError(f"could not commit to {self.uri}: other writers kept committing first") from None
                time.sleep(random.uniform(0.05, 0.5))
                base = self.latest()
                continue
            return self._committed(manifest)

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
