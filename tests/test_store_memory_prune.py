"""`clef checkpoint prune s3://...` (store/remote/pruning.py: prune_bucket, grace_floor, _runs,
_plan, _filtered, _apply) in process against an obstore MemoryStore (tests/support/remote_stores.py
`served_memory`). Every count a report gives is checked against the bucket's own objects or the
records committed; an old run is made by skewing the key index's clock, never by sleeping."""

from __future__ import annotations

import json
import math

import obstore
import pytest

from clef_cli import faults
from clef_cli.errors import UsageError
from clef_cli.store import key_index
from clef_cli.store.ledger import Ledger
from clef_cli.store.remote import pruning, segments
from clef_cli.store.remote.layout import MANIFESTS, SEGMENTS
from clef_cli.store.remote.manifests import Manifest

from .support.remote_stores import Skewed, commit, fresh_machine, key_of, open_machine

PREFIX = "nightly/"
STORE = f"s3://clef-memory/{PREFIX}"
DAY = 86400.0


def objects(store, under: str = "") -> dict[str, int]:
    """The bucket's objects under the store's prefix (and `under`): name -> size."""
    return {item["path"]: item["size"] for page in obstore.list(store, PREFIX + under) for item in page}


def results_bytes(store) -> int:
    return sum(size for name, size in objects(store, SEGMENTS).items() if name.endswith(".results"))


def stored_keys(checkpoint) -> set[str]:
    with checkpoint.index.lock:
        return {row[0] for row in checkpoint.index.db.execute("SELECT key FROM keys WHERE final = 1")}


def keys(*ranges: range) -> set[str]:
    return {key_of(n) for numbers in ranges for n in numbers}


def run(tmp_path, name: str, used: list[int], computed: list[range], days_ago: float = 0) -> str:
    """A finished run on machine `name`: its records have the keys of `used`, it computes each
    range of `computed` and syncs after each (one segment per range); started `days_ago`. Its id."""
    writer = open_machine(STORE, tmp_path / name)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(key_index, "time", Skewed(-days_ago * DAY))
        writer.begin_run()
    writer.ledger = Ledger(writer.index, writer.run_seq)
    with writer.index.transaction() as db:
        db.executemany("INSERT INTO temp.job VALUES (?, ?, ?, NULL)", [(n, f"r{n}", key_of(n)) for n in used])
    for numbers in computed:
        commit(writer, numbers)
        writer.sync()
    writer.index.finish_run(writer.run_id, {"run": sum(map(len, computed)), "reused": 0})
    run_id = writer.run_id
    writer.syncer.close()
    writer.syncer = None  # no compaction at its end: the segments stay as synced
    writer.close()
    return run_id


def newest_manifest(store) -> dict:
    name = max(objects(store, MANIFESTS))
    return json.loads(bytes(obstore.get(store, name).bytes()))


# ---------------------------------------------------------------- the plan and its report


@pytest.fixture
def two_nights(memory, monkeypatch, tmp_path):
    """Run `old` (3 days ago) computes 0..9, 10..19, 50..59, 60..69 (four segments); run `new`
    computes 20..29, 30..39, 40..49 and its records also have 5..9 and 15..19. Keys objects are
    written 4 rows a batch and looked up 2 at a time, so batches and lookups are many."""
    monkeypatch.setattr(segments, "BATCH_ROWS", 4)
    monkeypatch.setattr(pruning, "LOOKUP_CHUNK", 2)
    old_numbers = [*range(0, 20), *range(50, 70)]
    old = run(tmp_path, "a", old_numbers, [range(0, 10), range(10, 20), range(50, 60), range(60, 70)], 3)
    new_used = [*range(5, 10), *range(15, 20), *range(20, 50)]
    new = run(tmp_path, "b", new_used, [range(20, 30), range(30, 40), range(40, 50)])
    return memory, old, new


EXPECTED = {
    "keys_before": 70,
    "keys_dropped": 30,  # 0..4, 10..14 (rewritten segments) and 50..69 (removed segments)
    "rows_dropped": 30,
    "shards_rewritten": 2,
    "shards_removed": 2,
    "drops_every_key": False,
    "objects_deleted": 0,
}


def report_of(report) -> dict:
    return {name: getattr(report, name) for name in EXPECTED}


def test_the_report_counts_keys_segments_and_bytes_as_the_bucket_shows_them(two_nights, tmp_path):
    """Keep the last run: two segments lose some keys (rewritten), two lose all (removed), three
    stay; the bytes freed are the results objects' bytes the bucket holds less after the sweep."""
    memory, _, new = two_nights
    before = results_bytes(memory)
    assert len(newest_manifest(memory)["segments"]) == 7
    report = pruning.prune_bucket(STORE, keep_runs=1, grace_seconds=0, no_running_jobs=True)
    assert report_of(report) | {"objects_deleted": 0} == EXPECTED
    assert report.kept_runs == [new] and report.dry_run is False
    assert report.objects_deleted > 0 and report.bytes_freed == before - results_bytes(memory) > 0
    with fresh_machine(STORE, tmp_path / "r") as reader:
        assert stored_keys(reader) == keys(range(5, 10), range(15, 50))
        assert len(reader.chain.known.segments) == 5


def test_a_prune_by_age_keeps_the_runs_started_within_the_days_given(two_nights, tmp_path):
    """`--older-than 2` alone keeps run `new` only (run `old` started 3 days ago), dry or not."""
    memory, old, new = two_nights
    before = objects(memory)
    dry = pruning.prune_bucket(STORE, older_than_days=2, dry_run=True)
    assert report_of(dry) == EXPECTED and dry.kept_runs == [new] and dry.dry_run is True
    assert objects(memory) == before
    real = pruning.prune_bucket(STORE, older_than_days=2)
    assert report_of(real) == EXPECTED and real.kept_runs == [new]
    with fresh_machine(STORE, tmp_path / "r") as reader:
        assert stored_keys(reader) == keys(range(5, 10), range(15, 50))
    again = pruning.prune_bucket(STORE, older_than_days=4)  # both runs kept: nothing more goes
    assert (again.keys_before, again.keys_dropped, again.kept_runs) == (40, 0, [old, new])


def test_the_prune_holds_the_store_under_a_claim_named_prune_and_commits_once(two_nights, monkeypatch):
    """While it plans the store is claimed for `prune` (the manifest in the bucket says so); the
    commit that switches to the rewrites is the `prune-committed` point, and the claim is gone."""
    memory, _, _ = two_nights
    seen: list[tuple[str, str | None]] = []

    def pause(point: str) -> None:
        claim = newest_manifest(memory)["claim"]
        seen.append((point, claim["what"] if claim else None))

    monkeypatch.setattr(faults, "pause_at", pause)
    pruning.prune_bucket(STORE, keep_runs=1)
    assert seen == [("claimed", "prune"), ("prune-committed", None)]
    assert newest_manifest(memory)["claim"] is None


# ---------------------------------------------------------------- refusals and the grace period


def test_limits_are_checked_before_the_store_is_read(memory):
    """`--older-than 0` is refused even beside `--keep-runs` (no store needed to say so)."""
    with pytest.raises(UsageError, match=r"^--older-than must be above 0 days, not 0: 0 would drop every key$"):
        pruning.prune_bucket(STORE, keep_runs=1, older_than_days=0)


def test_a_grace_under_the_floor_is_refused_in_hours_and_the_floor_itself_is_allowed(memory, monkeypatch, tmp_path):
    """A lease of 3847 s: the floor is 3847 + 600 = 4447 s, 1.24 hours (3 figures); 1 hour is refused."""
    monkeypatch.setenv("CLEF_CLAIM_LEASE_SECONDS", "3847")
    assert pruning.grace_floor() == 4447.0
    run(tmp_path, "a", list(range(3)), [range(0, 3)])
    with pytest.raises(UsageError) as refused:
        pruning.prune_bucket(STORE, keep_runs=1, grace_seconds=3600)
    assert str(refused.value) == (
        "--grace-hours 1 is under the floor of 1.24 hours (a claim's lease of 3847 s plus a commit's patience "
        f"of 600 s): a running job's upload would be deleted before it is named; add --no-running-jobs if no job "
        f"writes to {STORE} meanwhile"
    )
    with pytest.raises(UsageError, match=r"under the floor of 1\.24 hours"):
        pruning.prune_bucket(STORE, keep_runs=1, grace_seconds=4446)
    assert pruning.prune_bucket(STORE, keep_runs=1, grace_seconds=4447).keys_before == 3


def test_the_default_grace_is_one_day_by_the_clock(memory, monkeypatch, tmp_path):
    """A dry run's sweep reads this machine's clock: an orphan exactly a day old (whole seconds)
    counts as deleted, one a second younger does not."""
    run(tmp_path, "a", list(range(3)), [range(0, 3)])
    orphan = f"{PREFIX}{SEGMENTS}{'0' * 64}.keys"
    obstore.put(memory, orphan, b"left by a killed writer")
    stamp = math.floor(obstore.head(memory, orphan)["last_modified"].timestamp())

    class Clock:
        now = stamp + DAY

        def time(self) -> float:
            return self.now

    monkeypatch.setattr(pruning, "time", Clock())
    assert pruning.prune_bucket(STORE, keep_runs=1, dry_run=True).objects_deleted == 1
    Clock.now = stamp + DAY - 1
    assert pruning.prune_bucket(STORE, keep_runs=1, dry_run=True).objects_deleted == 0
    assert orphan in objects(memory)


def test_a_prune_dropping_every_key_is_refused_then_forced_then_an_empty_store_prunes(memory, monkeypatch, tmp_path):
    """One run 3 days ago, `--older-than 1`: no run is kept, all 10 keys would go, refused with
    the count; forced, they go (one segment removed); pruning the store left (no key) is no refusal."""
    run(tmp_path, "a", list(range(10)), [range(0, 10)], days_ago=3)
    with pytest.raises(UsageError) as refused:
        pruning.prune_bucket(STORE, older_than_days=1)
    assert str(refused.value) == (
        f"this prune would drop all 10 keys of {STORE}: no kept run used any (0 completed runs with keys kept); "
        "see `clef checkpoint prune --dry-run`, keep more runs, or add --force to drop them all"
    )
    assert newest_manifest(memory)["claim"] is None and len(newest_manifest(memory)["segments"]) == 1
    forced = pruning.prune_bucket(STORE, older_than_days=1, force=True)
    assert (forced.keys_before, forced.keys_dropped, forced.shards_removed, forced.drops_every_key) == (10, 10, 1, True)
    assert newest_manifest(memory)["segments"] == {}
    empty = pruning.prune_bucket(STORE, older_than_days=1)
    assert (empty.keys_before, empty.keys_dropped, empty.drops_every_key) == (0, 0, False)


def test_a_store_of_one_key_no_kept_run_used_is_refused(memory, monkeypatch, tmp_path):
    run(tmp_path, "a", [0], [range(0, 1)], days_ago=3)
    with pytest.raises(UsageError, match=r"^this prune would drop all 1 keys of "):
        pruning.prune_bucket(STORE, older_than_days=1)
    assert pruning.prune_bucket(STORE, older_than_days=1, dry_run=True).drops_every_key is True


# ---------------------------------------------------------------- the runs' order


def test_runs_are_numbered_from_1_in_the_order_they_started_ties_by_id():
    """Run `z` started first, `b` and `a` together (by id: `a` first), `c` has no start (as 0:
    before one started at 0.5)."""
    runs = {"z": {"started": 0.5}, "b": {"started": 7.0}, "a": {"started": 7.0}, "c": {"started": None}}
    numbered = pruning._runs(Manifest(0, {}, {}, runs))
    assert [(run["seq"], run["run_id"]) for run in numbered] == [(1, "c"), (2, "z"), (3, "a"), (4, "b")]
    assert numbered[2] == {"seq": 3, "run_id": "a", "started": 7.0}
