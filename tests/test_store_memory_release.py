"""A claim's holder commits its change only while its claim still holds the store
(store/remote/compaction.py `release`), in process against the in-memory bucket: a claim another
job took, one broken, one whose lease ran out by the bucket's clock each end in `Lapsed` with the
words written out here, nothing committed; a claim that holds commits the change without itself."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clef_cli.store.remote import manifests
from clef_cli.store.remote.compaction import Lapsed, release

STORE = "s3://clef-memory/release/"


def claimed(claim: dict) -> manifests.Chain:
    """A store whose latest manifest holds `claim`; the chain a holder would commit through."""
    chain = manifests.Chain(STORE)
    chain.commit(lambda base: manifests.Manifest(0, {"f": 1}))
    chain.commit(lambda base: replace(base, claim=claim), fresh=True)
    return chain


def mark(base: manifests.Manifest) -> manifests.Manifest:
    return replace(base, fingerprint={**base.fingerprint, "marked": 1})


def test_a_claim_that_holds_commits_the_change_without_itself(memory, monkeypatch):
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")
    claim = manifests.new_claim("compaction")
    chain = claimed(claim)
    manifests.forget()
    committed = release(manifests.Chain(STORE), claim, mark)
    latest = manifests.Chain(STORE).latest()
    assert committed.seq == latest.seq == 3 and latest.claim is None and latest.fingerprint["marked"] == 1
    assert claim["released"] is True and chain.uri == STORE


@pytest.mark.parametrize("how", ["taken", "broken", "lapsed", "unnamed"])
def test_a_claim_that_no_longer_holds_commits_nothing_and_says_why(memory, monkeypatch, how):
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")
    claim = manifests.new_claim("compaction") | ({"lease": 0} if how == "lapsed" else {})
    if how == "unnamed":
        del claim["what"]
    chain = claimed(claim)
    other = manifests.new_claim("repair")
    if how in ("taken", "unnamed"):
        chain.commit(lambda base: replace(base, claim=other), fresh=True)
    elif how == "broken":
        chain.commit(lambda base: replace(base, claim=None), fresh=True)
    before = manifests.Chain(STORE).latest()
    with pytest.raises(Lapsed) as lapsed:
        release(chain, claim, mark)
    owner = "the prune" if how == "unnamed" else "the compaction"
    why = {
        "taken": f"no longer holds the store: another job took the store since ({manifests.holder(other)})",
        "unnamed": f"no longer holds the store: another job took the store since ({manifests.holder(other)})",
        "broken": "no longer holds the store: it was broken",
        "lapsed": "ran out of its lease by the bucket's clock",
    }[how]
    assert str(lapsed.value) == f"{owner}'s claim on {STORE} {why}; nothing committed"
    manifests.forget()
    assert manifests.Chain(STORE).latest() == before and "released" not in claim
