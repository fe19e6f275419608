"""A store in a bucket under a prune, a compaction, skewed clocks and a spinning chain (issue 57:
3, 4, 5): moto's S3 server behind the fault proxy; the bucket's clock is moto's `Last-Modified`,
the writers' clocks are the test's (`skew`: a day ahead or behind)."""

from __future__ import annotations

import inspect
import threading
import time
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.errors import ClefError
from clef_cli.store.remote import compaction, manifests, pruning, sync
from clef_cli.store.remote.layout import manifest_name

from .support.remote_stores import Skewed, commit, fresh_machine, key_of, night, open_machine

BUCKET = "clef-store-claims"
STORE = f"s3://{BUCKET}/nightly/"
DAY = 86400.0
runner = CliRunner()


@pytest.fixture
def s3(store_bucket):
    return store_bucket


def skew(patched, seconds: float) -> None:
    """This process's clock as the store's code reads it, `seconds` off (each claim point's module)."""
    for module in (manifests, compaction, pruning, sync):
        patched.setattr(module, "time", Skewed(seconds), raising=False)
    patched.setattr(manifests, "clock", Skewed(seconds).time, raising=False)


def stored_keys(checkpoint) -> set[str]:
    with checkpoint.index.lock:
        return {row[0] for row in checkpoint.index.db.execute("SELECT key FROM keys WHERE final = 1")}


def bucket_objects(client, under: str = "") -> set[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"nightly/{under}")
    return {item["Key"] for page in pages for item in page.get("Contents", [])}


def prune(**options):
    """`prune_bucket` with a grace under the floor, as for a store no job writes to (the option as it is called)."""
    if "no_running_jobs" in inspect.signature(pruning.prune_bucket).parameters:
        options["no_running_jobs"] = True
    return pruning.prune_bucket(STORE, **options)


def named_objects_exist(client, manifest) -> bool:
    named = {f"nightly/{name}" for segment in manifest.segments.values() for name in segment.objects()}
    return named <= bucket_objects(client)


# ---------------------------------------------------------------- 3. the grace floor, a commit after a prune


def test_a_grace_under_the_floor_is_refused_unless_no_job_runs(s3, tmp_path):
    writer = open_machine(STORE, tmp_path / "a")
    night(writer, range(0, 10), range(0, 10))
    writer.close()
    orphan = f"nightly/segments/{'0' * 32}.results"
    s3.put_object(Bucket=BUCKET, Key=orphan, Body=b"an upload not yet named")
    args = ["checkpoint", "prune", STORE, "--keep-runs", "1", "--grace-hours", "0", "--cache-dir", str(tmp_path / "p")]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2, refused.output
    said = " ".join(refused.stderr.split())
    assert "--grace-hours 0 is under the floor of 0.417 hours" in said and "--no-running-jobs" in said, said
    assert orphan in bucket_objects(s3)
    offline = runner.invoke(app, [*args, "--no-running-jobs"])
    assert offline.exit_code == 0, offline.output
    assert orphan not in bucket_objects(s3)


def test_a_commit_after_a_prune_that_deleted_its_segment_puts_it_again(s3, monkeypatch, tmp_path):
    from clef_cli import faults

    first = open_machine(STORE, tmp_path / "a")
    night(first, range(0, 10), range(0, 10))
    first.close()
    writer = open_machine(STORE, tmp_path / "b")
    writer.sync()
    commit(writer, range(100, 110), with_hidden=True)
    pause = faults.pause_at

    def a_prune_meanwhile(point: str) -> None:  # between the segment's upload and its manifest
        if point == "segment-uploaded":
            swept = prune(keep_runs=1, grace_seconds=0)
            assert swept.objects_deleted >= 2  # the unnamed segment's objects, younger than no grace
        pause(point)

    monkeypatch.setattr(faults, "pause_at", a_prune_meanwhile)
    writer.sync()
    monkeypatch.setattr(faults, "pause_at", pause)
    writer.close()
    with fresh_machine(STORE, tmp_path / "c") as reader:
        assert {key_of(n) for n in range(100, 110)} <= stored_keys(reader)
        assert named_objects_exist(s3, reader.chain.known)
        shard, row = reader.index.locate([key_of(105)])[key_of(105)]
        assert reader.shard_table(shard).column("record_key")[row].as_py() == key_of(105)


# ---------------------------------------------------------------- 4. one clock, the bucket's


def test_a_compaction_whose_claim_lapsed_commits_nothing(s3, monkeypatch, tmp_path):
    """Its holder's clock a day behind (its claim looks young to it); the prune's a day ahead."""
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "2")
    for number in range(compaction.FANOUT):  # a full level, each night its own run
        writer = open_machine(STORE, tmp_path / f"m{number}")
        night(writer, range(number * 10, number * 10 + 10), range(number * 10, number * 10 + 10))
        writer.syncer.close()
        writer.syncer = None  # no compaction at its end: the level stays full
        writer.close()
    from clef_cli import faults

    pause = faults.pause_at

    def lapsed_then_pruned(point: str) -> None:  # a merge slower than the lease, then a prune
        if point == "compaction-uploaded":
            time.sleep(3.2)
            with monkeypatch.context() as ahead:
                skew(ahead, +DAY)
                prune(keep_runs=1, grace_seconds=0)
        pause(point)

    with monkeypatch.context() as behind:
        skew(behind, -DAY)
        behind.setattr(faults, "pause_at", lapsed_then_pruned)
        assert compaction.compact(manifests.Chain(STORE)) is None
    with fresh_machine(STORE, tmp_path / "r") as reader:
        last = compaction.FANOUT - 1
        assert stored_keys(reader) == {key_of(n) for n in range(last * 10, last * 10 + 10)}
        assert named_objects_exist(s3, reader.chain.known) and reader.chain.known.claim is None


@pytest.mark.parametrize("seconds", [+DAY, -DAY], ids=["ahead", "behind"])
def test_a_killed_prunes_claim_holds_its_lease_by_the_buckets_clock(s3, monkeypatch, tmp_path, seconds):
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3")
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 10))
    writer.close()
    with monkeypatch.context() as killed:  # a prune SIGKILLed on a machine whose clock is a day off
        skew(killed, seconds)
        manifests.Chain(STORE).commit(lambda base: replace(base, claim=manifests.new_claim("prune")), fresh=True)
    taken = time.monotonic()
    with monkeypatch.context() as other:  # the next machines' clocks are a day off the other way
        skew(other, -seconds)
        manifests.forget()
        with pytest.raises(ClefError, match=r"held by a `clef checkpoint prune` .* for at most [0-3] s more"):
            open_machine(STORE, tmp_path / "b")
        assert compaction.compact(manifests.Chain(STORE), choose=lambda m: list(m.segments.values()) * 2) is None
        time.sleep(max(0.0, taken + 3 + 1.2 - time.monotonic()))  # the lease, by the bucket's clock
        manifests.forget()
        later = open_machine(STORE, tmp_path / "b")
        commit(later, range(10, 20))
        later.close()
    with fresh_machine(STORE, tmp_path / "c") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(20)}


def test_unclaim_breaks_a_claim_after_its_confirmation_and_says_whose(s3, monkeypatch, tmp_path):
    import os
    import socket

    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 10))
    writer.close()
    manifests.Chain(STORE).commit(lambda base: replace(base, claim=manifests.new_claim("prune")), fresh=True)
    whose = f"a `clef checkpoint prune` (pid {os.getpid()} on host {socket.gethostname()})"
    asked = runner.invoke(app, ["checkpoint", "unclaim", STORE])
    assert asked.exit_code == 2, asked.output
    said = " ".join(asked.stderr.split())
    assert whose in said and "--confirm" in said and "s more" in said, said
    manifests.forget()
    assert manifests.Chain(STORE).latest().claim is not None
    broken = runner.invoke(app, ["checkpoint", "unclaim", STORE, "--confirm"])
    assert broken.exit_code == 0, broken.output
    assert f"broke the claim on {STORE} of {whose}" in " ".join(broken.stdout.split()), broken.stdout
    manifests.forget()
    assert manifests.Chain(STORE).latest().claim is None
    again = runner.invoke(app, ["checkpoint", "unclaim", STORE, "--confirm"])
    assert again.exit_code == 0 and "nothing to break" in again.stdout, again.output
    open_machine(STORE, tmp_path / "b").close()  # jobs go on at once


# ---------------------------------------------------------------- 5. no writer spins


def test_an_old_manifest_put_back_on_top_is_an_inconsistent_chain_not_other_writers(s3, proxy, monkeypatch, tmp_path):
    monkeypatch.setattr(manifests, "COMMIT_PATIENCE", 3.0)  # the code as it was spun for this long
    writer = open_machine(STORE, tmp_path / "a")
    for night_number in range(2):
        commit(writer, range(night_number * 10, night_number * 10 + 10))
        writer.sync()  # manifests 1 and 2
    first = s3.get_object(Bucket=BUCKET, Key=f"nightly/{manifest_name(1)}")["Body"].read()
    s3.put_object(Bucket=BUCKET, Key=f"nightly/{manifest_name(3)}", Body=first)  # put back on top by hand
    commit(writer, range(20, 30))
    proxy.clear()
    started = time.monotonic()
    with pytest.raises(ClefError) as refused:
        writer.sync()
    assert f"an inconsistent chain: manifest {STORE}{manifest_name(3)} says 1" in str(refused.value)
    assert "other writers" not in str(refused.value)
    assert time.monotonic() - started < 2.5
    assert sum(method == "PUT" and "/manifests/" in path for method, path in proxy.requests) <= 1
    writer.syncer = None
    writer.close()


def test_a_commit_that_always_loses_ends_after_its_attempts(s3, monkeypatch, tmp_path):
    monkeypatch.setattr(manifests, "COMMIT_PATIENCE", 3.0)
    monkeypatch.setattr(manifests, "COMMIT_ATTEMPTS", 4, raising=False)
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 10))
    writer.close()
    other = manifests.Chain(STORE)
    chain = manifests.Chain(STORE)
    chain.known = other.latest()
    tries = []

    def always_second(base):  # another writer commits first at every try
        tries.append(base.seq)
        other.commit(lambda latest: replace(latest, runs=dict(latest.runs) | {f"r{len(tries)}": {}}), fresh=True)
        return replace(base)

    with pytest.raises(ClefError, match="other writers committed first at each of 4 tries"):
        chain.commit(always_second)
    assert len(tries) == 4


def test_a_stop_request_ends_a_commit_that_keeps_conflicting_at_once(s3, proxy, monkeypatch, tmp_path):
    from clef_cli.errors import JobStopped
    from clef_cli.store.remote.store import RemoteCheckpoint

    from .support.remote_stores import FINGERPRINT, machine

    monkeypatch.setattr(manifests, "COMMIT_PATIENCE", 3.0)  # the code as it was spun for this long
    stop = threading.Event()
    writer = RemoteCheckpoint.open_remote(
        machine(STORE, tmp_path / "a"), FINGERPRINT, sync_every=3600, hold_lock=True, stop=stop
    )
    commit(writer, range(0, 10))
    proxy.failures[f"PUT /{BUCKET}/nightly/manifests/"] = 10_000  # every manifest put: 412, as a storm
    proxy.failure_status, proxy.failure_code = 412, "PreconditionFailed"
    threading.Timer(0.5, stop.set).start()  # SIGTERM's first request sets the job's stop event
    started = time.monotonic()
    try:
        with pytest.raises(JobStopped):
            writer.syncer.close()  # the job's last commit
    finally:
        proxy.failures.clear()
        proxy.failure_status, proxy.failure_code = 503, "SlowDown"
    assert time.monotonic() - started < 2.0
    writer.syncer = None
    writer.close()
    manifests.forget()
    assert manifests.Chain(STORE).latest() is None  # nothing committed half-way
