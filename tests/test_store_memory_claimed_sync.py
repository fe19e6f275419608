"""A sync that has met a claim sends nothing while it holds (store/remote/sync.py
`Syncer._wait_for_claim`), in process against the in-memory bucket: after the first try learns of
a prune's claim at its commit, no segment is packed or uploaded again (every turn would upload it
again), the claim it names is the one in the latest manifest, and once the claim is gone the
same sync goes through."""

from __future__ import annotations

from dataclasses import replace

import obstore
import pytest

from clef_cli.store.remote import manifests
from clef_cli.store.remote.sync import Claimed

from .support.remote_stores import commit, open_machine

PREFIX = "claimed/"
STORE = f"s3://clef-memory/{PREFIX}"


def objects(memory) -> set[str]:
    return {item["path"] for page in obstore.list(memory, PREFIX) for item in page}


def test_a_sync_under_a_claim_uploads_nothing_and_goes_through_once_it_is_gone(memory, monkeypatch, tmp_path):
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")
    writer = open_machine(STORE, tmp_path / "a")
    commit(writer, range(0, 3))
    writer.sync()
    chain = manifests.Chain(STORE)
    chain.commit(lambda base: replace(base, claim=manifests.new_claim("prune")), fresh=True)
    claim = chain.latest().claim
    commit(writer, range(3, 6))
    with pytest.raises(Claimed):  # the first try learns of the claim at its commit
        writer.syncer.sync()
    before = objects(memory)
    for _ in range(2):  # each turn after it: refused before anything is packed, nothing sent
        with pytest.raises(Claimed) as met:
            writer.syncer.sync()
        assert met.value.claim["token"] == claim["token"] and str(met.value).startswith(f"the store {STORE} is held")
        assert objects(memory) == before
    chain.commit(lambda base: replace(base, claim=None), fresh=True)
    assert writer.syncer.sync() is not None
    assert {name.rsplit(".", 1)[-1] for name in objects(memory) - before} == {"json"}  # the segment sent before
    manifests.forget()
    assert manifests.Chain(STORE).latest().total("records") == 6
    writer.syncer.stop.set()
    writer.syncer.thread.join()
    writer.syncer = None
    writer.close()
