"""Issue 56.10: one quick test for each planted bug that once survived every test (a hand
mutation audit), each shown failing with its one-line bug planted: a damaged bucket object, the
last sync of a failing job, a store restarted under a writer, two claimers, a compaction's part
numbers, prune's grace period, credentials in messages, a session token, a line one byte over
the limit, an empty mapped cell, an empty input through the library, a Ctrl-C outside a
command, and the output preflight's probe beside (never on) yesterday's output."""

from __future__ import annotations

import io
import os
import signal
import time
from dataclasses import replace

import pytest

from clef_cli.store.remote import manifests

from .support.remote_stores import OTHER_MODEL, commit, fresh_machine, key_of, open_machine

BUCKET = "clef-survivors"
STORE = f"s3://{BUCKET}/nightly/"


@pytest.fixture
def s3(store_bucket):
    return store_bucket


def stored_keys(checkpoint) -> set[str]:
    with checkpoint.index.lock:
        return {row[0] for row in checkpoint.index.db.execute("SELECT key FROM keys WHERE final = 1")}


def bucket_objects(client, under: str = "") -> dict[str, int]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=under)
    return {item["Key"]: item["Size"] for page in pages for item in page.get("Contents", [])}


# ---------------------------------------------------------------- the store in a bucket


def test_a_damaged_results_object_is_refused_not_read_as_good(s3, tmp_path):
    """One byte of a segment's results object changed in the bucket (its size the same, its
    Arrow still readable): a fresh machine's read names the object instead of using it."""
    from clef_cli.store.remote.segments import DamagedObject

    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 20))
    writer.close()
    [name] = [key for key in bucket_objects(s3, "nightly/") if key.endswith(".results")]
    data = bytearray(s3.get_object(Bucket=BUCKET, Key=name)["Body"].read())
    spot = data.find(b"the store kept failing") if b"the store kept failing" in data else data.find(b"r1")
    assert spot > 0
    data[spot] ^= 0x01  # a changed character of a string value
    s3.put_object(Bucket=BUCKET, Key=name, Body=bytes(data))
    with fresh_machine(STORE, tmp_path / "b") as reader:
        shard, _ = reader.index.locate([key_of(3)])[key_of(3)]
        with pytest.raises(DamagedObject, match=r"damaged|does not hold"):
            reader.shard_table(shard)


def test_each_part_cut_from_a_results_object_is_checked_against_its_sha256():
    """`split_results` itself (the object's own name is checked first where it is read whole):
    a part whose bytes are not its SHA-256's is refused, the parts before it given."""
    import hashlib

    from clef_cli.store.remote.segments import DamagedObject, Part, split_results

    data = b"first part|second part"
    good = Part(1, "run", (0, 10, hashlib.sha256(data[:10]).hexdigest()), None)
    bad = Part(1, "run", (11, 11, hashlib.sha256(b"other bytes").hexdigest()), None)
    pieces = split_results(io.BytesIO(data), [good, bad], "s3://b/x.results")
    assert next(pieces) == b"first part"
    with pytest.raises(DamagedObject, match=r"s3://b/x\.results"):
        next(pieces)


def test_a_failing_jobs_close_still_makes_its_last_sync(s3, tmp_path):
    """`close(quiet=True)` is how a failed or Ctrl-C'd job ends: what it committed since its
    last sync still reaches the bucket (only a failure of that sync is kept quiet)."""
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 10))
    writer.sync()
    commit(writer, range(10, 25))
    writer.close(quiet=True)
    with fresh_machine(STORE, tmp_path / "b") as reader:
        assert stored_keys(reader) == {key_of(n) for n in range(25)}


def test_a_store_restarted_with_another_model_under_a_writer_refuses_its_sync(s3, tmp_path):
    """Another job restarted the store with another model after this writer opened it: the
    writer's next sync is refused, never merged into the other model's store."""
    from clef_cli.errors import ClefError

    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 10))
    writer.sync()
    manifests.Chain(STORE).commit(lambda base: replace(base, fingerprint=OTHER_MODEL, segments={}, runs={}))
    commit(writer, range(10, 20))
    with pytest.raises(ClefError, match="restarted by another job with another model"):
        writer.sync()
    writer.close(quiet=True)


def test_a_second_claimer_is_refused_while_the_first_claim_holds(s3, tmp_path):
    """Two claimers at once (a prune and a compaction): the second is refused while the first
    holds, and the store is free once the first released it."""
    from clef_cli.store.remote.compaction import Held, claimed

    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 10))
    writer.close()
    with claimed(manifests.Chain(STORE), "prune") as (_, first):
        with (
            pytest.raises(Held, match="held by a `clef checkpoint prune`"),
            claimed(manifests.Chain(STORE), "compaction"),
        ):
            pass
        assert manifests.Chain(STORE).latest().claim["token"] == first["token"]
    with claimed(manifests.Chain(STORE), "compaction") as (_, second):
        assert second["token"] != first["token"]


def test_a_compacted_segment_points_every_key_at_its_own_row(s3, tmp_path):
    """After a full level is merged, each key's (shard, row) holds that key's own result (not
    only the same set of keys)."""
    from clef_cli.store.remote.compaction import FANOUT

    writer = open_machine(STORE, tmp_path / "a")
    for night in range(FANOUT):
        commit(writer, range(night * 10, night * 10 + 10), per_shard=5)
        writer.sync()
    writer.close()  # a full level: merged
    with fresh_machine(STORE, tmp_path / "b") as reader:
        assert [segment.level for segment in reader.chain.known.segments.values()] == [1]
        keys = [key_of(n) for n in range(FANOUT * 10)]
        for key, (shard, row) in reader.index.locate(keys).items():
            assert reader.shard_table(shard).column("record_key")[row].as_py() == key


def test_prunes_grace_period_is_in_hours(s3, tmp_path):
    """`--grace-hours 0.01` keeps an orphan uploaded a moment ago (36 s of grace, not 0.01 s);
    0 deletes it."""
    from clef_cli.store.opening import prune_store

    from .support.remote_stores import machine, night

    writer = open_machine(STORE, tmp_path / "a")
    night(writer, range(0, 10), range(0, 10))
    writer.close()
    orphan = f"nightly/segments/{'0' * 16}.results"
    s3.put_object(Bucket=BUCKET, Key=orphan, Body=b"left by a killed writer")
    location = machine(STORE, tmp_path / "p")
    kept = prune_store(location, keep_runs=1, grace_hours=0.01, no_running_jobs=True)
    assert kept.objects_deleted == 0 and orphan in bucket_objects(s3)
    swept = prune_store(location, keep_runs=1, grace_hours=0, no_running_jobs=True)
    assert swept.objects_deleted == 1 and orphan not in bucket_objects(s3)


# ---------------------------------------------------------------- locations


@pytest.mark.parametrize("secret", ["se@cret", "se cret", "se'cret", 'se"cret'], ids=["at", "space", "quote", "dquote"])
def test_a_secret_with_an_at_a_space_or_a_quote_is_never_shown(secret):
    from clef_cli.locations.uris import masked, shown

    for uri in (f"s3://KEY:{secret}@bucket/a.png", f"abfs://box:{secret}@acct/a.png"):
        for text in (masked(uri), shown(uri)):
            assert "cret" not in text and text.endswith("***@" + uri.rpartition("@")[2])
    assert "cret" not in masked("input s3://KEY:se@cret@bucket/a.png not found")  # in a message's text


def test_a_session_token_goes_with_the_keys():
    """Temporary credentials: the key, the secret and the session token, from the environment
    or from the profile's file."""
    from clef_cli.locations.buckets import aws_config

    found = aws_config({"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_SESSION_TOKEN": "TOK"})
    assert (found["access_key_id"], found["secret_access_key"], found["token"]) == ("AK", "SK", "TOK")


def test_the_output_preflight_probes_beside_yesterdays_output_never_on_it(s3):
    """A rerun's `-o` names yesterday's output: the preflight's write probe goes beside it and is
    removed; yesterday's output is the same object after it."""
    from clef_cli.locations.uploads import check_writable

    s3.put_object(Bucket=BUCKET, Key="out/scores.parquet", Body=b"yesterday's scores")
    check_writable(f"s3://{BUCKET}/out/scores.parquet", "-o")
    assert bucket_objects(s3) == {"out/scores.parquet": len(b"yesterday's scores")}
    body = s3.get_object(Bucket=BUCKET, Key="out/scores.parquet")["Body"].read()
    assert body == b"yesterday's scores"


# ---------------------------------------------------------------- inputs


@pytest.mark.parametrize("newline", [b"\n", b""], ids=["newline", "at-end"])
def test_a_line_one_byte_over_the_limit_is_oversize_and_one_at_it_is_read(newline):
    from clef_cli.inputs.record_size import Oversize, bounded_lines

    limit = 16
    fits, over = b"a" * limit + newline, b"b" * (limit + 1) + newline
    assert list(bounded_lines(io.BytesIO(fits), limit)) == [fits]
    found = list(bounded_lines(io.BytesIO(over + fits if newline else over), limit))
    assert found == [Oversize(limit + 1 + len(newline)), *([fits] if newline else [])]


def test_an_empty_mapped_cell_is_an_empty_field_not_a_missing_one():
    from clef_cli.inputs.columns import ColumnMapping

    mapping = ColumnMapping((("state", "body"), ("id", "ticket")), ())
    row = mapping.apply({"body": "", "ticket": "T-1", "extra": 0}, "T-1")
    assert row["state"] == "" and row["id"] == "T-1"
    assert "state" not in mapping.apply({"ticket": "T-1", "state": "not the mapped column"}, "T-1")


def test_a_library_caller_with_an_empty_input_is_refused_and_writes_nothing(tmp_path):
    """ScoreSettings' default is the CLI's: an empty input is refused, no 0-row output written."""
    from clef_cli.engines.local.pipeline import ScoreJob
    from clef_cli.errors import UsageError

    from .support.helpers import settings_for

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    settings = settings_for(tmp_path, [empty])
    assert settings.allow_empty is False
    with pytest.raises(UsageError, match="--allow-empty"):
        ScoreJob(settings).run()
    assert not (tmp_path / "out.parquet").exists()


# ---------------------------------------------------------------- Ctrl-C


def test_a_ctrl_c_outside_a_command_ends_the_process_130():
    """The console script's handler, before or after its command (parsing, teardown): a Ctrl-C
    ends the process 130 at once, saying so. Run in a fork of this process (its `os._exit`)."""
    from clef_cli.cli.stopping import EXIT_INTERRUPTED, SECOND, StopRequests

    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # the child: never returns into pytest
        try:
            os.dup2(writing, 2)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            StopRequests().install_for_process()
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        finally:
            os._exit(7)
    os.close(writing)
    _, status = os.waitpid(child, 0)
    with os.fdopen(reading, "rb") as said:
        text = said.read().decode()
    assert os.waitstatus_to_exitcode(status) == EXIT_INTERRUPTED, text
    assert SECOND in text
