"""What a store in a bucket says of itself and what a job checks before it computes, in process
against an obstore MemoryStore (tests/support/remote_stores.py `served_memory`): `checkpoint info` from
the manifest and the key index (store.RemoteCheckpoint.info, _failed_rows), the dtype of its
states (bucket_hidden_dtype), `--restart` (_restarted), the write probe (probe_store) and the
refusal of a prefix that holds something else (check_prefix, layout.own_name). Each expected
value is read from the bucket's objects or counted from the records committed."""

from __future__ import annotations

import json
import re

import obstore
import pytest
import torch
from obstore.exceptions import PermissionDeniedError

from clef_cli.errors import ClefError, UsageError
from clef_cli.locations.object_store import ObjectStoreError
from clef_cli.store.hidden_store import FORMAT_KEY, HIDDEN_FORMAT_VERSION, RECORDS_KEY, HiddenPayload
from clef_cli.store.remote import manifests
from clef_cli.store.remote import store as remote_store
from clef_cli.store.remote.layout import MANIFESTS, SEGMENTS, cache_folder, manifest_name, own_name

from .support.remote_stores import (
    FINGERPRINT,
    OTHER_MODEL,
    commit,
    fresh_machine,
    machine,
    night,
    open_machine,
    results,
)

PREFIX = "nightly/"
STORE = f"s3://clef-memory/{PREFIX}"
FAILED = {1, 7}
"""Records committed failed for good among 0..9 (their rows have no states)."""


def names(store, under: str = "") -> list[str]:
    return sorted(item["path"] for page in obstore.list(store, PREFIX + under) for item in page)


def sizes(store, suffix: str) -> int:
    """Bytes of the bucket's segment objects whose name ends with `suffix`."""
    listed = [item for page in obstore.list(store, PREFIX + SEGMENTS) for item in page]
    return sum(item["size"] for item in listed if item["path"].endswith(suffix))


def with_states_and_failures(checkpoint) -> None:
    """Records 0..9 with states in shards of 5 (1 and 7 failed for good), 10..12 without states."""
    commit(checkpoint, range(0, 10), per_shard=5, with_hidden=True, failed_for_good=FAILED)
    commit(checkpoint, range(10, 13), per_shard=5)


# ---------------------------------------------------------------- checkpoint info


def test_info_of_a_writer_before_its_first_sync_counts_its_own_shards_and_no_manifest(memory, tmp_path):
    """A store with no manifest yet: sizes, segments and manifest are 0 (not read off a manifest),
    the keys with states are the shards' rows without an error, read from the cache's disk."""
    writer = open_machine(STORE, tmp_path / "a")
    with_states_and_failures(writer)
    info = writer.info()
    expected = {
        "path": STORE,
        "keys": 13,
        "shards": 3,
        "shards_with_hidden_states": 2,
        "keys_with_hidden_states": 10 - len(FAILED),
        "size_bytes": 0,
        "results_bytes": 0,
        "hidden_bytes": 0,
        "segments": 0,
        "manifest": 0,
        "cache": str(cache_folder(STORE, tmp_path / "a")),
        "model": FINGERPRINT["model"],
    }
    assert {name: info[name] for name in expected} == expected
    assert writer._failed_rows(next(e for e in writer.entries if e.has_hidden)) == {1}  # record 1: row 1 of 0..4
    writer.close()


def test_info_of_a_fresh_machine_reads_sizes_from_the_manifest_and_failures_from_the_parts(memory, tmp_path):
    """After the sync a machine that never saw the store counts the same keys with states from
    the parts' error lists (no part downloaded), and its sizes are the bucket objects' sizes."""
    writer = open_machine(STORE, tmp_path / "a")
    with_states_and_failures(writer)
    writer.sync()
    writer.close()
    manifest_seq = len(names(memory, MANIFESTS))
    with fresh_machine(STORE, tmp_path / "b") as reader:
        info = reader.info()
        remote = [entry for entry in reader.entries if entry.has_hidden]
        assert [reader._failed_rows(entry) for entry in remote] == [{1}, {2}]  # records 1 and 7
        assert all(not (reader.path / "shards" / e.files["results"]["name"]).exists() for e in reader.entries)
    keys_bytes, results_bytes = sizes(memory, ".keys"), sizes(memory, ".results")
    hidden_bytes = sizes(memory, ".hidden")
    assert hidden_bytes > 0 and results_bytes > 0 and keys_bytes > 0
    expected = {
        "keys": 13,
        "shards": 3,
        "shards_with_hidden_states": 2,
        "keys_with_hidden_states": 10 - len(FAILED),
        "size_bytes": keys_bytes + results_bytes + hidden_bytes,
        "results_bytes": results_bytes,
        "hidden_bytes": hidden_bytes,
        "segments": 1,
        "manifest": manifest_seq,
        "cache": str(cache_folder(STORE, tmp_path / "b")),
    }
    assert manifest_seq == 1 and {name: info[name] for name in expected} == expected


def test_info_names_the_last_user_of_each_key_from_the_runs_lists_not_the_computing_run(memory, tmp_path):
    """Run 1 computes and uses 0..9, run 2 uses 5..19 and computes 10..19: run 2 is the last user
    of 15 keys though it computed 10 (what the key index alone would say)."""
    first = open_machine(STORE, tmp_path / "a")
    night(first, range(0, 10), range(0, 10))
    first.close()
    second = open_machine(STORE, tmp_path / "b")
    night(second, range(5, 20), range(10, 20))
    second.close()
    with fresh_machine(STORE, tmp_path / "r") as reader:
        runs = reader.info()["runs"]
    assert [run["counts"] for run in runs] == [{"run": 10, "reused": 0}, {"run": 10, "reused": 5}]
    assert [run["keys_last_used"] for run in runs] == [5, 15]


def test_failed_rows_of_a_part_without_an_error_list_are_none(memory, tmp_path):
    """A part's `errors` may be absent or empty (a manifest of before the list): no failed row."""
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 3), with_hidden=True)
    writer.sync()
    writer.close()
    with fresh_machine(STORE, tmp_path / "b") as reader:
        (entry,) = reader.entries
        assert entry.remote["errors"] == [] and reader._failed_rows(entry) == set()
        entry.remote.pop("errors")
        assert reader._failed_rows(entry) == set()
        entry.remote["errors"] = ["2", 0]
        assert reader._failed_rows(entry) == {0, 2}


# ---------------------------------------------------------------- the states' dtype


def bf16_states(numbers) -> HiddenPayload:
    tensors, described = {}, []
    for number in numbers:
        tensors[f"hidden.{number}"] = torch.full((3, 4), float(number), dtype=torch.bfloat16)
        tensors[f"input_ids.{number}"] = torch.tensor([1, 2, 3], dtype=torch.int32)
        described.append(
            {"index": number, "id": f"r{number}", "prompt_tokens": 3, "state_tokens_cut": 0, "questions": []}
        )
    return HiddenPayload(tensors, {FORMAT_KEY: str(HIDDEN_FORMAT_VERSION), RECORDS_KEY: json.dumps(described)})


def test_the_buckets_states_dtype_is_read_from_its_first_hidden_object(memory, tmp_path):
    """None with no store and with a store of no states; else the dtype its hidden object's
    header names (bfloat16 here, not the float32 a default would say)."""
    assert remote_store.bucket_hidden_dtype(STORE) is None
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 4))
    writer.sync()
    assert remote_store.bucket_hidden_dtype(STORE) is None  # a segment without states
    writer.commit(results(range(4, 8)), bf16_states(range(4, 8)))
    writer.sync()
    writer.close()
    (hidden,) = [name for name in names(memory, SEGMENTS) if name.endswith(".hidden")]
    header = bytes(obstore.get_range(memory, hidden, start=0, end=8))
    length = int.from_bytes(header, "little")
    dtype = json.loads(bytes(obstore.get_range(memory, hidden, start=8, end=8 + length)))["hidden.4"]["dtype"]
    assert dtype == "BF16"
    manifests.forget()
    assert remote_store.bucket_hidden_dtype(STORE) == "bfloat16"


# ---------------------------------------------------------------- --restart


def test_a_restart_commits_a_manifest_naming_nothing_with_the_new_fingerprint(memory, tmp_path):
    """`--restart` with another model: the next manifest names no segment and the new model;
    the cache is emptied, the old objects stay for prune."""
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 6), per_shard=3)
    writer.close()
    before = names(memory, SEGMENTS)
    manifests.forget()
    restarted = remote_store.RemoteCheckpoint.open_remote(
        machine(STORE, tmp_path / "a"), OTHER_MODEL, restart=True, sync_every=None
    )
    try:
        assert restarted.index.count() == 0 and restarted.entries == []
    finally:
        restarted.close()
    assert names(memory, MANIFESTS) == [PREFIX + manifest_name(n) for n in (1, 2)]
    body = json.loads(bytes(obstore.get(memory, PREFIX + manifest_name(2)).bytes()))
    assert body["segments"] == {} and body["fingerprint"]["model"] == OTHER_MODEL["model"]
    assert names(memory, SEGMENTS) == before
    with fresh_machine(STORE, tmp_path / "b", manifest=OTHER_MODEL) as reader:
        assert reader.index.count() == 0 and reader.chain.known.seq == 2


def test_a_restart_on_an_empty_store_and_one_under_a_claim(memory, monkeypatch, tmp_path):
    """On no store: manifest 1, naming nothing. Under a prune's claim: refused, saying whose,
    and nothing committed."""
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")
    chain = manifests.Chain(STORE)
    made = remote_store._restarted(chain, FINGERPRINT)
    assert made.seq == 1 and made.segments == {} and made.fingerprint == FINGERPRINT
    assert names(memory, MANIFESTS) == [PREFIX + manifest_name(1)]
    chain.commit(lambda base: manifests.Manifest(0, base.fingerprint, claim=manifests.new_claim("prune")), fresh=True)
    claim = chain.latest().claim
    with pytest.raises(ClefError) as refused:
        remote_store._restarted(manifests.Chain(STORE), OTHER_MODEL)
    said = str(refused.value)
    start = f"the store {STORE} is held by a `clef checkpoint prune` (pid {claim['pid']} on host {claim['host']})"
    assert said.startswith(start) and said.endswith(" s more; --restart waits for no claim: rerun after it")
    assert names(memory, MANIFESTS) == [PREFIX + manifest_name(n) for n in (1, 2)]


# ---------------------------------------------------------------- the write probe


@pytest.fixture
def credentials(monkeypatch):
    """Keys in the environment, so that a refusal reads as one ("access denied"), not as none."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIATESTTESTTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")


def watched(monkeypatch, refuse: str = ""):
    """obstore's put, list and delete as the bucket answers them, recorded ((call, key, mode));
    the call named by `refuse` refused (403) when it reaches a probe object."""
    calls = []
    real = {name: getattr(obstore, name) for name in ("put", "list", "delete")}

    def wrapped(name):
        def call(store, key, *args, **kwargs):
            calls.append((name, key, kwargs.get("mode")))
            if name == refuse and ".clef-probe-" in key:
                raise PermissionDeniedError("AccessDenied: 403 not for these credentials")
            return real[name](store, key, *args, **kwargs)

        return call

    for name in real:
        monkeypatch.setattr(obstore, name, wrapped(name))
    return calls


def test_the_probe_puts_twice_conditionally_lists_and_deletes_one_probe_object(memory, monkeypatch, credentials):
    """A bucket that allows it all: one probe object, named as a store names it, put where none
    is, put again (refused), listed, deleted; nothing left."""
    calls = watched(monkeypatch)
    assert remote_store.probe_store(manifests.Chain(STORE)) is None
    keys = {key for _, key, _ in calls}
    (probe,) = keys
    assert re.fullmatch(re.escape(PREFIX) + r"\.clef-probe-[0-9a-f]{12}", probe) and own_name(probe[len(PREFIX) :])
    steps = [(name, mode) for name, _, mode in calls]
    assert steps == [("put", "create"), ("put", "create"), ("list", None), ("delete", None)]
    assert names(memory) == []


@pytest.mark.parametrize(
    ("refuse", "step"), [("put", "a conditional write"), ("list", "a listing")], ids=["put", "list"]
)
def test_a_refused_write_or_listing_ends_the_job_naming_the_step_and_leaves_nothing(
    memory, monkeypatch, credentials, refuse, step
):
    watched(monkeypatch, refuse)
    with pytest.raises(ObjectStoreError) as refused:
        remote_store.probe_store(manifests.Chain(STORE), "--store")
    words = f"the bucket refused {step} with these credentials (access denied)"
    assert str(refused.value) == f"--store {STORE}: {words}" and refused.value.words == words
    assert names(memory) == []


def test_a_refused_delete_ends_the_job_and_names_the_probe_object_left(memory, monkeypatch, credentials):
    """A role that may put but not delete cannot prune or compact: refused too (strict), and the
    object left there is named, as the bucket lists it."""
    watched(monkeypatch, "delete")
    with pytest.raises(ObjectStoreError) as refused:
        remote_store.probe_store(manifests.Chain(STORE))
    (left,) = names(memory)
    words = (
        "the bucket refused a delete with these credentials (access denied); "
        f"its probe object s3://clef-memory/{left} is left there"
    )
    assert str(refused.value) == f"--checkpoint {STORE}: {words}" and refused.value.words == words


def test_a_bucket_that_ignores_conditional_writes_is_refused(memory, monkeypatch, credentials):
    """Two writers could commit one manifest: said so, and the probe is deleted."""
    real = obstore.put
    monkeypatch.setattr(obstore, "put", lambda store, key, data, mode=None, **kw: real(store, key, data, **kw))
    with pytest.raises(ObjectStoreError) as refused:
        remote_store.probe_store(manifests.Chain(STORE))
    words = "the bucket ignores conditional writes (If-None-Match: *), on which the store's commits rely"
    assert str(refused.value) == f"--checkpoint {STORE}: {words}" and refused.value.words == words
    assert names(memory) == []


# ---------------------------------------------------------------- a prefix of something else


def test_a_prefix_holding_other_objects_is_refused_naming_them_and_one_of_a_killed_sync_is_not(memory, tmp_path):
    """Strangers (a file, another tool's runs/) refuse the prefix, the first three named; a
    prefix holding only what a killed first sync left (segments, a probe) opens."""
    segment = f"{SEGMENTS}{'a' * 32}.keys"
    for name in (segment, f".clef-probe-{'0' * 12}"):
        obstore.put(memory, PREFIX + name, b"x")
    open_machine(STORE, tmp_path / "a").close()
    for name in ("notes.txt", "runs/report.csv", f"{SEGMENTS}{'a' * 31}.keys", f"{MANIFESTS}1.json"):
        obstore.put(memory, PREFIX + name, b"x")
    manifests.forget()
    with pytest.raises(UsageError) as refused:
        open_machine(STORE, tmp_path / "b")
    said = re.fullmatch(
        rf"--checkpoint {re.escape(STORE)} holds objects that are not a clef store \((.*) \.\.\.\): "
        "give an empty prefix or a store's",
        str(refused.value),
    )
    strangers = {"notes.txt", "runs/report.csv", f"{SEGMENTS}{'a' * 31}.keys", f"{MANIFESTS}1.json"}
    shown = said.group(1).split(", ")
    assert len(set(shown)) == 3 and set(shown) < strangers  # three of the four, none of the store's own
