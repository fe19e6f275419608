"""A bucket store's cache folder when the bucket's objects go missing or damaged after the cache
imported their segment (store/remote/cache.py: fetch, _set_aside, _forget, forget_segments,
_counts; damage.damaged, set_aside_line; store.RemoteCheckpoint.set_aside_damaged), and when a
manifest stops naming a segment the cache downloaded. In process against an obstore MemoryStore
(tests/support/remote_stores.py `served_memory`); every expected value is the bucket's objects, the
cache folder's files or the records committed."""

from __future__ import annotations

import json
from dataclasses import replace

import obstore
import pytest

from clef_cli.locations.object_store import MissingObject
from clef_cli.store.checkpoint import JOURNAL, ShardEntry
from clef_cli.store.ledger import Ledger
from clef_cli.store.remote import damage, manifests
from clef_cli.store.remote.cache import MARK, Cache
from clef_cli.store.remote.layout import manifest_name
from clef_cli.store.remote.segments import DamagedObject

from .support.remote_stores import commit, fresh_machine, key_of, open_machine, reversed_rows

PREFIX = "nightly/"
STORE = f"s3://clef-memory/{PREFIX}"
SIZE = 8
"""Records per segment (two parts of 4, with states)."""


def three_segments(tmp_path) -> list:
    """Three syncs of one writer: segments of records 0..7, 8..15, 16..23 (manifests 1..3), in
    that order; no compaction at its end."""
    writer = open_machine(STORE, tmp_path / "writer")
    made = []
    for number in range(3):
        commit(writer, range(number * SIZE, (number + 1) * SIZE), per_shard=4, with_hidden=True)
        writer.sync()
        made += [segment for segment in writer.chain.known.segments if segment not in made]
    writer.syncer.close()
    writer.syncer = None
    writer.close()
    latest = manifests.Chain(STORE).latest()
    return [latest.segments[segment] for segment in made]


def stored_keys(checkpoint) -> set[str]:
    with checkpoint.index.lock:
        return {row[0] for row in checkpoint.index.db.execute("SELECT key FROM keys WHERE final = 1")}


def keys(numbers) -> set[str]:
    return {key_of(n) for n in numbers}


def mark_of(checkpoint) -> dict:
    return json.loads((checkpoint.path / MARK).read_text(encoding="utf-8"))


def set_aside_said(where: str, records: int = SIZE) -> str:
    return (
        f"{where}: its segment's {records} records are set aside in this machine's cache; the next `clef score` that "
        "needs them computes them again and drops the segment from the store (`clef checkpoint repair` drops it now)"
    )


def shard_files(checkpoint) -> set[str]:
    return {path.name for path in (checkpoint.path / "shards").iterdir()}


# ---------------------------------------------------------------- damage met while reading a part


def test_a_results_object_gone_after_the_import_sets_its_segment_aside_and_the_next_open_forgets_it(memory, tmp_path):
    """The keys were imported, then the segment's results object went: reading a part of it says
    what is lost and the way on, the mark keeps why, the other segments still read; the next open
    of that cache drops its parts and counts its records as damaged."""
    segments = three_segments(tmp_path)
    lost = segments[1]
    obstore.delete(memory, PREFIX + lost.results)
    missing = f"{STORE}{lost.results} (named by {STORE}{manifest_name(3)}) is missing"
    with fresh_machine(STORE, tmp_path / "r") as reader:
        with pytest.raises(DamagedObject) as found:
            reader.shard_table(f"{lost.id}-00001")
        assert str(found.value) == set_aside_said(missing)
        assert (found.value.obj, found.value.segment) == (STORE + lost.results, lost.id)
        assert mark_of(reader)["set_aside"] == {lost.id: missing}
        assert reader.shard_table(f"{segments[2].id}-00000").column("record_index").to_pylist() == [16, 17, 18, 19]
    with fresh_machine(STORE, tmp_path / "r") as again:
        assert stored_keys(again) == keys([*range(0, 8), *range(16, 24)])
        assert {entry.remote["segment"] for entry in again.entries} == {segments[0].id, segments[2].id}
        info = again.info()
        assert (info["damaged_shards"], info["damaged_records"]) == ([lost.id], SIZE)
        assert mark_of(again)["set_aside"] == {lost.id: missing}


@pytest.mark.parametrize("how", ["deleted", "flipped", "cut", "short"])
def test_a_hidden_object_missing_damaged_or_cut_short_sets_its_segment_aside(memory, tmp_path, how):
    """Read by range, the last part's states: the object gone, a byte flipped, its last bytes
    cut (the range comes back short), or cut before the part begins (the range is refused)."""
    segments = three_segments(tmp_path)
    lost = segments[2]
    (hidden,) = lost.hidden
    data = bytes(obstore.get(memory, PREFIX + hidden).bytes())
    with fresh_machine(STORE, tmp_path / "probe") as probe:
        first, second = [entry for entry in probe.entries if entry.remote["segment"] == lost.id]
    assert first.remote["hidden"][1:3] == (0, second.remote["hidden"][1]) and len(data) == sum(
        entry.remote["hidden"][2] for entry in (first, second)
    )
    cut = {"flipped": data[:-1] + bytes([data[-1] ^ 1]), "cut": data[:-10], "short": data[: first.remote["hidden"][2]]}
    if how == "deleted":
        obstore.delete(memory, PREFIX + hidden)
    else:
        obstore.put(memory, PREFIX + hidden, cut[how])
    cause = {
        "deleted": "is missing",
        "flipped": "is damaged (it does not hold the hidden states its segment names)",
        "cut": "is damaged (it does not hold the hidden states its segment names)",
        "short": "is damaged (it is shorter than the hidden states its segment names)",
    }[how]
    where = f"{STORE}{hidden} (named by {STORE}{manifest_name(3)}) {cause}"
    with fresh_machine(STORE, tmp_path / "r") as reader:
        last = next(entry for entry in reader.entries if entry.name == second.name)
        with pytest.raises(DamagedObject) as found:
            reader.local_file(last, "hidden")
        assert str(found.value) == set_aside_said(where) and found.value.segment == lost.id
        assert mark_of(reader)["set_aside"] == {lost.id: where}
        assert not (reader.path / "shards" / last.files["hidden"]["name"]).exists()


def test_a_cache_with_no_mark_yet_loads_it_before_setting_a_segment_aside(memory, tmp_path):
    """A part read while the checkpoint opens (before `refresh`): the mark on disk is loaded and
    kept, the segment added to it; a damage of no segment (a `--ray` upload's) is said as it is."""
    segments = three_segments(tmp_path)
    with fresh_machine(STORE, tmp_path / "r") as reader:
        before = mark_of(reader)
        cache = Cache(reader.chain, reader.path)
        entry = next(entry for entry in reader.entries if entry.remote["segment"] == segments[0].id)
        said = cache._set_aside(reader, entry, MissingObject("gone"))
        where = f"an object of the segment {segments[0].id} of {STORE} (named by {STORE}{manifest_name(3)}) is missing"
        assert str(said) == set_aside_said(where) and (said.obj, said.segment) == (STORE, segments[0].id)
        assert mark_of(reader) == before | {"set_aside": {segments[0].id: where}}
        assert before["seq"] == 3 and before["set_aside"] == {}
        upload = ShardEntry("00000009", 2, {}, "run", None)
        plain = DamagedObject("the upload is damaged", "s3://x/y", "")
        assert cache._set_aside(reader, upload, plain) is plain
        assert mark_of(reader)["set_aside"] == {segments[0].id: where}


def test_damaged_names_the_object_or_its_segment_and_the_manifest_known(memory):
    """Before any manifest is read the manifest named is number 0."""
    chain = manifests.Chain(STORE)
    early = damage.damaged(chain, "abc", "", "a reason")
    said = f"an object of the segment abc of {STORE} (named by {STORE}{manifest_name(0)}) is damaged (a reason)"
    assert (str(early), early.obj, early.segment) == (said, STORE, "abc")
    chain.commit(lambda base: manifests.Manifest(0, {"f": 1}))
    late = damage.damaged(chain, "abc", "segments/x.keys", MissingObject("404"))
    said = f"{STORE}segments/x.keys (named by {STORE}{manifest_name(1)}) is missing"
    assert (str(late), late.obj, late.segment) == (said, STORE + "segments/x.keys", "abc")
    assert damage.set_aside_line(late, 3) == set_aside_said(said, 3)


# ---------------------------------------------------------------- a segment no manifest names


def test_a_segment_the_manifest_stops_naming_is_forgotten_with_its_downloaded_files(memory, tmp_path):
    """The cache downloaded two segments' parts; a commit drops the first (as repair or a prune
    would): the next open forgets its journal lines, keys and files, and keeps the other's files
    (read again without a download)."""
    segments = three_segments(tmp_path)
    gone, kept = segments[0], segments[1]
    with fresh_machine(STORE, tmp_path / "r") as reader:
        for segment in (gone, kept):
            for part in range(2):
                reader.local_file(next(e for e in reader.entries if e.name == f"{segment.id}-{part:05d}"), "hidden")
                reader.shard_table(f"{segment.id}-{part:05d}")
        downloaded = shard_files(reader)
    names = {
        f"{s.id}-{p:05d}.{kind}"
        for s in (gone, kept)
        for p in range(2)
        for kind in ("results.arrow", "hidden.safetensors")
    }
    assert downloaded == names
    chain = manifests.Chain(STORE)
    chain.commit(lambda base: replace(base, segments={k: v for k, v in base.segments.items() if k != gone.id}))
    with fresh_machine(STORE, tmp_path / "r") as again:
        assert stored_keys(again) == keys(range(8, 24))
        assert shard_files(again) == {name for name in names if name.startswith(kept.id)}
        lines = (again.path / JOURNAL).read_text(encoding="utf-8").splitlines()
        journal = sorted(json.loads(line)["name"] for line in lines)
        assert journal == sorted(f"{s.id}-{p:05d}" for s in (kept, segments[2]) for p in range(2))
        assert again.shard_table(f"{kept.id}-00001").column("record_index").to_pylist() == [12, 13, 14, 15]
        assert again.cache.downloaded == 0 and again.dropped == []


# ---------------------------------------------------------------- a job's check before it computes


def test_a_job_sets_aside_the_segments_it_would_reuse_whose_results_are_gone_and_computes_them(memory, tmp_path):
    """Segment A's keys object is damaged (set aside when the job opens), C's results object is
    gone (found by the job's check, which skips its own shards): both are damaged, their keys
    leave the index, the job computes them, and its commit drops both from the store."""
    a, b, c = three_segments(tmp_path)
    obstore.put(memory, PREFIX + a.keys, reversed_rows(bytes(obstore.get(memory, PREFIX + a.keys).bytes())))
    obstore.delete(memory, PREFIX + c.results)
    manifests.forget()
    job = open_machine(STORE, tmp_path / "job")
    job.begin_run()
    job.ledger = Ledger(job.index, job.run_seq)
    used = [*range(0, 24), *range(100, 104)]
    with job.index.transaction() as db:
        db.executemany("INSERT INTO temp.job VALUES (?, ?, ?, NULL)", [(n, f"r{n}", key_of(n)) for n in used])
    commit(job, range(100, 104))  # the job's own shard, among those it reuses
    assert [(entry.name, entry.records) for entry in job.dropped] == [(a.id, SIZE)]
    assert job.set_aside_damaged() is True
    assert [(entry.name, entry.records) for entry in job.dropped] == [(a.id, SIZE), (c.id, SIZE)]
    assert stored_keys(job) == keys([*range(8, 16), *range(100, 104)])
    assert {entry.remote["segment"] for entry in job.entries if entry.remote} == {b.id}
    assert set(job.cache.mark.set_aside) == {a.id, c.id}
    assert job.set_aside_damaged() is False  # nothing more to find
    commit(job, [*range(0, 8), *range(16, 24)], per_shard=4, with_hidden=True)
    job.close()
    with fresh_machine(STORE, tmp_path / "r") as reader:
        assert stored_keys(reader) == keys(used)
        assert a.id not in reader.chain.known.segments and c.id not in reader.chain.known.segments
        assert b.id in reader.chain.known.segments and reader.dropped == []
