"""A store in a bucket the job cannot write (issue 56, point 2): found before the model loads and
before any record is read (a conditional put, a listing and a delete probed, the one probe object
removed at once), and, when the bucket starts refusing during the job, said on stderr at once,
counted in the stats JSON, and after `--sync-failure-limit` seconds the job stops with exit 1,
its work kept in this machine's cache for a rerun here to upload.

Read-only credentials are real ones: moto's IAM, enforced for the length of a `with` through
moto's own switch (`/moto-api/reset-auth`, what `INITIAL_NO_AUTH_ACTION_COUNT` sets), for a user
whose policy allows only what the test says. A bucket that starts refusing mid-job is the
counting proxy answering 403 AccessDenied to the store's writes (tests/support/s3_proxy.py)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.choices import DEFAULT_SYNC_FAILURE_LIMIT
from clef_cli.cli import app
from clef_cli.errors import ClefError
from clef_cli.store.location import remote_location
from clef_cli.store.opening import check_store
from clef_cli.store.remote import manifests
from clef_cli.store.remote.sync import REPEAT_EVERY

from .support.helpers import TINY_MODEL, write_jsonl
from .support.remote_stores import commit, fresh_machine, key_of, open_machine

runner = CliRunner()
BUCKET = "clef-store-preflight"
STORE = f"s3://{BUCKET}/store/"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
COMMON = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--max-length", "4096", "--max-batch-size", "2"]
READ_ONLY = ["s3:Get*", "s3:List*"]
NO_DELETE = [*READ_ONLY, "s3:PutObject"]
PROBE = ".clef-probe-"


@pytest.fixture
def s3(store_bucket, monkeypatch, tmp_path):
    monkeypatch.setenv("CLEF_CACHE_DIR", str(tmp_path / "machine-1"))
    return store_bucket


def keys_in(client) -> list[str]:
    return [item["Key"] for item in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])]


def _reset_auth(server: str, count: str) -> None:
    request = urllib.request.Request(
        f"{server}/moto-api/reset-auth", data=count.encode(), method="POST", headers={"Content-Type": "text/plain"}
    )
    urllib.request.urlopen(request, timeout=10).read()


@contextmanager
def credentials_allowed(s3_server: str, monkeypatch, actions: list[str]) -> Iterator[None]:
    """The job's credentials are a new IAM user's whose policy allows only `actions`, with moto
    enforcing IAM inside the block (and not after: the fixtures' own clients are no IAM user)."""
    import boto3

    iam = boto3.client("iam", endpoint_url=s3_server, region_name="us-east-1")
    user = f"clef-{uuid.uuid4().hex[:8]}"
    iam.create_user(UserName=user)
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
    iam.put_user_policy(UserName=user, PolicyName="only", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    with monkeypatch.context() as patched:
        patched.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        patched.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        _reset_auth(s3_server, "0")
        try:
            yield
        finally:
            _reset_auth(s3_server, "inf")


def records(count: int) -> list[dict]:
    return [
        {"id": f"r{n}", "state": f"ticket {n}: the printer is on fire", "questions": QUESTIONS} for n in range(count)
    ]


def score(inputs, output, *extra):
    return runner.invoke(app, ["score", *map(str, inputs), "-o", str(output), "--checkpoint", STORE, *COMMON, *extra])


def test_read_only_credentials_end_the_job_in_one_line_before_a_record_is_read(
    s3, s3_server, proxy, monkeypatch, tmp_path
):
    unread = tmp_path / "export.csv"  # read, it would be refused (no state column: exit 2)
    unread.write_text("id,text\n1,hello\n")
    started = time.monotonic()
    with credentials_allowed(s3_server, monkeypatch, READ_ONLY):
        result = score([unread], tmp_path / "o.parquet")
    seconds = time.monotonic() - started
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().splitlines() == [
        f"error: --checkpoint {STORE}: the bucket refused a conditional write with these credentials (access denied)"
    ]
    assert keys_in(s3) == [] and not (tmp_path / "o.parquet").exists()  # no probe, no manifest, no segment
    writes = [path for method, path in proxy.requests if method in ("PUT", "POST", "DELETE")]
    assert len(writes) == 1 and PROBE in writes[0], writes  # one write asked for: the probe's
    assert not list((tmp_path / "machine-1").rglob("journal*"))  # no cache holds a commit
    assert seconds < 10, seconds


def test_a_role_that_may_write_but_not_delete_is_refused_and_told_where_the_probe_is(
    s3, s3_server, proxy, monkeypatch, tmp_path
):
    unread = tmp_path / "export.csv"
    unread.write_text("id,text\n1,hello\n")
    with credentials_allowed(s3_server, monkeypatch, NO_DELETE):
        result = score([unread], tmp_path / "o.parquet")
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.strip().splitlines()
    left = [key for key in keys_in(s3) if key.startswith("store/" + PROBE)]
    assert line == (
        f"error: --checkpoint {STORE}: the bucket refused a delete with these credentials (access denied); "
        f"its probe object s3://{BUCKET}/{left[0]} is left there"
    )
    assert keys_in(s3) == left and len(left) == 1
    result = score([unread], tmp_path / "o.parquet")  # with a role that may: the left probe is no stranger
    assert result.exit_code == 2 and "state" in result.stderr, result.output  # the records are read now


def test_the_probe_asks_for_each_write_the_store_makes_and_leaves_nothing(s3, proxy, tmp_path):
    check_store(remote_location(STORE, tmp_path / "cache"))
    assert keys_in(s3) == []
    first = next(at for at, (_, path) in enumerate(proxy.requests) if PROBE in path)
    asked = proxy.requests[first:]
    probe = asked[0][1]
    assert probe.startswith(f"/{BUCKET}/store/{PROBE}")
    assert [method for method, _ in asked] == ["PUT", "PUT", "GET", "POST"], asked
    assert asked[1][1] == probe and f"prefix=store/{PROBE}" in asked[2][1]  # put again, listed
    assert asked[3][1] == f"/{BUCKET}?delete"  # deleted (DeleteObjects)
    assert [answer.status for answer in proxy.answered if answer.method == "PUT"] == [200, 412]


def test_a_bucket_that_ignores_conditional_writes_is_refused(s3, proxy, tmp_path):
    """Two writers' manifests rely on If-None-Match: a store that drops it is refused at once."""
    proxy.dropped_headers.add("if-none-match")
    try:
        with pytest.raises(ClefError, match="ignores conditional writes") as refused:
            check_store(remote_location(STORE, tmp_path / "cache"))
    finally:
        proxy.dropped_headers.clear()
    assert str(refused.value).startswith(f"--checkpoint {STORE}: the bucket ignores conditional writes")
    assert keys_in(s3) == []


def _refused_writes(proxy, monkeypatch, keys: list[str], times: int) -> None:
    """The proxy answers 403 AccessDenied to the next `times` writes under each of `keys`."""
    monkeypatch.setattr(proxy, "failure_status", 403)
    monkeypatch.setattr(proxy, "failure_code", "AccessDenied")
    for key in keys:
        proxy.failures[f"PUT /{BUCKET}/store/{key}"] = times


def stored_keys(checkpoint) -> set[str]:
    with checkpoint.index.lock:
        return {row[0] for row in checkpoint.index.db.execute("SELECT key FROM keys WHERE final = 1")}


def _eventually(check, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


@contextmanager
def watched_writer(tmp_path, sync_every: float = 0.05) -> Iterator:
    """A job's store on machine "a" syncing every `sync_every` s, its lines, the job's stop event and
    its clock (a list holding the time, moved by the test: no real wait for a limit)."""
    writer = open_machine(STORE, tmp_path / "a", sync_every=sync_every)
    syncer = writer.syncer
    now, said, reported = [1000.0], [], []
    syncer.clock, syncer.say, syncer.job_stop = (lambda: now[0]), said.append, threading.Event()
    syncer.report = lambda synced, failing: reported.append((synced, failing))
    try:
        yield writer, syncer, now, said, reported
    finally:
        if writer.syncer is not None:
            with contextlib.suppress(ClefError):
                writer.close()


def test_a_failing_sync_is_said_at_once_then_every_few_minutes_and_its_recovery_too(s3, proxy, monkeypatch, tmp_path):
    _refused_writes(proxy, monkeypatch, ["segments/"], 10**6)
    with watched_writer(tmp_path) as (writer, syncer, now, said, reported):
        assert (syncer.synced, syncer.failures, syncer.failing, syncer.failing_since) == (0, 0, 0, None)
        commit(writer, range(0, 10))
        assert _eventually(lambda: syncer.failures >= 3)
        assert syncer.failing_since == 1000.0 and syncer.failing_for == 0.0 and "access denied" in syncer.last_error
        assert len(said) == 1 and said[0].startswith(f"a sync to the store {STORE} failed (")
        assert said[0].endswith(
            "the job goes on committing to this machine's cache and stops if the syncs keep failing for 300 s"
        )
        now[0] += REPEAT_EVERY - 1
        seen = syncer.failures
        assert _eventually(lambda: syncer.failures > seen + 1) and len(said) == 1  # not yet
        now[0] += 1
        assert _eventually(lambda: len(said) == 2)
        assert (
            said[1].startswith(f"the syncs to the store {STORE} have failed ")
            and f" for {REPEAT_EVERY:g} s (" in said[1]
        )
        proxy.failures.clear()
        assert _eventually(lambda: syncer.failing == 0)
        assert said[2] == f"the sync to the store {STORE} went through again after {syncer.failures} failed"
        assert syncer.failing_since is None and syncer.synced == 1 and not syncer.job_stop.is_set()
        assert (1, 0) in reported and (0, 1) in reported
        writer.close()
    assert writer.sync_failures >= 3 and len(said) == 3


def test_syncs_failing_past_the_limit_stop_the_job_and_its_work_stays_for_a_rerun_here(
    s3, proxy, monkeypatch, tmp_path
):
    _refused_writes(proxy, monkeypatch, ["segments/"], 10**6)
    with watched_writer(tmp_path) as (writer, syncer, now, said, _):
        commit(writer, range(0, 10))
        assert _eventually(lambda: syncer.failures >= 2)
        now[0] += DEFAULT_SYNC_FAILURE_LIMIT - 1
        assert _eventually(lambda: syncer.failures >= 4) and not syncer.job_stop.is_set()
        now[0] += 1
        assert _eventually(lambda: syncer.job_stop.is_set()) and syncer.gave_up
        syncer.thread.join(5)
        assert not syncer.thread.is_alive()  # no more turns: the job's end does not try again
        assert said[-1].endswith(": the job stops after its current batch")
        assert said[-1].startswith(f"the syncs to the store {STORE} have failed ")
        commit(writer, range(10, 15))  # the batch in flight when the job was told to stop
        asked = len(proxy.requests)
        with pytest.raises(ClefError) as stopped:
            writer.close()
        assert len(proxy.requests) == asked
    message = str(stopped.value)
    assert message.startswith(f"could not commit to the store {STORE}: the syncs failed for 300 s (")
    assert message.endswith(
        f"the 15 records this machine committed since its last sync are kept in its cache {writer.path} on "
        f"{socket.gethostname()}: rerun the same command here to upload them"
    )
    proxy.failures.clear()
    manifests.forget()
    again = open_machine(STORE, tmp_path / "a")  # the rerun on this machine sends them
    again.close()
    with fresh_machine(STORE, tmp_path / "b") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(15)}


def test_syncs_that_fail_during_the_job_are_said_at_once_and_counted_in_the_stats(s3, proxy, monkeypatch, tmp_path):
    inputs = write_jsonl(tmp_path / "records.jsonl", records(6))
    monkeypatch.setenv("CLEF_TEST_SLOW_COMMIT", "0.5")  # the job outlives a few sync turns
    _refused_writes(proxy, monkeypatch, ["runs/"], 2)  # the run's keys, sent at each turn until they go
    stats = tmp_path / "stats.json"
    result = score([inputs], tmp_path / "o.parquet", "--sync-every", "0.1", "--stats-json", stats)
    assert result.exit_code == 0, result.output
    failed = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(failed) == 2, result.stderr
    assert failed[0].startswith(f"warning: a sync to the store {STORE} failed (") and "access denied" in failed[0]
    assert failed[0].endswith("stops if the syncs keep failing for 300 s")
    assert failed[1] == f"warning: the sync to the store {STORE} went through again after 2 failed"
    assert json.loads(stats.read_text())["sync_failures"] == 2


@pytest.mark.slow  # two runs of the tiny model (about 30 s on a loaded machine)
def test_syncs_that_keep_failing_stop_the_job_which_keeps_its_work_for_a_rerun_here(s3, proxy, monkeypatch, tmp_path):
    inputs = write_jsonl(tmp_path / "records.jsonl", records(20))
    monkeypatch.setenv("CLEF_TEST_SLOW_COMMIT", "0.5")  # the whole job would take 5 s and more
    _refused_writes(proxy, monkeypatch, ["segments/"], 10**6)  # from the first committed batch on
    started = time.monotonic()
    result = score([inputs], tmp_path / "o.parquet", "--sync-every", "0.1", "--sync-failure-limit", "0.5")
    seconds = time.monotonic() - started
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"warning: a sync to the store {STORE} failed (")
    assert lines[-2].startswith(f"warning: the syncs to the store {STORE} have failed ")
    assert lines[-2].endswith(": the job stops after its current batch")
    cache = next((tmp_path / "machine-1" / "stores").iterdir())
    assert lines[-1].startswith(f"error: could not commit to the store {STORE}: the syncs failed for 0.5 s (")
    assert f"are kept in its cache {cache} on {socket.gethostname()}: rerun the same command here" in lines[-1]
    assert not (tmp_path / "o.parquet").exists() and not [key for key in keys_in(s3) if "segments/" in key]
    assert seconds < 60, seconds
    proxy.failures.clear()
    stats = tmp_path / "stats.json"
    again = score([inputs], tmp_path / "o.parquet", "--stats-json", stats)  # the rerun on this machine
    assert again.exit_code == 0, again.output
    counts = json.loads(stats.read_text())["counts"]
    assert counts["reused"] > 0 and counts["run"] < 20, counts  # what the stopped job committed, kept
    assert [row["error"] for row in pq.read_table(tmp_path / "o.parquet").to_pylist()] == [None] * 20
    assert [key for key in keys_in(s3) if "segments/" in key]
