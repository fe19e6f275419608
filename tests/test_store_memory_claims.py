"""What `clef checkpoint unclaim` says and does (store/remote/claims.py: claim_said, unclaim) and
whom `checkpoint info` names as the last user of a store's keys (store/remote/last_users.py), in
process against an obstore MemoryStore (tests/support/remote_stores.py `served_memory`). The expected
words are written out; the expected counts are the records each run used, by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clef_cli.errors import ClefError, UsageError
from clef_cli.store.remote import manifests
from clef_cli.store.remote.claims import claim_said, unclaim
from clef_cli.store.remote.last_users import in_use_order, last_users

from .support.remote_stores import commit, fresh_machine, night, open_machine

PREFIX = "nightly/"
STORE = f"s3://clef-memory/{PREFIX}"


# ---------------------------------------------------------------- claim_said, unclaim


def test_a_claim_is_said_with_its_holder_its_utc_time_and_its_whole_seconds_left():
    claim = {"what": "repair", "pid": 12, "host": "box", "since": 86400 * 365 + 3723.9, "left": 1.7}
    assert claim_said(claim, STORE) == (
        f"the claim on {STORE} of a `clef checkpoint repair` (pid 12 on host box), taken at 1971-01-01 01:02:03 UTC "
        "by that host's clock (it holds for 1 s more)"
    )
    assert claim_said({"left": 0.9}, STORE) == (
        f"the claim on {STORE} of a `clef checkpoint prune` (pid ? on host ?), taken at 1970-01-01 00:00:00 UTC by "
        "that host's clock (its lease has run out)"
    )
    assert claim_said({}, STORE).endswith(
        "taken at 1970-01-01 00:00:00 UTC by that host's clock (its lease has run out)"
    )


def claimed_store(lease: float) -> dict:
    """A store whose latest manifest holds a prune's claim of `lease` seconds (the claim)."""
    chain = manifests.Chain(STORE)
    chain.commit(lambda base: manifests.Manifest(0, {"f": 1}))
    claim = manifests.new_claim("prune") | {"lease": lease}
    chain.commit(lambda base: replace(base, claim=claim), fresh=True)
    manifests.forget()
    return claim


def test_unclaim_without_confirm_names_the_claim_and_the_way_to_break_it(memory, monkeypatch):
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")
    claim = claimed_store(3600)
    with pytest.raises(UsageError) as refused:
        unclaim(STORE, confirm=False)
    said = str(refused.value)
    assert said.startswith(f"the claim on {STORE} of a `clef checkpoint prune` (pid {claim['pid']} on host ")
    way = "breaking it ends that job's work if it still runs (it then commits nothing); add --confirm to break it"
    assert said.endswith(f" s more): {way}")
    assert manifests.Chain(STORE).latest().claim == claim


def test_unclaim_of_a_claim_whose_lease_ran_out_breaks_it_with_no_time_left(memory, monkeypatch):
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")
    claim = claimed_store(0)
    assert unclaim(STORE, confirm=True) == claim | {"left": 0}
    manifests.forget()
    latest = manifests.Chain(STORE).latest()
    assert latest.seq == 3 and latest.claim is None


def test_unclaim_breaks_nothing_when_the_claim_was_released_meanwhile(memory, monkeypatch):
    """The holder releases its claim between unclaim's reading and its commit: said, nothing committed."""
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3600")
    claimed_store(3600)
    holding = manifests.Chain.holding

    def released_meanwhile(chain, manifest):
        held = holding(chain, manifest)
        other = manifests.Chain(STORE)
        other.commit(lambda base: replace(base, claim=None), fresh=True)  # the holder's release
        return held

    monkeypatch.setattr(manifests.Chain, "holding", released_meanwhile)
    with pytest.raises(ClefError) as refused:
        unclaim(STORE, confirm=True)
    assert str(refused.value) == (f"the claim on {STORE} changed meanwhile (released or taken again): nothing broken")
    monkeypatch.setattr(manifests.Chain, "holding", holding)
    manifests.forget()
    assert manifests.Chain(STORE).latest().seq == 3  # the release only


# ---------------------------------------------------------------- last users


def test_runs_are_ordered_by_their_start_then_their_id_a_run_with_no_start_first():
    manifest = manifests.Manifest(
        1, {}, runs={"b": {"started": 5.0}, "a": {"started": 5.0}, "c": {"started": None}, "d": {"started": 0.5}}
    )
    assert in_use_order(manifest) == ["c", "d", "a", "b"]


def test_the_last_user_of_each_key_is_found_through_every_runs_list_newest_first(memory, tmp_path):
    """Run 1 uses 0..9, run 2 uses 0..19, run 3 uses 15..24: run 3 used 10 keys last, run 2 the
    15 others (run 1's keys among them), run 1 none."""
    for name, used, computed in (("a", range(0, 10), range(0, 10)), ("b", range(0, 20), range(10, 20))):
        checkpoint = open_machine(STORE, tmp_path / name)
        night(checkpoint, used, computed)
        checkpoint.close()
    checkpoint = open_machine(STORE, tmp_path / "c")
    night(checkpoint, range(15, 25), range(20, 25))
    checkpoint.close()
    with fresh_machine(STORE, tmp_path / "r") as reader:
        order = in_use_order(reader.chain.known)
        assert last_users(reader) == {order[2]: 10, order[1]: 15}


def test_a_run_that_kept_no_list_is_the_last_user_of_the_keys_it_computed_that_no_later_run_used(memory, tmp_path):
    """Run 1 computes 0..9, its record naming no `runs/RUN.keys` (a store of before the lists);
    run 2 uses 5..14: run 2 used 10 keys last, run 1 (the run whose parts computed them) the 5 others."""
    first = open_machine(STORE, tmp_path / "a")
    night(first, range(0, 10), range(0, 10))
    first.close()
    second = open_machine(STORE, tmp_path / "b")
    night(second, range(5, 15), range(10, 15))
    second.close()
    old = in_use_order(manifests.Chain(STORE).latest())[0]
    manifests.Chain(STORE).commit(
        lambda base: replace(base, runs=base.runs | {old: base.runs[old] | {"keys": None}}), fresh=True
    )
    manifests.forget()
    with fresh_machine(STORE, tmp_path / "r") as reader:
        runs = reader.chain.known.runs
        order = in_use_order(reader.chain.known)
        assert runs[order[0]]["keys"] is None and runs[order[1]]["keys"] is not None
        assert last_users(reader) == {order[0]: 5, order[1]: 10}


def test_a_store_with_no_manifest_yet_has_its_machines_runs_as_last_users(memory, tmp_path):
    writer = open_machine(STORE, tmp_path / "a")
    writer.begin_run()
    commit(writer, range(0, 4))
    assert writer.chain.known is None
    assert last_users(writer) == {writer.run_id: 4}
    writer.close()
