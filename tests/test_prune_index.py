"""The key index after a prune (store/index_compaction.py): rewritten shards keep their names and
every kept key points at the row of the new file that holds it, with its final, hidden and
last-run flags as before, whichever way the bulk update walks the keys (in key order, or a shard
at a time through the shard index); a prune killed after its journal switch, on a store whose
index predates the results-file column too, is reconciled to the same index at the next open."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pyarrow as pa
import pytest

from clef_cli.results import RESULT_SCHEMA
from clef_cli.store import index_compaction
from clef_cli.store import prune as prune_module
from clef_cli.store.checkpoint import Checkpoint
from clef_cli.store.prune import prune

MANIFEST = {"model": {"id": "synthetic"}, "settings": {"dtype": "float32"}}
SHARD_ROWS = 40


def results(keys: list[str | None], first_index: int) -> pa.Table:
    count = len(keys)
    columns = {
        "id": [f"r{first_index + n}" for n in range(count)],
        "record_index": list(range(first_index, first_index + count)),
        "prompt_tokens": [7] * count,
        "state_tokens_cut": [0] * count,
        "error": [None] * count,
        "error_kind": [None] * count,
        "answers": [None] * count,
        "record_key": keys,
    }
    return pa.table(columns, schema=RESULT_SCHEMA)


def build(path: Path) -> None:
    """Three runs of 4 shards. Run 3 reuses two keys in three of run 1's shards (their other
    rows go), rescores one key of run 2 into its own shard (the old row is no key's any more),
    and commits a shard with a keyless row; one of run 1's shards has no key run 3 used (it goes
    whole)."""
    checkpoint = Checkpoint.open(path, MANIFEST)
    index = checkpoint.index
    assert index is not None
    for night in range(3):
        checkpoint.run_id = f"run{night}"
        checkpoint.begin_run()
        for shard in range(4 if night < 2 else 1):
            first = (night * 4 + shard) * SHARD_ROWS
            keys: list[str | None] = [f"{first + n:064x}" for n in range(SHARD_ROWS)]
            if night == 2:  # a rescored key of run 2 and a record without a key
                keys = [f"{4 * SHARD_ROWS + 5:064x}", None, *keys[2:]]
            checkpoint.commit(results(keys, first))
        index.finish_run(f"run{night}", {"run": SHARD_ROWS, "reused": 0})
    reused = [f"{shard * SHARD_ROWS + row:064x}" for shard in range(3) for row in (3, SHARD_ROWS - 1)]
    with index.transaction() as db:  # run 3 reused them (as its ledger marks keys it reads)
        db.executemany("UPDATE keys SET last_run = 3 WHERE key = ?", [(key,) for key in reused])
    checkpoint.close()


def index_rows(path: Path) -> dict[str, tuple]:
    with sqlite3.connect(path / "keys.sqlite") as db:
        rows = db.execute("SELECT key, shard, seq, row, final, hidden, last_run FROM keys")
        return {key: tuple(rest) for key, *rest in rows}


def assert_points_at_its_rows(path: Path) -> None:
    """Every indexed key is the record_key of the row it points to, in the file the journal and
    the index's shards table name for its shard."""
    checkpoint = Checkpoint.open_existing(path)
    try:
        with sqlite3.connect(path / "keys.sqlite") as db:
            files = dict(db.execute("SELECT name, file FROM shards"))
        assert files == {entry.name: entry.files["results"]["name"] for entry in checkpoint.entries}
        for key, (shard, _, row, *_) in index_rows(path).items():
            assert checkpoint.shard_table(shard).column("record_key")[row].as_py() == key
    finally:
        checkpoint.close()


def expected_after(before: dict[str, tuple]) -> dict[str, tuple]:
    """The keys `--keep-runs 1` keeps (last used by run 3) with every flag but the row unchanged."""
    return {key: (shard, seq, final, hidden, last) for key, (shard, seq, _, final, hidden, last) in before.items()
            if last == 3}  # fmt: skip


def without_rows(rows: dict[str, tuple]) -> dict[str, tuple]:
    return {key: (shard, seq, final, hidden, last) for key, (shard, seq, _, final, hidden, last) in rows.items()}


@pytest.mark.parametrize("walk_share", [10**9, 0], ids=["walk in key order", "shard by shard"])
def test_a_prune_points_every_kept_key_at_its_row_in_the_rewritten_shard(tmp_path, monkeypatch, walk_share):
    monkeypatch.setattr(index_compaction, "WALK_SHARE", walk_share)
    store = tmp_path / "st"
    build(store)
    before = index_rows(store)
    report = prune(store, keep_runs=1)
    assert (report.keys_before, report.keys_dropped) == (len(before), len(before) - len(expected_after(before)))
    assert (report.shards_rewritten, report.shards_removed) == (4, 5)  # run 1's 3 + run 3's; the rest whole
    assert report.rows_dropped == 9 * SHARD_ROWS - len(expected_after(before))
    after = index_rows(store)
    assert without_rows(after) == expected_after(before)
    assert any(before[key][2] != row for key, (_, _, row, *_) in after.items())  # rows did move
    assert_points_at_its_rows(store)
    assert prune(store, keep_runs=1).keys_dropped == 0 and index_rows(store) == after


@pytest.mark.parametrize("old_index", [False, True], ids=["index with files", "index from before files"])
def test_a_prune_killed_after_its_journal_switch_is_reconciled_to_the_same_index(tmp_path, monkeypatch, old_index):
    store, done = tmp_path / "st", tmp_path / "done"
    build(store)
    build(done)
    prune(done, keep_runs=1)
    if old_index:  # a store whose index never recorded its shards' results files
        with sqlite3.connect(store / "keys.sqlite") as db:
            db.execute("UPDATE shards SET file = NULL")

    def killed(*args) -> None:
        raise KeyboardInterrupt  # after the journal switch and the old files' deletion

    monkeypatch.setattr(prune_module, "_update_index", killed)
    with pytest.raises(KeyboardInterrupt):
        prune(store, keep_runs=1)
    monkeypatch.undo()
    assert_points_at_its_rows(store)  # the next open reindexed the rewritten shards
    assert without_rows(index_rows(store)) == without_rows(index_rows(done))
    assert prune(store, keep_runs=1).keys_dropped == 0
    assert index_rows(store) == index_rows(done)
