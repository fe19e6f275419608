"""The store in a bucket (store/remote/) in process, its bucket an obstore `MemoryStore` served
for `s3://clef-memory` (`buckets.serve_from`): the same client, the same code paths as against
moto, no server and no model, so each test takes well under a second and every mutant of
store/remote/ can be tried (docs/development.md, "Mutation testing"). The bucket's clock is the
real one (the MemoryStore's `Last-Modified`); the writers' clock is skewed where a claim is tested."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import obstore
import pytest

from clef_cli.errors import ClefError
from clef_cli.locations import buckets, object_store
from clef_cli.store.ledger import Ledger
from clef_cli.store.remote import compaction, damage, manifests, pruning, segments
from clef_cli.store.remote.layout import LATEST, MANIFESTS, SEGMENTS, manifest_name

from .support.remote_stores import Skewed, commit, fresh_machine, key_of, night, open_machine, reversed_rows

ROOT = "s3://clef-memory"
PREFIX = "nightly/"
STORE = f"{ROOT}/{PREFIX}"
DAY = 86400.0


def objects(store, under: str = "") -> list[str]:
    return sorted(item["path"] for page in obstore.list(store, PREFIX + under) for item in page)


def write(path, data: bytes):
    path.write_bytes(data)
    return path


def read(store, key: str) -> bytes:
    return bytes(obstore.get(store, key).bytes())


def parts_of(store, segment, folder) -> list:
    """The parts the segment's keys object lists."""
    target = folder / f"{segment.id}.keys"
    target.write_bytes(read(store, PREFIX + segment.keys))
    return segments.read_parts(target)


def stored_keys(checkpoint) -> set[str]:
    with checkpoint.index.lock:
        return {row[0] for row in checkpoint.index.db.execute("SELECT key FROM keys WHERE final = 1")}


def keys(numbers) -> set[str]:
    return {key_of(n) for n in numbers}


def latest(store) -> dict:
    return json.loads(read(store, objects(store, MANIFESTS)[-1]))


def nights(tmp_path, count: int, size: int = 10, hidden: bool = False, name: str = "w") -> None:
    """`count` syncs of one writer: `count` segments of `size` records, the records numbered on."""
    writer = open_machine(STORE, tmp_path / name)
    for number in range(count):
        commit(writer, range(number * size, number * size + size), per_shard=5, with_hidden=hidden)
        writer.sync()
    writer.syncer.close()
    writer.syncer = None  # no compaction at its end
    writer.close()


# ---------------------------------------------------------------- the seam


def test_the_served_bucket_is_the_client_every_chain_gets_and_a_conditional_put_conflicts(memory):
    bucket = buckets.bucket(STORE)
    assert bucket.store is memory and buckets.bucket(STORE, quick=True) is bucket
    bucket.put("nightly/a", b"one", create=True)
    with pytest.raises(buckets.WriteConflict):
        bucket.put("nightly/a", b"two", create=True)
    assert bucket.get("nightly/a") == b"one" and bucket.get_range("nightly/a", 1, 3) == b"ne"
    assert bucket.head("nightly/a").size == 3 and abs(bucket.head("nightly/a").modified - time.time()) < 60
    with pytest.raises(object_store.MissingObject):
        bucket.get("nightly/b")
    bucket.delete("nightly/a")
    bucket.delete("nightly/a")  # gone already: no error
    assert objects(memory) == []
    buckets.serve_from(ROOT, None)
    assert buckets.bucket(STORE).store is not memory  # back to a client of the environment


# ---------------------------------------------------------------- segments, manifests, syncs


def test_a_store_is_opened_committed_synced_and_read_by_a_fresh_machine(memory, tmp_path):
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 30), per_shard=10, with_hidden=True)
    assert writer.syncer.sync().seq == 1
    assert writer.syncer.sync() is None  # nothing new: no manifest
    writer.close()
    names = objects(memory)
    assert f"{PREFIX}{manifest_name(1)}" in names and f"{PREFIX}{LATEST}" in names
    assert sum(name.startswith(PREFIX + SEGMENTS) for name in names) == 3  # keys, results, hidden
    with fresh_machine(STORE, tmp_path / "b") as reader:
        assert stored_keys(reader) == keys(range(30))
        (segment,) = reader.chain.known.segments.values()
        assert segment.records == 30 and segment.parts == 3 and len(segment.hidden) == 1
        parts = parts_of(memory, segment, tmp_path)
        assert [part.records for part in parts] == [10, 10, 10] and all(part.hidden for part in parts)
        assert [part.results[0] for part in parts] == [0, parts[0].results[1], sum(p.results[1] for p in parts[:2])]
        assert sum(part.results[1] for part in parts) == segment.results_bytes
        shard, row = reader.index.locate([key_of(17)])[key_of(17)]
        table = reader.shard_table(shard)
        assert table.column("record_key")[row].as_py() == key_of(17)
        assert table.column("record_index")[row].as_py() == 17
        states = [s for s in reader.hidden_shards() if s.path.name.startswith(shard)]
        assert len(states) == 1 and states[0].verify()


def test_segments_are_named_by_their_content(memory, tmp_path):
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 20), per_shard=10)
    writer.close()
    names = objects(memory, SEGMENTS)
    assert len(names) == 2
    for name in names:
        suffix = name.rsplit(".", 1)[1]
        assert name == PREFIX + segments.content_name(read(memory, name), suffix)
        assert segments.named_by(write(tmp_path / suffix, read(memory, name)), name)
        assert not segments.named_by(write(tmp_path / suffix, read(memory, name) + b"x"), name)
    (segment,) = manifests.Chain(STORE).latest().segments.values()
    assert PREFIX + segment.keys in names and PREFIX + segment.results in names and segment.hidden == ()


def test_two_writers_merge_and_never_overwrite_a_manifest(memory, tmp_path):
    writer = open_machine(STORE, tmp_path / "one")
    commit(writer, range(0, 10))
    writer.close()  # manifest 1
    first = open_machine(STORE, tmp_path / "one")
    second = open_machine(STORE, tmp_path / "two")
    commit(first, range(10, 20))
    commit(second, range(100, 110))
    assert first.syncer.sync().seq == 2
    assert second.syncer.sync().seq == 3  # 412 on 2: read it, merged, 3
    first.close()
    second.close()
    assert objects(memory, MANIFESTS) == [PREFIX + manifest_name(n) for n in (1, 2, 3)]
    with fresh_machine(STORE, tmp_path / "three") as reader:
        assert stored_keys(reader) == keys([*range(0, 20), *range(100, 110)])
        assert len(reader.chain.known.segments) == 3 and reader.chain.known.seq == 3


def test_a_reader_finds_the_latest_manifest_past_the_hint_and_after_its_manifests_are_pruned(memory, tmp_path):
    nights(tmp_path, manifests.HINT_EVERY + 3, size=2)
    assert json.loads(read(memory, PREFIX + LATEST))["seq"] == manifests.HINT_EVERY + 1
    manifests.forget()
    chain = manifests.Chain(STORE)
    assert chain.latest().seq == manifests.HINT_EVERY + 3 and chain.latest() is chain.known
    for seq in range(1, manifests.HINT_EVERY + 2):  # the hinted one gone: every manifest listed
        obstore.delete(memory, PREFIX + manifest_name(seq))
    manifests.forget()
    found = manifests.Chain(STORE).latest()
    assert found.seq == manifests.HINT_EVERY + 3 and found.modified > 0
    assert found.total("records") == 2 * (manifests.HINT_EVERY + 3)
    obstore.put(memory, PREFIX + LATEST, b"{not json")  # a damaged hint: listed from the start
    manifests.forget()
    assert manifests.Chain(STORE).latest().seq == manifests.HINT_EVERY + 3


def test_an_empty_store_has_no_manifest_and_a_foreign_manifest_is_refused(memory, tmp_path):
    assert manifests.Chain(STORE).latest() is None
    obstore.put(memory, PREFIX + manifest_name(1), json.dumps({"format": "other"}).encode())
    with pytest.raises(ClefError, match="is unreadable: not a clef store manifest"):
        manifests.Chain(STORE).latest()
    body = {"format": manifests.FORMAT, "version": manifests.VERSION + 1}
    obstore.put(memory, PREFIX + manifest_name(1), json.dumps(body).encode())
    manifests.forget()
    with pytest.raises(ClefError, match=f"has store format {manifests.VERSION + 1}; this clef reads"):
        manifests.Chain(STORE).latest()


def test_an_old_manifest_put_back_on_top_is_an_inconsistent_chain(memory, tmp_path):
    nights(tmp_path, 2, size=3)
    obstore.put(memory, PREFIX + manifest_name(3), read(memory, PREFIX + manifest_name(1)))
    manifests.forget()
    with pytest.raises(manifests.InconsistentChain, match=f"manifest {STORE}{manifest_name(3)} says 1"):
        manifests.Chain(STORE).commit(lambda base: base, fresh=True)


def test_a_commit_that_always_loses_ends_after_its_attempts_and_one_that_went_through_is_known(memory, monkeypatch):
    monkeypatch.setattr(manifests, "COMMIT_ATTEMPTS", 3)
    chain = manifests.Chain(STORE)
    first = chain.commit(lambda base: manifests.Manifest(0, {"f": 1}))
    assert first.seq == 1 and chain.known is first
    other = manifests.Chain(STORE)
    tries = []

    def always_second(base):
        tries.append(base.seq)
        other.commit(lambda latest: replace(latest, runs=latest.runs | {str(len(tries)): {}}), fresh=True)
        return base

    with pytest.raises(ClefError, match="other writers committed first at each of 3 tries"):
        chain.commit(always_second)
    assert tries == [1, 2, 3]
    assert chain.commit(lambda base: None) is None and objects(memory, MANIFESTS)[-1].endswith(manifest_name(4))


def test_a_killed_sync_loses_nothing_committed(memory, monkeypatch, tmp_path):
    from clef_cli import faults

    class Killed(BaseException):
        pass

    def kill(point):
        if point == "segment-uploaded":
            raise Killed

    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 10))
    writer.sync()
    commit(writer, range(10, 20))
    with monkeypatch.context() as patched, pytest.raises(Killed):
        patched.setattr(faults, "pause_at", kill)
        writer.sync()
    writer.syncer.stop.set()
    writer.syncer = None
    writer.index.close()
    writer.held.release()
    with fresh_machine(STORE, tmp_path / "b") as reader:
        assert stored_keys(reader) == keys(range(10))
    again = open_machine(STORE, tmp_path / "a")  # the same machine: its cache settles the sync
    assert stored_keys(again) == keys(range(20))
    again.close()
    with fresh_machine(STORE, tmp_path / "c") as reader:
        assert stored_keys(reader) == keys(range(20)) and len(reader.chain.known.segments) == 2


# ---------------------------------------------------------------- compaction


def test_a_full_level_is_merged_into_one_segment_whose_parts_keep_every_row(memory, tmp_path):
    nights(tmp_path, compaction.FANOUT, size=10, hidden=True)
    chain = manifests.Chain(STORE)
    before = chain.latest()
    assert [s.id for s in compaction.due(before)] == list(before.segments)[: compaction.FANOUT]
    merged = compaction.compact(chain)
    assert merged is not None and merged.claim is None and len(merged.segments) == 1
    (segment,) = merged.segments.values()
    assert segment.level == 1 and segment.records == compaction.FANOUT * 10
    assert segment.parts == 2 * compaction.FANOUT and len(segment.hidden) == compaction.FANOUT  # named, not copied
    parts = parts_of(memory, segment, tmp_path)
    assert [part.records for part in parts] == [5] * 2 * compaction.FANOUT
    offsets = [part.results[0] for part in parts]
    assert offsets == sorted(offsets) and offsets[0] == 0 and len(set(offsets)) == len(offsets)
    assert offsets[-1] + parts[-1].results[1] == segment.results_bytes
    assert compaction.compact(chain) is None  # nothing due now
    with fresh_machine(STORE, tmp_path / "r") as reader:
        assert stored_keys(reader) == keys(range(compaction.FANOUT * 10))
        for number in (0, 13, compaction.FANOUT * 10 - 1):
            shard, row = reader.index.locate([key_of(number)])[key_of(number)]
            table = reader.shard_table(shard)
            assert table.column("record_index")[row].as_py() == number
            states = [s for s in reader.hidden_shards() if s.path.name.startswith(shard)]
            assert len(states) == 1 and states[0].verify()


def test_a_level_not_full_is_not_due_and_a_held_store_is_not_compacted(memory, monkeypatch, tmp_path):
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")
    nights(tmp_path, compaction.FANOUT - 1, size=2)
    chain = manifests.Chain(STORE)
    assert compaction.due(chain.latest()) == [] and compaction.compact(chain) is None
    every = lambda manifest: list(manifest.segments.values())  # noqa: E731
    with compaction.claimed(manifests.Chain(STORE), "prune"):
        assert compaction.compact(manifests.Chain(STORE), choose=every) is None
        manifests.forget()
        with pytest.raises(ClefError, match="held by a `clef checkpoint prune`"):
            open_machine(STORE, tmp_path / "b")
    assert manifests.Chain(STORE).latest().claim is None
    assert len(compaction.compact(manifests.Chain(STORE), choose=every).segments) == 1


def test_a_compaction_whose_claim_was_broken_commits_nothing(memory, monkeypatch, tmp_path):
    from clef_cli import faults
    from clef_cli.store.remote.claims import unclaim

    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")
    nights(tmp_path, compaction.FANOUT, size=3)
    pause = faults.pause_at

    def broken(point):
        if point == "compaction-uploaded":
            assert unclaim(STORE, confirm=True)["what"] == "compaction"
        pause(point)

    monkeypatch.setattr(faults, "pause_at", broken)
    assert compaction.compact(manifests.Chain(STORE)) is None
    manifests.forget()
    after = manifests.Chain(STORE).latest()
    assert len(after.segments) == compaction.FANOUT and after.claim is None


# ---------------------------------------------------------------- prune, last users


def test_prune_keeps_what_the_kept_runs_used_and_sweeps_orphans_after_the_grace(memory, tmp_path):
    first = open_machine(STORE, tmp_path / "a")
    night(first, range(0, 30), range(0, 30))
    first.close()
    second = open_machine(STORE, tmp_path / "b")
    night(second, range(10, 40), range(30, 40))
    second.close()
    orphan = f"{PREFIX}{SEGMENTS}{'0' * 64}.keys"
    obstore.put(memory, orphan, b"left by a killed writer")
    before = objects(memory)
    dry = pruning.prune_bucket(STORE, keep_runs=1, dry_run=True, grace_seconds=0, no_running_jobs=True)
    assert (dry.keys_dropped, dry.objects_deleted) == (10, 1) and objects(memory) == before
    kept = pruning.prune_bucket(STORE, keep_runs=1, grace_seconds=3600)
    assert kept.keys_dropped == 10 and kept.objects_deleted == 0 and orphan in objects(memory)
    swept = pruning.prune_bucket(STORE, keep_runs=1, grace_seconds=0, no_running_jobs=True)
    assert swept.keys_dropped == 0 and swept.objects_deleted >= 2 and orphan not in objects(memory)
    with fresh_machine(STORE, tmp_path / "d") as reader:
        assert stored_keys(reader) == keys(range(10, 40)) and reader.chain.known.claim is None
        named = {PREFIX + name for segment in reader.chain.known.segments.values() for name in segment.objects()}
        assert named == set(objects(memory, SEGMENTS))


def test_a_prune_under_the_grace_floor_is_refused_and_one_dropping_every_key_needs_force(memory, tmp_path):
    from clef_cli.errors import UsageError

    with pytest.raises(UsageError, match="holds no clef store"):
        pruning.prune_bucket(STORE, keep_runs=1)
    writer = open_machine(STORE, tmp_path / "a")
    night(writer, range(0, 10), range(0, 10))
    writer.close()
    with pytest.raises(UsageError, match="under the floor"):
        pruning.prune_bucket(STORE, keep_runs=1, grace_seconds=pruning.grace_floor() - 1)
    commit(open_machine(STORE, tmp_path / "b"), range(50, 60))  # keys no run used (closed below)
    manifests.forget()
    report = pruning.prune_bucket(STORE, keep_runs=1, dry_run=True)
    assert report.keys_dropped == 0 and not report.drops_every_key


def test_the_last_users_of_segments_rank_the_runs_that_used_them(memory, tmp_path):
    from clef_cli.store.remote.last_users import in_use_order

    writer = open_machine(STORE, tmp_path / "a")
    night(writer, range(0, 10), range(0, 10))
    writer.close()
    writer = open_machine(STORE, tmp_path / "b")
    night(writer, range(5, 20), range(10, 20))
    writer.close()
    from clef_cli.store.remote.last_users import last_users

    latest = manifests.Chain(STORE).latest()
    order = in_use_order(latest)
    assert sorted(order) == sorted(latest.runs) and len(order) == 2
    assert [latest.runs[run]["started"] for run in order] == sorted(run["started"] for run in latest.runs.values())
    with fresh_machine(STORE, tmp_path / "r") as reader:
        assert last_users(reader) == {order[0]: 5, order[1]: 15}
    report = pruning.prune_bucket(STORE, keep_runs=1, dry_run=True)
    assert report.keys_dropped == 5


# ---------------------------------------------------------------- damage


def two_nights(memory, tmp_path) -> dict[str, str]:
    writer = open_machine(STORE, tmp_path / "writer")
    commit(writer, range(0, 8), per_shard=4, with_hidden=True)
    writer.sync()
    first = objects(memory, SEGMENTS)
    commit(writer, range(8, 16), per_shard=4, with_hidden=True)
    writer.sync()
    writer.close()
    return {name.rsplit(".", 1)[1]: name for name in first}


@pytest.mark.parametrize("how", ["deleted", "byte", "other"])
@pytest.mark.parametrize("kind", ["keys", "results"])
def test_a_damaged_object_costs_its_records_and_a_verify_and_repair_mend_the_store(memory, tmp_path, kind, how):
    found = two_nights(memory, tmp_path)
    key = found[kind]
    if how == "deleted":
        obstore.delete(memory, key)
    else:
        data = read(memory, key)
        data = (
            reversed_rows(data) if how == "other" and kind == "keys" else data[:-9] + bytes([data[-9] ^ 1]) + data[-8:]
        )
        obstore.put(memory, key, data)
    manifests.forget()
    chain = manifests.Chain(STORE)
    lost = damage.verify(chain, chain.latest(), hashes=True)
    assert len(lost) == 1 and lost[0].records == 8, lost
    dry, checked = damage.repair(STORE, dry_run=True)
    assert dry == lost and checked == 2 and len(manifests.Chain(STORE).latest().segments) == 2
    dead, checked = damage.repair(STORE)
    assert dead == lost and checked == 2
    manifests.forget()
    after = manifests.Chain(STORE).latest()
    assert len(after.segments) == 1 and after.claim is None
    assert damage.verify(manifests.Chain(STORE), after, hashes=True) == []
    with fresh_machine(STORE, tmp_path / "r") as reader:
        assert stored_keys(reader) == keys(range(8, 16))


def test_a_job_sets_aside_a_damaged_segment_and_computes_its_records_again(memory, tmp_path):
    found = two_nights(memory, tmp_path)
    obstore.put(memory, found["keys"], reversed_rows(read(memory, found["keys"])))
    manifests.forget()
    writer = open_machine(STORE, tmp_path / "job")
    writer.begin_run()
    writer.ledger = Ledger(writer.index, writer.run_seq)
    with writer.index.transaction() as db:
        db.executemany("INSERT INTO temp.job VALUES (?, ?, ?, NULL)", [(n, f"r{n}", key_of(n)) for n in range(16)])
    writer.set_aside_damaged()
    assert stored_keys(writer) == keys(range(8, 16))
    commit(writer, range(0, 8), per_shard=4, with_hidden=True)
    writer.close()
    with fresh_machine(STORE, tmp_path / "r") as reader:
        assert stored_keys(reader) == keys(range(16))
        assert found["keys"][len(PREFIX) :] not in {s.keys for s in reader.chain.known.segments.values()}
        for number in (0, 9):
            shard, row = reader.index.locate([key_of(number)])[key_of(number)]
            assert reader.shard_table(shard).column("record_index")[row].as_py() == number


def test_a_manifest_whose_segment_is_not_named_by_its_content_is_refused(memory, tmp_path):
    two_nights(memory, tmp_path)
    key = objects(memory, MANIFESTS)[-1]
    body = json.loads(read(memory, key))
    first = next(iter(body["segments"]))
    body["segments"][first]["results"] = "../../etc/passwd"
    obstore.put(memory, key, json.dumps(body).encode())
    manifests.forget()
    with pytest.raises(ClefError) as refused:
        manifests.Chain(STORE).latest()
    assert "names objects no clef store writes" in str(refused.value) and "\n" not in str(refused.value)


# ---------------------------------------------------------------- claims, by the bucket's clock


@pytest.mark.parametrize("seconds", [+DAY, -DAY], ids=["ahead", "behind"])
def test_a_claim_holds_its_lease_by_the_buckets_clock_whatever_the_writers(memory, monkeypatch, tmp_path, seconds):
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")
    nights(tmp_path, 1, size=3)
    with monkeypatch.context() as skewed:
        skewed.setattr(manifests, "clock", Skewed(seconds).time)
        manifests.Chain(STORE).commit(lambda base: replace(base, claim=manifests.new_claim("prune")), fresh=True)
    manifests.forget()
    chain = manifests.Chain(STORE)
    held = chain.holding(chain.latest())
    assert held is not None and 3590 < held["left"] <= 3600  # not a day more, nor gone
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "0.5")  # the lease is at most this machine's
    assert chain.holding(chain.latest()) is None or chain.holding(chain.latest())["left"] <= 0.5
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")
    manifests.forget()
    chain = manifests.Chain(STORE)
    chain.commit(lambda base: replace(base, claim=base.claim | {"lease": 0}), fresh=True)  # its lease ends
    assert chain.holding(chain.latest()) is None
    open_machine(STORE, tmp_path / "b").close()


def test_unclaim_breaks_a_claim_only_when_confirmed_and_a_released_claim_commits_nothing_more(memory, monkeypatch):
    from clef_cli.errors import UsageError
    from clef_cli.store.remote.claims import claim_said, unclaim

    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")
    with pytest.raises(UsageError, match="holds no clef store"):
        unclaim(STORE, confirm=True)
    chain = manifests.Chain(STORE)
    chain.commit(lambda base: manifests.Manifest(0, {"f": 1}))
    assert unclaim(STORE, confirm=True) is None
    with pytest.raises(compaction.Lapsed), compaction.claimed(manifests.Chain(STORE), "prune") as (base, claim):
        assert base.claim == claim
        with pytest.raises(UsageError, match="add --confirm"):
            unclaim(STORE, confirm=False)
        broken = unclaim(STORE, confirm=True)
        assert broken["token"] == claim["token"] and 3590 < broken["left"] <= 3600
        assert "it holds for" in claim_said(broken, STORE) and "a `clef checkpoint prune`" in claim_said(broken, STORE)
        with pytest.raises(compaction.Lapsed, match="it was broken; nothing committed"):
            compaction.release(manifests.Chain(STORE), claim, lambda latest: latest)
    assert "its lease has run out" in claim_said({"since": 0, "left": 0}, STORE)


# ---------------------------------------------------------------- what a claim and a damage say


def test_a_claim_says_what_holds_the_store_its_process_and_its_lease(memory, monkeypatch):
    import io
    import os
    import socket

    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "60")
    monkeypatch.setattr(manifests, "clock", lambda: 1000.0)
    claim = manifests.new_claim("prune")
    assert len(claim["token"]) == 32 and claim == {
        "what": "prune", "host": socket.gethostname(), "pid": os.getpid(), "token": claim["token"],
        "since": 1000.0, "until": 1060.0, "lease": 60.0,
    }  # fmt: skip
    assert manifests.new_claim("prune")["token"] != claim["token"]
    score = "a compaction at the end of a `clef score` job (pid 7 on host h)"
    assert manifests.holder({"what": "compaction", "pid": 7, "host": "h"}) == score
    assert manifests.holder({}) == "a `clef checkpoint prune` (pid ? on host ?)"
    assert manifests.holder({"what": "repair", "pid": 1, "host": "x"}) == "a `clef checkpoint repair` (pid 1 on host x)"
    line = manifests.claim_line({"what": "prune", "pid": 1, "host": "h", "left": 12.7}, STORE)
    assert line == f"the store {STORE} is held by a `clef checkpoint prune` (pid 1 on host h) for at most 12 s more"
    assert manifests.claim_line({"left": -5}, STORE).endswith("for at most 0 s more")
    assert manifests.claim_line({}, STORE).endswith("for at most 0 s more")
    with pytest.raises(segments.DamagedObject) as refused:
        segments.read_parts(write(memory_file(), b"not arrow"), where="s3://b/k.keys")
    assert refused.value.obj == "s3://b/k.keys" and str(refused.value).startswith("s3://b/k.keys is no keys object")
    made = segments.DamagedObject("m", "o", "s")
    assert (str(made), made.obj, made.segment) == ("m", "o", "s")
    plain = segments.DamagedObject("m")
    assert (plain.obj, plain.segment) == ("", "")
    parts = [segments.Part(1, "r", (0, 3, sha("abc")), None), segments.Part(1, "r", (3, 2, sha("de")), None)]
    assert list(segments.split_results(io.BytesIO(b"abcde"), parts, "w")) == [b"abc", b"de"]
    with pytest.raises(segments.DamagedObject, match=r"^w does not hold the results its segment names"):
        list(segments.split_results(io.BytesIO(b"abcdX"), parts, "w"))


def sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def memory_file():
    import tempfile
    from pathlib import Path

    return Path(tempfile.mkdtemp()) / "k.keys"


def test_the_buckets_time_is_read_once_from_the_hints_last_modified_and_carried_on(memory, monkeypatch):
    chain = manifests.Chain(STORE)
    chain.commit(lambda base: manifests.Manifest(0, {"f": 1}))
    obstore.delete(memory, PREFIX + LATEST)
    before = time.time()
    now = chain.server_now()
    assert json.loads(read(memory, PREFIX + LATEST)) == {"seq": 1} and chain.hinted == 1
    stamp = obstore.head(memory, PREFIX + LATEST)["last_modified"].timestamp()
    assert int(stamp) + 1.0 <= now < int(stamp) + 1.5 and before - 0.01 <= now <= time.time() + 1.01
    obstore.delete(memory, PREFIX + LATEST)
    time.sleep(0.05)
    later = chain.server_now()  # carried on by the monotonic clock: no request
    assert 0.04 < later - now < 1 and PREFIX + LATEST not in objects(memory)
    monkeypatch.setattr(manifests, "ANCHOR_FOR", -1.0)  # read again
    chain.server_now()
    assert PREFIX + LATEST in objects(memory)
    with monkeypatch.context() as skewed:  # this machine's clock a day off moves nothing
        skewed.setattr(manifests, "time", Skewed(DAY))
        assert abs(chain.server_now() - time.time()) < 1.5
