"""The sync beside a job when its commits keep failing (store/remote/sync.py: Syncer._loop,
_failed, _failing_line, _went_through, _tell, _kept, close; Claimed), in process against an
obstore MemoryStore (tests/support/remote_stores.py `served_memory`). The loop runs in the test's thread:
its stop event is a script of turns that moves the syncer's clock by the period (no real sleep).
A sync fails for a reason with known words: another job restarted the store with another model."""

from __future__ import annotations

import socket
import threading
from dataclasses import replace

import pytest

from clef_cli.errors import ClefError
from clef_cli.store.remote import manifests
from clef_cli.store.remote import store as remote_store
from clef_cli.store.remote.sync import REPEAT_EVERY, Claimed, Syncer

from .support.remote_stores import FINGERPRINT, OTHER_MODEL, commit, fresh_machine, key_of, open_machine

PREFIX = "nightly/"
STORE = f"s3://clef-memory/{PREFIX}"
RESTARTED = f"the store {STORE} was restarted by another job with another model meanwhile"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Turns:
    """A syncer's stop event as its loop waits on it: `turns` periods that pass (each moves the
    clock by the period and first runs the hook of that turn, if any), then set."""

    def __init__(self, turns: int, clock: Clock, hooks: dict | None = None) -> None:
        self.left, self.clock, self.hooks, self.waited = turns, clock, hooks or {}, 0
        self.flag = False

    def wait(self, timeout: float) -> bool:
        if self.flag or self.left == 0:
            return True
        self.left -= 1
        self.waited += 1
        self.clock.now += timeout
        if self.waited in self.hooks:
            self.hooks[self.waited]()
        return False

    def set(self) -> None:
        self.flag = True

    def is_set(self) -> bool:
        return self.flag


def restart(model) -> None:
    """Another job's `--restart` of the store with `model`."""
    remote_store._restarted(manifests.Chain(STORE), model)


def failing_writer(tmp_path, every: float, limit: float, turns: int, hooks: dict | None = None, stop=True):
    """A writer with 4 records committed and not synced, the store restarted under it by another
    model, and its syncer (lines said, the clock, the turns and the job's stop event) ready to loop."""
    writer = open_machine(STORE, tmp_path / "a")
    writer.syncer.stop.set()
    writer.syncer.thread.join()  # the thread open_remote started: this test turns the loop itself
    lines: list[str] = []
    job_stop = threading.Event() if stop else None
    syncer = Syncer(writer, writer.chain, writer.mark, every, lines.append, limit, job_stop)
    syncer.clock = clock = Clock()
    syncer.stop = Turns(turns, clock, hooks)
    writer.syncer = syncer
    commit(writer, range(0, 4))
    restart(OTHER_MODEL)
    return writer, syncer, lines


def going_on(limit: str) -> str:
    return f"; the job goes on committing to this machine's cache and stops if the syncs keep failing for {limit} s"


def kept(writer, error: str, records: int = 4) -> str:
    return (
        f"could not commit to the store {STORE}: {error}; the {records} records this machine committed since its "
        f"last sync are kept in its cache {writer.path} on {socket.gethostname()}: rerun the same command here to "
        "upload them"
    )


def test_failing_syncs_are_said_at_once_then_every_repeat_and_one_that_goes_through_says_so(memory, tmp_path):
    """Period 90 s: failures at 90, 180, 270 s (said at 90 and, REPEAT_EVERY later, at 270), the
    store set right before the fourth turn, which commits and says the syncs went through again."""
    assert REPEAT_EVERY == 180.0
    writer, syncer, lines = failing_writer(tmp_path, 90.0, 1000.0, 4, {4: lambda: restart(FINGERPRINT)})
    reports = []
    syncer.report = lambda synced, failing: reports.append((synced, failing))
    syncer._loop()
    assert lines == [
        f"a sync to the store {STORE} failed ({RESTARTED})" + going_on("1000"),
        f"the syncs to the store {STORE} have failed 3 times in a row for 180 s ({RESTARTED})" + going_on("1000"),
        f"the sync to the store {STORE} went through again after 3 failed",
    ]
    assert reports == [(0, 1), (0, 2), (0, 3), (1, 0)]
    assert (syncer.failures, syncer.failing, syncer.failing_since, syncer.failing_for) == (3, 0, None, 0.0)
    assert syncer.last_error == RESTARTED and not syncer.gave_up and not syncer.job_stop.is_set()
    writer.close()
    with fresh_machine(STORE, tmp_path / "r") as reader:
        assert reader.index.locate([key_of(3)]) and reader.chain.known.seq == 3


def test_syncs_failing_for_the_limit_stop_the_job_and_its_close_names_what_the_cache_keeps(memory, tmp_path):
    """Period 90 s, limit 360 s: the fifth failure (360 s after the first) sets the job's stop
    event and ends the loop; the turns left are not taken, nothing more is tried at the close."""
    writer, syncer, lines = failing_writer(tmp_path, 90.0, 360.0, 9)
    syncer._loop()
    assert lines == [
        f"a sync to the store {STORE} failed ({RESTARTED})" + going_on("360"),
        f"the syncs to the store {STORE} have failed 3 times in a row for 180 s ({RESTARTED})" + going_on("360"),
        f"the syncs to the store {STORE} have failed 5 times in a row for 360 s ({RESTARTED}): "
        "the job stops after its current batch",
    ]
    assert syncer.stop.waited == 5 and syncer.failures == 5 and syncer.failing == 5
    assert syncer.gave_up is True and syncer.job_stop.is_set()
    restart(FINGERPRINT)  # were it tried again, it would go through
    with pytest.raises(ClefError) as refused:
        writer.close()
    assert str(refused.value) == kept(writer, f"the syncs failed for 360 s ({RESTARTED})")
    assert writer.sync_failures == 5 and manifests.Chain(STORE).latest().segments == {}


def test_a_second_failure_a_repeat_apart_is_said_with_its_whole_seconds_and_no_stop_event_is_needed(memory, tmp_path):
    """Period 180.5 s, limit 360 s: the second failure is said (180 s, the seconds cut), the
    third gives up; a job with no stop event (a test's, a library's) only stops its syncs; a quiet
    close (the job is failing anyway) raises nothing."""
    writer, syncer, lines = failing_writer(tmp_path, 180.5, 360.0, 9, stop=False)
    syncer._loop()
    assert lines == [
        f"a sync to the store {STORE} failed ({RESTARTED})" + going_on("360"),
        f"the syncs to the store {STORE} have failed 2 times in a row for 180 s ({RESTARTED})" + going_on("360"),
        f"the syncs to the store {STORE} have failed 3 times in a row for 361 s ({RESTARTED}): "
        "the job stops after its current batch",
    ]
    assert syncer.gave_up and syncer.failures == 3
    writer.close(quiet=True)
    assert writer.sync_failures == 3 and manifests.Chain(STORE).latest().segments == {}


def test_a_failure_at_the_close_names_the_records_kept_and_is_counted(memory, tmp_path):
    """No loop ran: the job's end commits, meets the restart, and says what the cache keeps (with
    no `say`, nothing is said and nothing breaks)."""
    writer, syncer, lines = failing_writer(tmp_path, 90.0, 360.0, 0)
    syncer.say = None
    commit(writer, range(4, 7))
    with pytest.raises(ClefError) as refused:
        writer.close()
    assert str(refused.value) == kept(writer, RESTARTED, records=7)
    assert writer.sync_failures == 1 and lines == []


def test_a_sync_under_a_claim_is_refused_naming_the_claim(memory, monkeypatch, tmp_path):
    """A prune holds the store: the sync sends nothing and says whose claim it met."""
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 3))
    writer.sync()
    chain = manifests.Chain(STORE)
    chain.commit(lambda base: replace(base, claim=manifests.new_claim("prune")), fresh=True)
    claim = chain.latest().claim
    commit(writer, range(3, 6))
    with pytest.raises(Claimed) as met:
        writer.sync()
    said = str(met.value)
    start = f"the store {STORE} is held by a `clef checkpoint prune` (pid {claim['pid']} on host {claim['host']}) "
    assert said.startswith(start + "for at most ") and said.endswith(" s more")
    assert met.value.claim["token"] == claim["token"] and 3590 < met.value.claim["left"] <= 3600
    direct = Claimed({"what": "repair", "pid": 7, "host": "h", "left": 9.9}, STORE)
    assert (
        str(direct) == f"the store {STORE} is held by a `clef checkpoint repair` (pid 7 on host h) for at most 9 s more"
    )
    assert direct.claim == {"what": "repair", "pid": 7, "host": "h", "left": 9.9}
    writer.syncer.stop.set()
    writer.syncer.thread.join()
    writer.syncer = None
    writer.close()
