"""`clef checkpoint prune` on a bucket store prunes this machine's cache folders of it
(store/remote/cache_prune.py: prune_caches, _prune_folder, _files, _size), in process against
an obstore MemoryStore (tests/support/remote_stores.py `served_memory`): each folder no job holds is
brought up to the manifest (what it no longer names leaves the disk) and its staged outputs go;
one a job holds is left and named; a dry run changes nothing. The expected values are the files
on disk, listed and sized by the test."""

from __future__ import annotations

import shutil
from dataclasses import replace

from clef_cli.store.locks import SUFFIX, JobLock
from clef_cli.store.remote import manifests
from clef_cli.store.remote.cache_prune import CachePruned, prune_caches
from clef_cli.store.remote.layout import cache_folder

from .support.remote_stores import commit, key_of, open_machine

PREFIX = "nightly/"
STORE = f"s3://clef-memory/{PREFIX}"


def on_disk(folder) -> dict[str, int]:
    """Every file under `folder` (links not followed), by its path relative to it, with its size."""
    return {str(path.relative_to(folder)): path.lstat().st_size for path in folder.rglob("*") if not path.is_dir()}


def two_segments(tmp_path) -> list[str]:
    writer = open_machine(STORE, tmp_path / "writer")
    made = []
    for number in range(2):
        commit(writer, range(number * 6, number * 6 + 6), per_shard=3, with_hidden=True)
        writer.sync()
        made += [segment for segment in writer.chain.known.segments if segment not in made]
    writer.syncer.close()
    writer.syncer = None
    writer.close()
    return made


def test_the_caches_no_job_holds_are_brought_up_to_the_store_and_their_staged_outputs_go(memory, tmp_path):
    """Slots 1 and 3 of this machine (2 gone), slot 1 having read every part; a commit then drops
    the first segment. A dry run finds both and counts slot 1's staged output; the prune, with
    slot 3 held by a running job, frees slot 1 of that segment's files and the output (not a
    lock beside it, not a link), and leaves slot 3 as it was."""
    first, second = two_segments(tmp_path)
    machine = tmp_path / "machine"
    readers = [open_machine(STORE, machine, sync_every=None) for _ in range(3)]
    slots = [reader.path for reader in readers]
    assert slots == [cache_folder(STORE, machine, slot) for slot in (1, 2, 3)]
    for entry in readers[0].entries:
        readers[0].local_file(entry, "hidden")
        readers[0].shard_table(entry.name)
    for reader in readers:
        reader.close()
    shutil.rmtree(slots[1])
    one, three = slots[0], slots[2]
    staged = one / "upload"
    staged.mkdir()
    (staged / "scores.csv").write_bytes(b"x" * 100)
    (staged / f"scores.csv{SUFFIX}").write_bytes(b"held")
    (tmp_path / "elsewhere.csv").write_bytes(b"y" * 1000)
    (staged / "linked.csv").symlink_to(tmp_path / "elsewhere.csv")
    chain = manifests.Chain(STORE)
    chain.commit(lambda base: replace(base, segments={k: v for k, v in base.segments.items() if k != first}))
    before_one, before_three = on_disk(one), on_disk(three)
    assert sum(name.startswith(f"shards/{first}-") for name in before_one) == 4  # 2 parts: results, states

    dry = prune_caches(STORE, machine, dry_run=True)
    assert dry == CachePruned(one.parent, folders=2, held=[], staged=1, bytes_freed=100, dry_run=True)
    assert on_disk(one) == before_one and on_disk(three) == before_three

    holder = JobLock(three.with_name(three.name + SUFFIX), "a running job")
    holder.acquire()
    try:
        report = prune_caches(STORE, machine)
    finally:
        holder.release()
    after_one = on_disk(one)
    assert not any(name.startswith(f"shards/{first}-") for name in after_one)
    assert {name for name in after_one if name.startswith(f"shards/{second}-")} == {
        name for name in before_one if name.startswith(f"shards/{second}-")
    }
    assert "upload/scores.csv" not in after_one and {"upload/scores.csv.lock", "upload/linked.csv"} <= set(after_one)
    freed = sum(before_one.values()) - sum(after_one.values())
    dropped = sum(size for name, size in before_one.items() if name.startswith(f"shards/{first}-"))
    assert freed > 100 + dropped // 2  # the output, the segment's files (the index and notes change a little)
    assert report == CachePruned(one.parent, folders=1, held=[str(three)], staged=1, bytes_freed=freed)
    assert on_disk(three) == before_three
    again = JobLock(one.with_name(one.name + SUFFIX), "the next job")
    again.acquire()  # the prune let go of slot 1
    again.release()
    reader = open_machine(STORE, machine, sync_every=None)
    try:
        assert reader.path == one and reader.index.locate([key_of(0)]) == {}
        assert set(reader.index.locate([key_of(6)])) == {key_of(6)}
    finally:
        reader.close()


def test_a_prune_of_a_machine_without_a_cache_of_the_store_finds_none(memory, tmp_path):
    two_segments(tmp_path)
    report = prune_caches(STORE, tmp_path / "elsewhere")
    assert report == CachePruned(cache_folder(STORE, tmp_path / "elsewhere").parent)
    assert not (tmp_path / "elsewhere").exists()


def test_a_cache_whose_upload_folder_ends_empty_loses_it_and_one_that_grew_frees_nothing(memory, tmp_path):
    """Only staged outputs: the upload folder goes with them. A cache that grows while it is
    brought up (it had not read the store's latest segment yet) frees 0 bytes, never less."""
    two_segments(tmp_path)
    machine = tmp_path / "machine"
    reader = open_machine(STORE, machine, sync_every=None)
    reader.close()
    one = reader.path
    (one / "upload").mkdir()
    (one / "upload" / "a.json").write_bytes(b"{}")
    writer = open_machine(STORE, tmp_path / "writer")
    commit(writer, range(100, 140), per_shard=10)
    writer.syncer.close()
    writer.syncer = None
    writer.close()
    before = on_disk(one)
    report = prune_caches(STORE, machine)
    assert not (one / "upload").exists() and sum(on_disk(one).values()) > sum(before.values())
    assert (report.folders, report.staged, report.bytes_freed) == (1, 1, 0)
