"""A store in a bucket (store/remote/) against moto's S3 server behind a counting proxy: each
`machine` has its own cache folder and shares nothing with the others but the bucket."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from clef_cli.store.remote import manifests
from clef_cli.store.remote.layout import MANIFESTS, SEGMENTS, manifest_name

from .support.remote_stores import commit, fresh_machine, key_of, open_machine

BUCKET = "clef-remote-store"
STORE = f"s3://{BUCKET}/nightly/"


@pytest.fixture
def s3(store_bucket):
    return store_bucket


def objects(client, under: str = "") -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"nightly/{under}")
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def stored_keys(checkpoint) -> set[str]:
    with checkpoint.index.lock:
        return {row[0] for row in checkpoint.index.db.execute("SELECT key FROM keys WHERE final = 1")}


def test_a_fresh_machine_reads_a_store_in_requests_that_grow_with_segments_not_records(s3, proxy, tmp_path):
    counts = {}
    for records in (100, 1000):
        manifests.forget()
        store = f"s3://{BUCKET}/n{records}/"
        writer = open_machine(store, tmp_path / f"writer-{records}")
        for night in range(3):  # three syncs: three segments, however many records and shards
            commit(writer, range(night * records, (night + 1) * records), per_shard=records // 10)
            writer.sync()
        writer.close()
        proxy.clear()
        with fresh_machine(store, tmp_path / f"reader-{records}") as reader:
            assert stored_keys(reader) == {key_of(number) for number in range(3 * records)}
            counts[records] = len(proxy.requests)
            assert not any(SEGMENTS in path and path.endswith((".results", ".hidden")) for _, path in proxy.requests)
    assert counts[100] == counts[1000] <= 3 + 3, counts  # hint, listing, manifest; one keys object a segment


def test_a_results_object_is_read_once_and_only_when_its_rows_are_needed(s3, proxy, tmp_path):
    writer = open_machine(STORE, tmp_path / "a")
    for night in range(4):
        commit(writer, range(night * 40, (night + 1) * 40), per_shard=10, with_hidden=True)
        writer.sync()
    writer.close()
    with fresh_machine(STORE, tmp_path / "b") as reader:
        proxy.clear()
        shard, row = reader.index.locate([key_of(45)])[key_of(45)]
        table = reader.shard_table(shard)
        assert table.column("record_key")[row].as_py() == key_of(45)
        for name in {reader.index.locate([key_of(number)])[key_of(number)][0] for number in range(40, 80)}:
            reader.shard_table(name)  # every part of that night's segment: its one results object
        assert [method for method, _ in proxy.requests] == ["GET"], proxy.requests
        assert proxy.requests[0][1].endswith(".results")
        proxy.clear()
        states = [shard for shard in reader.hidden_shards() if shard.path.name.startswith(shard_prefix(reader, 45))]
        assert len(states) == 1 and states[0].verify()  # one part's states: one ranged GET of its bytes
        assert len(proxy.requests) == 1 and proxy.requests[0][1].endswith(".hidden")


def shard_prefix(checkpoint, number: int) -> str:
    return checkpoint.index.locate([key_of(number)])[key_of(number)][0]


def test_two_writers_both_keep_their_results_and_never_overwrite_a_manifest(s3, proxy, tmp_path):
    night_one = open_machine(STORE, tmp_path / "one")
    commit(night_one, range(0, 30))
    night_one.close()  # manifest 1
    first = open_machine(STORE, tmp_path / "one")
    second = open_machine(STORE, tmp_path / "two")  # both know manifest 1
    commit(first, range(30, 60))
    commit(second, range(100, 130))
    proxy.clear()
    first.sync()  # manifest 2
    second.sync()  # tries 2: 412, reads 2, merges, commits 3
    assert proxy.count("PUT", manifest_name(2)) == 2 and proxy.count("PUT", manifest_name(3)) == 1
    first.close()
    second.close()
    with fresh_machine(STORE, tmp_path / "three") as reader:
        assert stored_keys(reader) == {key_of(n) for n in [*range(0, 60), *range(100, 130)]}
        assert len(reader.chain.known.segments) == 3
    assert len(objects(s3, MANIFESTS)) == 3


def test_a_conflict_storm_of_writers_loses_no_segment(s3, tmp_path):
    writers = [open_machine(STORE, tmp_path / f"m{number}") for number in range(6)]
    for number, writer in enumerate(writers):
        commit(writer, range(number * 100, number * 100 + 20))
    start = threading.Barrier(len(writers))

    def sync(writer):
        start.wait()
        writer.sync()

    threads = [threading.Thread(target=sync, args=(writer,)) for writer in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for writer in writers:
        writer.close()
    with fresh_machine(STORE, tmp_path / "reader") as reader:
        expected = {key_of(n) for number in range(6) for n in range(number * 100, number * 100 + 20)}
        assert stored_keys(reader) == expected


class Killed(BaseException):
    """The process 'dies' at a fault point (the test abandons the store as a kill would)."""


def killed_at(monkeypatch, point: str) -> None:
    from clef_cli import faults

    def pause(reached: str) -> None:
        if reached == point:
            raise Killed(point)

    monkeypatch.setattr(faults, "pause_at", pause)


def end_the_lease() -> None:
    """The store's claim reaches the end of its lease now: its lease made 0 (a claim ends a lease
    after its manifest's Last-Modified, by the bucket's clock; tests set a long lease and end it
    here, never wait for it, so a loaded machine cannot end it early)."""

    def ended(base):
        return replace(base, claim=base.claim and base.claim | {"lease": 0})

    manifests.Chain(STORE).commit(ended, fresh=True)
    manifests.forget()


def abandon(checkpoint) -> None:
    """What a SIGKILL leaves: no last sync; the process's lock and database handle go with it."""
    checkpoint.syncer.stop.set()
    checkpoint.syncer = None
    checkpoint.index.close()
    checkpoint.held.release()


@pytest.mark.parametrize("point", ["segment-uploaded", "manifest-committed"])
def test_a_sync_killed_anywhere_loses_nothing_committed_and_uploads_nothing_twice(s3, monkeypatch, tmp_path, point):
    first = open_machine(STORE, tmp_path / "a")
    commit(first, range(0, 40), per_shard=10)
    first.sync()  # manifest 1: records 0-39
    commit(first, range(40, 80), per_shard=10)
    with monkeypatch.context() as patched, pytest.raises(Killed):
        killed_at(patched, point)
        first.sync()
    abandon(first)
    committed = set(range(0, 80 if point == "manifest-committed" else 40))
    with fresh_machine(STORE, tmp_path / "b") as fresh:  # another machine sees what was committed
        assert stored_keys(fresh) == {key_of(n) for n in committed}
    again = open_machine(STORE, tmp_path / "a")  # the same machine, rerun: its cache settles the sync
    try:
        assert stored_keys(again) == {key_of(n) for n in range(0, 80)}
        assert sum(1 for entry in again.entries if entry.remote) == 0  # its own segments are not imported back
    finally:
        again.close()
    with fresh_machine(STORE, tmp_path / "c") as last:
        assert stored_keys(last) == {key_of(n) for n in range(0, 80)}
        assert len(last.chain.known.segments) == 2  # the rerun uploaded the same segment, or none


def test_a_full_level_is_compacted_at_a_jobs_end_and_a_fresh_machine_reads_one_keys_object(s3, proxy, tmp_path):
    from clef_cli.store.remote.compaction import FANOUT

    writer = open_machine(STORE, tmp_path / "a")
    for night in range(FANOUT):
        commit(writer, range(night * 10, night * 10 + 10), with_hidden=True)
        writer.sync()
    writer.close()  # a full level: merged into one segment of the next
    writer = open_machine(STORE, tmp_path / "a")  # the same machine goes on: its synced shards are the merged ones
    commit(writer, range(FANOUT * 10, FANOUT * 10 + 5))
    writer.close()
    proxy.clear()
    with fresh_machine(STORE, tmp_path / "b") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(FANOUT * 10 + 5)}
        segment = next(segment for segment in reader.chain.known.segments.values() if segment.level == 1)
        assert len(reader.chain.known.segments) == 2 and len(segment.hidden) == FANOUT  # states named, never copied
        assert sum(1 for _, path in proxy.requests if path.endswith(".keys")) == 2  # one a segment
        shard = shard_prefix(reader, 75)
        assert next(s for s in reader.hidden_shards() if s.path.name.startswith(shard)).verify()


@pytest.mark.slow  # four machines open the store, a prune claims it twice (about 5 s)
def test_a_claim_refuses_new_jobs_with_how_long_and_expires(s3, monkeypatch, tmp_path):
    from clef_cli.errors import ClefError
    from clef_cli.store.remote.compaction import claimed

    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 10))
    writer.close()
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")  # ended by the test (`end_the_lease`), never by the clock
    refused = pytest.raises(ClefError, match=r"held by a `clef checkpoint prune` .* for at most \d+ s more")
    with claimed(manifests.Chain(STORE), "prune"), refused:  # held, then (on the way out) released
        open_machine(STORE, tmp_path / "b")
    open_machine(STORE, tmp_path / "b").close()
    chain = manifests.Chain(STORE)
    with pytest.raises(Killed), claimed(chain, "prune"):  # a prune killed while it holds the claim
        raise Killed("prune")
    # (`claimed` released it on the way out; a SIGKILL would not: take one and leave it)
    chain.commit(lambda base: replace(base, claim=manifests.new_claim("prune")))
    with pytest.raises(ClefError, match="held by"):
        open_machine(STORE, tmp_path / "b")
    end_the_lease()  # the lease ends: the next job goes on
    late = open_machine(STORE, tmp_path / "b")
    commit(late, range(10, 20))
    late.close()
    with fresh_machine(STORE, tmp_path / "c") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(20)} and reader.chain.known.claim is None


def test_a_store_made_with_another_model_is_refused_in_one_line(s3, tmp_path):
    from clef_cli.store.manifest import CheckpointMismatch

    from .support.remote_stores import OTHER_MODEL

    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 5))
    writer.close()
    with pytest.raises(CheckpointMismatch) as refused:
        open_machine(STORE, tmp_path / "b", manifest=OTHER_MODEL)
    message = str(refused.value)
    assert message.startswith(f"checkpoint {STORE} was scored with") and "weights" in message and "\n" not in message
    assert len(objects(s3, MANIFESTS)) == 1


def test_prune_keeps_what_the_kept_runs_used_and_deletes_orphans_after_the_grace_period(s3, monkeypatch, tmp_path):
    from clef_cli.store.remote.pruning import prune_bucket

    from .support.remote_stores import night

    first = open_machine(STORE, tmp_path / "a")
    night(first, range(0, 30), range(0, 30))
    first.close()
    second = open_machine(STORE, tmp_path / "b")  # another machine, the next night: 10-29 reused
    night(second, range(10, 40), range(30, 40))
    second.close()
    orphan = open_machine(STORE, tmp_path / "c")  # a writer killed after its upload, before its manifest
    commit(orphan, range(500, 510))
    with monkeypatch.context() as patched, pytest.raises(Killed):
        killed_at(patched, "segment-uploaded")
        orphan.sync()
    abandon(orphan)
    before = set(objects(s3))
    dry = prune_bucket(STORE, keep_runs=1, dry_run=True, grace_seconds=0, no_running_jobs=True)
    assert (dry.keys_dropped, dry.objects_deleted) == (10, 2) and set(objects(s3)) == before  # the orphan's 2
    kept = prune_bucket(STORE, keep_runs=1, grace_seconds=3600)
    assert kept.keys_dropped == 10 and kept.objects_deleted == 0  # nothing is old enough yet
    assert set(objects(s3)) > before  # the rewritten segment beside what it replaces, for now
    swept = prune_bucket(STORE, keep_runs=1, grace_seconds=0, no_running_jobs=True)
    # the orphan's two and the replaced keys object (the kept part's results are the same bytes, the same name)
    assert swept.keys_dropped == 0 and swept.objects_deleted == 3
    with fresh_machine(STORE, tmp_path / "d") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(10, 40)}
        named = {f"nightly/{name}" for segment in reader.chain.known.segments.values() for name in segment.objects()}
        assert named <= set(objects(s3, "segments/")) and set(objects(s3, "segments/")) == named


@pytest.mark.slow  # eight syncs and a compaction, twice (about 10 s)
@pytest.mark.parametrize("point", ["claimed", "compaction-uploaded"])
def test_a_compaction_killed_anywhere_leaves_every_key_and_its_claim_expires(s3, monkeypatch, tmp_path, point):
    from clef_cli.store.remote.compaction import FANOUT, compact

    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")  # ended by the test, never by a loaded machine's clock
    writer = open_machine(STORE, tmp_path / "a")
    for night in range(FANOUT):
        commit(writer, range(night * 10, night * 10 + 10), with_hidden=True)
        writer.sync()
    writer.syncer.close()
    writer.syncer = None
    with monkeypatch.context() as patched, pytest.raises(Killed):
        killed_at(patched, point)
        compact(writer.chain)
    writer.index.close()
    writer.held.release()
    with fresh_machine(STORE, tmp_path / "b") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(FANOUT * 10)}
        assert len(reader.chain.known.segments) == FANOUT and reader.chain.known.active_claim() is not None
    end_the_lease()  # the claim's lease ends; the next job's end compacts
    late = open_machine(STORE, tmp_path / "b")
    late.close()
    with fresh_machine(STORE, tmp_path / "c") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(FANOUT * 10)}
        assert len(reader.chain.known.segments) == 1


@pytest.mark.slow  # two nights and two prunes, twice (about 7 s)
@pytest.mark.parametrize("point", ["claimed", "prune-committed"])
def test_a_prune_killed_anywhere_loses_no_kept_key_and_the_next_one_finishes(s3, monkeypatch, tmp_path, point):
    from clef_cli.store.remote.pruning import prune_bucket

    from .support.remote_stores import night

    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")  # ended by the test, never by a loaded machine's clock
    first = open_machine(STORE, tmp_path / "a")
    night(first, range(0, 30), range(0, 30))
    first.close()
    second = open_machine(STORE, tmp_path / "b")
    night(second, range(10, 40), range(30, 40))
    second.close()
    with monkeypatch.context() as patched, pytest.raises(Killed):
        killed_at(patched, point)
        prune_bucket(STORE, keep_runs=1, grace_seconds=0, no_running_jobs=True)
    with fresh_machine(STORE, tmp_path / "c") as reader:
        kept = stored_keys(reader)
        assert {key_of(n) for n in range(10, 40)} <= kept  # nothing kept is lost; 0-9 may still be there
    end_the_lease()
    prune_bucket(STORE, keep_runs=1, grace_seconds=0, no_running_jobs=True)
    with fresh_machine(STORE, tmp_path / "d") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(10, 40)}
        named = {f"nightly/{name}" for segment in reader.chain.known.segments.values() for name in segment.objects()}
        assert set(objects(s3, "segments/")) == named


def test_a_manifest_being_written_is_never_half_read_and_a_storm_of_503s_is_waited_out(s3, proxy, tmp_path):
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 10))
    writer.sync()  # manifest 1
    commit(writer, range(10, 20))
    proxy.hold = lambda method, path: method == "PUT" and manifest_name(2) in path
    proxy.release.clear()
    proxy.held.clear()
    syncing = threading.Thread(target=writer.sync)
    syncing.start()
    assert proxy.held.wait(30)  # manifest 2's body has arrived; the store has not stored it yet
    manifests.forget()
    reader = open_machine(STORE, tmp_path / "b", sync_every=None)
    try:
        assert stored_keys(reader) == {key_of(n) for n in range(0, 10)}  # manifest 1, whole
    finally:
        reader.close()
        proxy.release.set()
        syncing.join()
        proxy.hold = None
    proxy.failures[manifest_name(3)] = 4  # throttled: obstore backs off and tries again
    commit(writer, range(20, 30))
    writer.sync()
    writer.close()
    assert proxy.count("PUT", manifest_name(3)) == 5
    with fresh_machine(STORE, tmp_path / "c") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(0, 30)}


def test_a_confirmed_restart_empties_the_store_for_every_machine(s3, tmp_path):
    from clef_cli.store.remote.store import RemoteCheckpoint

    from .support.remote_stores import FINGERPRINT, OTHER_MODEL, machine

    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 10))
    writer.close()
    restarted = RemoteCheckpoint.open_remote(machine(STORE, tmp_path / "b"), OTHER_MODEL, restart=True, hold_lock=True)
    commit(restarted, range(100, 105))
    restarted.close()
    with fresh_machine(STORE, tmp_path / "a", manifest=OTHER_MODEL) as reader:  # the old cache is rebuilt
        assert stored_keys(reader) == {key_of(n) for n in range(100, 105)}
    assert FINGERPRINT != OTHER_MODEL


def test_checkpoint_info_and_prune_take_a_bucket_store(s3, proxy, tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from clef_cli.cli import app

    from .support.remote_stores import night

    first = open_machine(STORE, tmp_path / "a")
    night(first, range(0, 30), range(0, 30))
    first.close()
    monkeypatch.setenv("CLEF_CACHE_DIR", str(tmp_path / "elsewhere"))
    manifests.forget()
    proxy.clear()
    shown = CliRunner().invoke(app, ["checkpoint", "info", STORE, "--json"])
    assert shown.exit_code == 0, shown.output
    info = json.loads(shown.stdout)
    assert (info["path"], info["keys"], info["segments"]) == (STORE, 30, 1)
    assert info["runs"][0]["counts"] == {"run": 30, "reused": 0} and info["results_bytes"] > 0
    assert not any(path.endswith((".results", ".hidden")) for _, path in proxy.requests)  # nothing but keys
    pruned = CliRunner().invoke(app, ["checkpoint", "prune", STORE, "--keep-runs", "1", "--dry-run"])
    assert pruned.exit_code == 0, pruned.output
    assert "would drop 0 of 30 keys" in pruned.stdout and "would delete 0 objects" in pruned.stdout


def test_a_runs_keys_go_up_once_its_records_are_keyed_even_after_an_earlier_sync(s3, tmp_path):
    from clef_cli.store.ledger import Ledger

    writer = open_machine(STORE, tmp_path / "a")
    writer.begin_run()
    commit(writer, range(0, 5))
    writer.sync()  # a sync while the job still keys its records (a long ledger): no keys to send yet
    assert writer.chain.known.runs[writer.run_id].get("keys") is None
    ledger = Ledger(writer.index, writer.run_seq)
    with writer.index.transaction() as db:
        db.executemany("INSERT INTO temp.job VALUES (?, ?, ?, NULL)", [(n, f"r{n}", key_of(n)) for n in range(8)])
    writer.ledger = ledger
    writer.sync()
    name = writer.chain.known.runs[writer.run_id]["keys"]
    writer.close()
    assert f"nightly/{name}" in objects(s3, "runs/")


def test_a_second_job_on_one_machine_takes_the_next_cache_folder(tmp_path):
    from clef_cli.store.locks import JobLock

    from .support.remote_stores import machine

    first = machine(STORE, tmp_path)
    with JobLock(first.folder.with_name(first.folder.name + ".lock"), "cache"):
        second = machine(STORE, tmp_path)
        assert second.folder == first.folder.with_name(first.folder.name + "-2") and second.uri == first.uri
    assert machine(STORE, tmp_path).folder == first.folder  # free again
    assert first.folder.parent == tmp_path / "stores" and "clef-remote-store-nightly" in first.folder.name
