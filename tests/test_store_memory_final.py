"""A job's last sync meets a claim (store/remote/sync.py `Syncer._final`), in process against the
in-memory bucket: it says once whose claim it waits for, polls at most every CLAIM_POLL seconds
(less when the claim has less left), commits once the claim is gone, and a stop request while
it waits ends the job with nothing committed (the cache keeps the records for a rerun)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from clef_cli.errors import JobStopped
from clef_cli.store.remote import manifests
from clef_cli.store.remote import sync as syncing
from clef_cli.store.remote.sync import CLAIM_POLL, Syncer

from .support.remote_stores import commit, fresh_machine, key_of, open_machine

STORE = "s3://clef-memory/final/"
WAITS = "the job's last commit waits for it"


def stored_keys(checkpoint) -> set[str]:
    with checkpoint.index.lock:
        return {row[0] for row in checkpoint.index.db.execute("SELECT key FROM keys WHERE final = 1")}


class Stop:
    """The job's stop event as `_final` waits on it: each wait for the claim is recorded and runs
    `on_wait` (which may release the claim, or ask the job to stop). The commit loop's own pauses
    between conflicting tries wait on it too: made 0 s here (`held_writer`), they are passed by."""

    def __init__(self, on_wait) -> None:
        self.waits: list[float] = []
        self.on_wait, self.flag = on_wait, False

    def wait(self, timeout: float) -> bool:
        if timeout:
            self.waits.append(timeout)
            self.on_wait(len(self.waits))
        return self.flag

    def set(self) -> None:
        self.flag = True

    def is_set(self) -> bool:
        return self.flag


def held_writer(tmp_path, monkeypatch, lease: str, job_stop):
    """A writer with 3 records synced and 3 more committed, a prune's claim on the store, and a
    syncer of its own whose lines are kept; the claim's chain, to release it."""
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", lease)
    monkeypatch.setattr(manifests.random, "uniform", lambda low, high: 0.0)  # the commit loop's pauses
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 3))
    writer.sync()
    writer.syncer.stop.set()
    writer.syncer.thread.join()  # the thread open_remote started: this test ends the job itself
    chain = manifests.Chain(STORE)
    chain.commit(lambda base: replace(base, claim=manifests.new_claim("prune")), fresh=True)
    commit(writer, range(3, 6))
    lines: list[str] = []
    writer.syncer = Syncer(writer, writer.chain, writer.mark, 3600.0, lines.append, 300.0, job_stop)
    return writer, chain, lines


def release(chain) -> None:
    chain.commit(lambda base: replace(base, claim=None), fresh=True)


def test_the_last_commit_waits_out_a_claim_says_so_once_and_then_commits(memory, tmp_path, monkeypatch):
    chain_of: list = []
    stop = Stop(lambda count: release(chain_of[0]) if count == 2 else None)
    writer, chain, lines = held_writer(tmp_path, monkeypatch, "3600", stop)
    chain_of.append(chain)
    writer.syncer._final()
    assert stop.waits == [CLAIM_POLL, CLAIM_POLL]  # 3600 s left: polled every CLAIM_POLL
    assert len(lines) == 1 and lines[0].startswith(f"the store {STORE} is held by a `clef checkpoint prune`")
    assert lines[0].endswith(f" s more: {WAITS}")
    writer.syncer = None
    writer.close()
    with fresh_machine(STORE, tmp_path / "fresh") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(6)}


def test_a_stop_request_while_waiting_ends_the_job_with_nothing_committed(memory, tmp_path, monkeypatch):
    stop = Stop(lambda count: stop.set())
    writer, chain, lines = held_writer(tmp_path, monkeypatch, "3600", stop)
    with pytest.raises(JobStopped):
        writer.syncer._final()
    assert len(stop.waits) == 1 and len(lines) == 1
    release(chain)
    writer.syncer = None
    writer.close()
    with fresh_machine(STORE, tmp_path / "fresh") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(3)}  # the other three stay in the cache


def test_without_a_stop_event_or_once_it_is_set_the_wait_is_a_sleep(memory, tmp_path, monkeypatch):
    """No job stop event (a library caller), or one already set when the job ends (its stop is
    what ends it): the wait cannot be cut short, so it sleeps and tries again."""
    for job_stop in (None, threading.Event()):
        if job_stop is not None:
            job_stop.set()
        slept: list[float] = []
        writer, chain, lines = held_writer(tmp_path / str(job_stop is None), monkeypatch, "3600", job_stop)

        def sleep(seconds: float, chain=chain, slept=slept) -> None:
            if seconds:  # not the commit loop's pauses, made 0 s
                slept.append(seconds)
                release(chain)

        monkeypatch.setattr(syncing.time, "sleep", sleep)
        writer.syncer._final()
        assert slept == [CLAIM_POLL] and len(lines) == 1
        writer.syncer = None
        writer.close()
        monkeypatch.undo()


def test_the_last_sync_of_a_failed_job_puts_no_run_record_of_its_own(memory, tmp_path, monkeypatch):
    """`_final(failed=True)` (a job that failed before its first record) sends nothing when it
    has nothing new; the same end of a job that ran sends its run's record."""
    first = open_machine(STORE, tmp_path / "first")
    commit(first, range(0, 3))
    first.close()
    writer = open_machine(STORE, tmp_path / "a")
    writer.syncer.stop.set()
    writer.syncer.thread.join()
    writer.begin_run()
    before = manifests.Chain(STORE).latest()
    writer.syncer = Syncer(writer, writer.chain, writer.mark, 3600.0, None, 300.0, None)
    writer.syncer._final(failed=True)
    assert manifests.Chain(STORE).latest().seq == before.seq
    writer.syncer._final()
    after = manifests.Chain(STORE).latest()
    assert after.seq == before.seq + 1 and writer.run_id in str(after.body())
    writer.syncer = None
    writer.close()
