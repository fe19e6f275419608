"""A sync whose objects a prune deleted between their upload and its manifest (sync.py:
Syncer._still_there): when others committed meanwhile each object is asked for and only the
missing ones are put again, before the manifest names them; in process against a MemoryStore."""

from __future__ import annotations

import obstore

from clef_cli.store.ledger import Ledger

from .support.remote_stores import commit, key_of, open_machine

PREFIX = "nightly/"
STORE = f"s3://clef-memory/{PREFIX}"


def objects(store) -> set[str]:
    return {item["path"] for page in obstore.list(store, PREFIX) for item in page}


def test_objects_deleted_before_the_manifest_are_put_again_and_only_those(memory, tmp_path):
    """Writer `a` uploads its segment and its run's keys; before it commits, writer `b` commits
    and a prune deletes a's results object and its run's keys: exactly those two are put again."""
    other = open_machine(STORE, tmp_path / "b")
    commit(other, range(100, 105))
    other.sync()
    writer = open_machine(STORE, tmp_path / "a")
    writer.begin_run()
    writer.ledger = Ledger(writer.index, writer.run_seq)
    with writer.index.transaction() as db:
        db.executemany("INSERT INTO temp.job VALUES (?, ?, ?, NULL)", [(n, f"r{n}", key_of(n)) for n in range(5)])
    commit(writer, range(5))
    chain, real_commit, real_put = writer.syncer.chain, writer.syncer.chain.commit, writer.syncer.chain.bucket.put
    gone, puts = [], []

    def commit_after_a_prune(change, **options):
        uploaded = sorted(objects(memory) - before)  # a's segment (results, keys) and its run's keys
        assert len(uploaded) == 3
        gone.extend(name for name in uploaded if name.endswith(".results") or f"{PREFIX}runs/" in name)
        commit(other, range(105, 110))
        other.sync()
        for name in gone:
            obstore.delete(memory, name)
        chain.bucket.put = lambda key, data, **more: puts.append(key) or real_put(key, data, **more)
        return real_commit(change, **options)

    before = objects(memory)
    chain.commit = commit_after_a_prune
    writer.syncer.sync()
    chain.bucket.put = real_put
    assert len(gone) == 2 and any(name.startswith(f"{PREFIX}runs/") for name in gone)
    assert sorted(key for key in puts if "/manifests/" not in key) == sorted(gone) and set(gone) <= objects(memory)
    writer.syncer.close()
    writer.syncer = None
    writer.close()
    other.close()
