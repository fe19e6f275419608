"""A store in a bucket (store/remote/), reviewed: crash states of the cache and the sync that the
first tests missed, claims a job must not wait for, prefixes that are no store, the dtype of
states computed on a fresh machine, a reader's run in every machine's history, and
`checkpoint info`'s keys with states. Against moto's S3 server behind the counting proxy; each
`machine` has its own cache folder."""

from __future__ import annotations

import json
import socket
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.errors import ClefError
from clef_cli.locations.uris import LocationProblem
from clef_cli.store.key_index import KeyIndex
from clef_cli.store.remote import manifests

from .support.helpers import TINY_MODEL, write_jsonl
from .support.remote_stores import FINGERPRINT, commit, fresh_machine, key_of, machine, night, open_machine
from .test_remote_store import BUCKET, STORE, Killed, objects, stored_keys  # the same bucket and store

runner = CliRunner()


@pytest.fixture
def s3(store_bucket):
    return store_bucket


def test_an_import_killed_before_its_keys_were_indexed_is_repaired_at_the_next_open(s3, monkeypatch, tmp_path):
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 20), per_shard=10)
    writer.close()
    manifests.forget()

    def killed(*args, **kwargs):
        raise Killed("between the journal lines and the key index")

    with monkeypatch.context() as patched, pytest.raises(Killed):
        patched.setattr(KeyIndex, "add_keys", killed)
        open_machine(STORE, tmp_path / "b", sync_every=None)
    with fresh_machine(STORE, tmp_path / "b") as reader:  # the parts journaled are indexed from their rows
        assert stored_keys(reader) == {key_of(n) for n in range(20)}


def test_a_manifest_committed_whose_answer_was_lost_is_not_sent_again(s3, monkeypatch, tmp_path):
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 10))
    put = writer.chain.bucket.put

    def answer_lost(key, data, create=False):
        put(key, data, create)
        if create:  # the manifest is stored; the job hears only that the endpoint failed
            raise LocationProblem("the store kept failing", transient=True)

    with monkeypatch.context() as patched, pytest.raises(LocationProblem):
        patched.setattr(writer.chain.bucket, "put", answer_lost)
        writer.sync()
    commit(writer, range(10, 20))
    writer.close()
    with fresh_machine(STORE, tmp_path / "b") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(20)}
        assert reader.chain.known.total("records") == 20  # not 30: records 0-9 named once


def test_a_jobs_sync_commits_as_soon_as_a_claim_it_met_is_released(s3, tmp_path):
    from clef_cli.store.remote.compaction import claimed
    from clef_cli.store.remote.sync import Claimed

    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 10))
    writer.sync()
    commit(writer, range(10, 20))
    with claimed(manifests.Chain(STORE), "prune"), pytest.raises(Claimed):  # a prune holds it for 15 minutes
        writer.sync()  # waits (the sync's next turn)
    writer.sync()  # released: committed now, not when the lease would have ended
    try:
        assert len(writer.chain.known.segments) == 2 and writer.chain.known.active_claim() is None
    finally:
        writer.close()


def test_a_compaction_claim_is_named_as_a_jobs_end_not_a_command(s3, tmp_path):
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 10))
    writer.close()
    chain = manifests.Chain(STORE)
    chain.commit(lambda base: replace(base, claim=manifests.new_claim("compaction")))
    with pytest.raises(ClefError) as refused:
        open_machine(STORE, tmp_path / "b")
    message = str(refused.value)
    assert "compaction at the end of a `clef score` job" in message and "clef checkpoint compaction" not in message
    assert "s more" in message and "\n" not in message


def test_a_prefix_whose_folders_are_another_tools_is_refused_with_nothing_written(s3, proxy, tmp_path):
    s3.put_object(Bucket=BUCKET, Key="nightly/runs/exp1/metrics.json", Body=b"{}")
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "state": "hello"}])
    proxy.clear()
    args = ["score", str(inputs), "-o", str(tmp_path / "o.parquet"), "--checkpoint", STORE, "--model", str(TINY_MODEL)]
    result = runner.invoke(app, [*args, "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 2, result.output
    assert "not a clef store (runs/exp1/)" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert objects(s3) == ["nightly/runs/exp1/metrics.json"] and proxy.count("PUT") == 0
    assert not (tmp_path / "o.parquet").exists()


def test_a_store_that_keeps_failing_at_the_start_stops_the_job_in_one_line(s3, proxy, tmp_path):
    unread = tmp_path / "export.csv"  # read, it would be refused (no state column: exit 2)
    unread.write_text("id,text\n1,hello\n")
    proxy.failures["prefix=nightly%2Fmanifests%2F"] = 10  # its listings
    proxy.failure_status = 400
    try:
        args = ["score", str(unread), "-o", str(tmp_path / "o.parquet"), "--checkpoint", STORE]
        result = runner.invoke(app, [*args, "--model", str(TINY_MODEL), "--cache-dir", str(tmp_path / "cache")])
    finally:
        proxy.failures.clear()
        proxy.failure_status = 503
    assert result.exit_code == 1, result.output
    assert (
        f"--checkpoint {STORE}: the object store kept failing" in result.stderr
        and len(result.stderr.strip().splitlines()) == 1
    )
    assert "clef -v" not in result.stderr, result.stderr  # the job's error, not an unexpected one


def test_states_computed_on_a_fresh_machine_take_the_dtype_the_bucket_holds(s3, proxy, tmp_path):
    from clef_cli.engines.on_demand import states_settings
    from clef_cli.job.settings import ScoreSettings

    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 10), with_hidden=True)  # float32 states
    writer.close()
    manifests.forget()
    proxy.clear()
    fresh = ScoreSettings(inputs=[], output=tmp_path / "o.parquet", checkpoint=STORE, cache_dir=tmp_path / "b",
                          model="elsewhere/model")  # fmt: skip
    assert fresh.hidden_dtype == "bfloat16"  # the run's default
    assert states_settings(fresh).hidden_dtype == "float32"
    read = [path for method, path in proxy.requests if method == "GET" and path.endswith((".keys", ".results"))]
    assert read == [] and proxy.count("GET", ".hidden") == 2  # the first object's header, by two ranges


def reader_run(location, used: range):
    """A run that reads the store (as `--rehead` does): its records have the keys of `used`."""
    from clef_cli.store.ledger import Ledger
    from clef_cli.store.remote.store import RemoteCheckpoint

    reader = RemoteCheckpoint.open_remote(location, None, sync_every=None, hold_lock=True)
    reader.begin_run()
    ledger = Ledger(reader.index, reader.run_seq)
    with reader.index.transaction() as db:
        db.executemany("INSERT INTO temp.job VALUES (?, ?, ?, NULL)", [(n, f"r{n}", key_of(n)) for n in used])
    reader.ledger = ledger
    reader.index.finish_run(reader.run_id, {"run": 0, "reused": len(used)})
    reader.close()
    return reader.run_id


def test_a_readers_run_is_in_every_machines_history_and_prune_counts_it(s3, tmp_path):
    from clef_cli.store.remote.pruning import prune_bucket

    first = open_machine(STORE, tmp_path / "a")
    night(first, range(0, 30), range(0, 30))
    first.close()
    manifests.forget()
    rehead = reader_run(machine(STORE, tmp_path / "b"), range(0, 10))
    manifests.forget()
    shown = runner.invoke(app, ["checkpoint", "info", STORE, "--json", "--cache-dir", str(tmp_path / "c")])
    assert shown.exit_code == 0, shown.output
    runs = json.loads(shown.stdout)["runs"]
    assert [run["run_id"] for run in runs][-1] == rehead and runs[-1]["counts"] == {"run": 0, "reused": 10}
    planned = prune_bucket(STORE, keep_runs=1, dry_run=True)  # the last run is the rehead: it used 0-9
    assert planned.kept_runs == [rehead] and planned.keys_dropped == 20


def test_checkpoint_info_counts_no_failed_record_among_the_keys_with_states(s3, tmp_path):
    from clef_cli.store.checkpoint import Checkpoint

    failed = {3, 14}
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 20), per_shard=10, with_hidden=True, failed_for_good=failed)
    writer.sync()
    commit(writer, range(20, 25), per_shard=10, with_hidden=True, failed_for_good={22})  # the cache's own, unsynced
    folder = Checkpoint.open(tmp_path / "folder", FINGERPRINT)  # the same shards in a folder store
    commit(folder, range(0, 20), per_shard=10, with_hidden=True, failed_for_good=failed)
    commit(folder, range(20, 25), per_shard=10, with_hidden=True, failed_for_good={22})
    try:
        assert writer.info()["keys_with_hidden_states"] == folder.info()["keys_with_hidden_states"] == 22
    finally:
        folder.close()
        writer.close()
    with fresh_machine(STORE, tmp_path / "b") as reader:
        assert reader.info()["keys_with_hidden_states"] == 22  # from the parts' lists: no results downloaded
        assert not any((reader.shards_path).glob("*.results.arrow"))


def test_a_prune_plans_under_its_claim_so_a_compaction_just_before_it_loses_nothing_to_it(s3, monkeypatch, tmp_path):
    from clef_cli.store.remote import pruning
    from clef_cli.store.remote.compaction import FANOUT, compact

    for number in range(FANOUT):  # a night a segment, each computing its own ten keys
        writer = open_machine(STORE, tmp_path / "a")
        night(writer, range(number * 10, number * 10 + 10), range(number * 10, number * 10 + 10))
        writer.syncer.close()
        writer.syncer = None  # no compaction at its end: the level stays full
        writer.close()
    taken = pruning.claimed

    def after_a_compaction(chain, what):  # another job's end compacts just as the prune starts
        compact(manifests.Chain(STORE))
        return taken(chain, what)

    monkeypatch.setattr(pruning, "claimed", after_a_compaction)
    report = pruning.prune_bucket(STORE, keep_runs=1, grace_seconds=3600)
    assert report.keys_dropped == (FANOUT - 1) * 10
    manifests.forget()
    reader = open_machine(STORE, tmp_path / "b", sync_every=None)
    try:  # the last night's keys, once: not the merged segment's all, beside nothing
        last = range((FANOUT - 1) * 10, FANOUT * 10)
        assert stored_keys(reader) == {key_of(n) for n in last} and reader.chain.known.total("records") == 10
    finally:
        reader.close()


def test_a_sync_that_waits_for_a_claim_sends_its_segment_once(s3, proxy, tmp_path):
    from clef_cli.store.remote.compaction import claimed
    from clef_cli.store.remote.sync import Claimed

    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 10), with_hidden=True)
    writer.sync()
    commit(writer, range(10, 20), with_hidden=True)
    with claimed(manifests.Chain(STORE), "prune"):
        with pytest.raises(Claimed):
            writer.sync()  # its segment went up, then the manifest told of the claim
        proxy.clear()
        for _ in range(3):  # the sync's next turns while the prune holds the store
            with pytest.raises(Claimed):
                writer.sync()
        assert proxy.count("PUT") == 0 and proxy.count("POST") == 0, proxy.requests
    writer.close()
    with fresh_machine(STORE, tmp_path / "b") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(20)}


def test_a_jobs_end_waits_while_a_prune_holds_the_store_and_commits_once_it_is_released(s3, tmp_path):
    """The claim is released only once the job said it waits (never by the clock), so the wait is
    certain however slow the machine."""
    import os
    import re
    import socket
    import threading
    import time

    from clef_cli.store.remote.compaction import claimed
    from clef_cli.store.remote.store import RemoteCheckpoint

    said: list[str] = []
    writer = RemoteCheckpoint.open_remote(
        machine(STORE, tmp_path / "a"), FINGERPRINT, sync_every=3600, hold_lock=True, say=said.append
    )
    commit(writer, range(0, 10))
    writer.sync()  # a store to hold
    commit(writer, range(10, 20))
    hold = claimed(manifests.Chain(STORE), "prune")
    hold.__enter__()

    def release_once_said() -> None:
        deadline = time.monotonic() + 20  # a job that never says so still ends (and fails below)
        while not said and time.monotonic() < deadline:
            time.sleep(0.05)
        hold.__exit__(None, None, None)

    releaser = threading.Thread(target=release_once_said, daemon=True)
    releaser.start()
    writer.close()  # waits (its first try met the claim), then commits
    releaser.join(25)
    holder = f"a `clef checkpoint prune` (pid {os.getpid()} on host {socket.gethostname()})"
    expected = rf"the store {re.escape(STORE)} is held by {re.escape(holder)} for at most \d+ s more: "
    expected += "the job's last commit waits for it"
    assert len(said) == 1 and re.fullmatch(expected, said[0]), said
    with fresh_machine(STORE, tmp_path / "b") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(20)} and reader.chain.known.active_claim() is None


@pytest.mark.slow  # a lease to wait out (about 3 s)
def test_a_jobs_end_that_waits_for_a_claim_says_so_once_and_for_how_long(s3, monkeypatch, tmp_path):
    from clef_cli.store.remote.store import RemoteCheckpoint

    said: list[str] = []
    writer = RemoteCheckpoint.open_remote(
        machine(STORE, tmp_path / "a"), FINGERPRINT, sync_every=3600, hold_lock=True, say=said.append
    )
    commit(writer, range(0, 10))
    writer.sync()
    commit(writer, range(10, 20))
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3")
    chain = manifests.Chain(STORE)
    chain.commit(lambda base: replace(base, claim=manifests.new_claim("prune")), fresh=True)  # left by a killed prune
    writer.close()  # waits out the lease, then commits
    assert len(said) == 1 and "held by a `clef checkpoint prune`" in said[0] and "s more" in said[0], said
    assert "waits for it" in said[0]
    with fresh_machine(STORE, tmp_path / "b") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(20)}


@pytest.mark.slow  # a million keys in the ledger (about 15 s)
def test_a_runs_keys_go_up_a_batch_at_a_time_in_bounded_memory(s3, monkeypatch, tmp_path):
    import tracemalloc
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.ipc as ipc

    from clef_cli.store.ledger import Ledger

    count = 1_000_000
    writer = open_machine(STORE, tmp_path / "a")
    writer.begin_run()
    commit(writer, range(0, 5))
    writer.sync()  # a first sync, before the ledger: what a sync imports is imported
    ledger = Ledger(writer.index, writer.run_seq)
    with writer.index.transaction() as db:
        rows = ((n, f"r{n}", f"{n:064x}") for n in range(count))
        db.executemany("INSERT INTO temp.job VALUES (?, ?, ?, NULL)", rows)
    writer.ledger = ledger
    sent = {}
    put = writer.chain.bucket.put

    def kept_aside(key, data, create=False):  # moto and the proxy run in this process: their copies are not clef's
        if not key.endswith(".keys") or "/runs/" not in key:
            return put(key, data, create)
        source = pa.memory_map(str(data)) if isinstance(data, Path) else pa.py_buffer(data)
        sent[key] = ipc.open_file(source).read_all()

    monkeypatch.setattr(writer.chain.bucket, "put", kept_aside)
    tracemalloc.start()
    try:
        writer.sync()  # the run's first record, with its keys: runs/RUN.keys
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    writer.close()
    assert peak < 40 << 20, f"{peak / 2**20:.0f} MiB"  # one batch of keys: 21 MiB; a million at once: 186
    (keys,) = sent.values()
    assert keys.num_rows == count and keys.column("key")[1].as_py() == bytes.fromhex(f"{1:064x}")
    assert keys.column("key").to_pylist() == sorted(keys.column("key").to_pylist())


def test_the_sync_commits_beside_the_job_every_few_seconds_without_being_asked(s3, tmp_path):
    import time

    writer = open_machine(STORE, tmp_path / "a", sync_every=0.2)
    try:
        commit(writer, range(0, 10))
        deadline = time.monotonic() + 20
        while not objects(s3, "manifests/") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert objects(s3, "manifests/"), "no sync came while the job ran"
        commit(writer, range(10, 20))
        while len(objects(s3, "manifests/")) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(objects(s3, "manifests/")) >= 2
    finally:
        writer.close()


def test_a_jobs_last_commit_that_fails_keeps_its_records_for_the_rerun_here_and_says_so(s3, monkeypatch, tmp_path):
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 10))
    writer.sync()
    commit(writer, range(10, 30), per_shard=10)

    def refused(key, data, create=False):
        raise LocationProblem("the store kept failing", transient=True)

    with monkeypatch.context() as patched, pytest.raises(ClefError) as failed:
        patched.setattr(writer.chain.bucket, "put", refused)
        writer.close()
    message = str(failed.value)
    assert "the 20 records this machine committed since its last sync are kept" in message
    assert str(writer.path) in message and "rerun the same command here" in message and "\n" not in message
    manifests.forget()
    again = open_machine(STORE, tmp_path / "a")  # the rerun on the same machine sends them
    again.close()
    with fresh_machine(STORE, tmp_path / "b") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(30)}


def test_an_endpoint_that_does_not_answer_ends_the_job_in_one_line_before_a_record_is_read(s3, monkeypatch, tmp_path):
    import time

    unread = tmp_path / "export.csv"  # read, it would be refused (no state column: exit 2)
    unread.write_text("id,text\n1,hello\n")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    args = ["score", str(unread), "-o", str(tmp_path / "o.parquet"), "--checkpoint", STORE, "--model", str(TINY_MODEL)]
    started = time.monotonic()
    result = runner.invoke(app, [*args, "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert "127.0.0.1:9" in result.stderr and time.monotonic() - started < 30
    assert not (tmp_path / "cache").exists() and not (tmp_path / "o.parquet").exists()


def test_the_sync_thread_never_keeps_a_dying_process_alive(s3, tmp_path):
    """Its loop ends only when the store is closed; a job that dies without closing it (an
    uncaught error in a library caller) must still exit, so the thread is a daemon. A reader
    (`sync_every` None) starts none."""
    writer = open_machine(STORE, tmp_path / "a")
    try:
        thread = writer.syncer.thread
        assert thread is not None and thread.daemon and thread.is_alive()
    finally:
        writer.close()
    assert not thread.is_alive()
    commit_one = open_machine(STORE, tmp_path / "b")
    commit(commit_one, range(0, 1))
    commit_one.close()
    reader = open_machine(STORE, tmp_path / "c", sync_every=None)
    try:
        assert reader.syncer is None or reader.syncer.thread is None
    finally:
        reader.close()


def _remote_records() -> int:
    latest = manifests.Chain(STORE).latest()
    return 0 if latest is None else sum(segment.records for segment in latest.segments.values())


def _eventually(check, seconds: float = 15.0) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_the_syncs_go_on_after_a_claim_or_a_failure_met_on_the_thread(s3, tmp_path, monkeypatch):
    """A prune during a long job, or a bucket down for a while, pauses the job's syncs; once it
    ends, the next turn commits (so a kill after it loses only --sync-every seconds again)."""
    import time

    from clef_cli.store.remote.compaction import claimed

    writer = open_machine(STORE, tmp_path / "a", sync_every=0.05)
    try:
        commit(writer, range(0, 10))
        assert _eventually(lambda: _remote_records() == 10)
        hold = claimed(manifests.Chain(STORE), "prune")
        hold.__enter__()
        commit(writer, range(10, 20))
        time.sleep(0.5)  # turns that meet the claim
        assert _remote_records() == 10
        hold.__exit__(None, None, None)
        assert _eventually(lambda: _remote_records() == 20)  # before the job's end
        put, down = writer.chain.bucket.put, [True]

        def flaky(*args, **kwargs):
            if down:
                raise OSError("the bucket is down")
            return put(*args, **kwargs)

        monkeypatch.setattr(writer.chain.bucket, "put", flaky)
        commit(writer, range(20, 30))
        time.sleep(0.5)  # turns that fail
        assert _remote_records() == 20
        down.clear()
        assert _eventually(lambda: _remote_records() == 30)
    finally:
        writer.close()


def test_a_jobs_end_that_cannot_commit_says_what_is_kept_and_where(s3, tmp_path, monkeypatch):
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 7))

    def down(*args, **kwargs):
        raise OSError("the bucket is down")

    monkeypatch.setattr(writer.chain.bucket, "put", down)
    with pytest.raises(ClefError) as refused:
        writer.close()
    assert str(refused.value) == (
        f"could not commit to the store {STORE}: the bucket is down; the 7 records this machine committed "
        f"since its last sync are kept in its cache {writer.path} on {socket.gethostname()}: rerun the same "
        "command here to upload them"
    )


def test_a_jobs_end_points_the_hint_at_its_last_manifest(s3, tmp_path):
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 5))
    writer.sync()  # a turn during the job (the hint, if any, is the store's first manifest)
    commit(writer, range(5, 10))
    writer.close()
    hint = json.loads(s3.get_object(Bucket=BUCKET, Key="nightly/latest.json")["Body"].read())
    assert hint == {"seq": manifests.Chain(STORE).latest().seq} and hint["seq"] == 2
