"""The parts that keep a job's memory flat (issue 39): ids seen spill to disk, the output reads
shards through a bounded cache and writes row groups from ordered chunks, and every one of them
gives the answers the whole-job versions gave."""

from __future__ import annotations

import pyarrow as pa
import pytest

from clef_cli.errors import ClefError
from clef_cli.inputs.records import InvalidRecord, RecordBuilder
from clef_cli.inputs.seen_ids import SeenIds
from clef_cli.job.output import row_groups
from clef_cli.results import RESULT_SCHEMA, FailedRecord, results_table
from clef_cli.store.ledger import ShardCache

QUESTION = {"q": {"type": "noul", "instructions": "Is it?"}}


def test_seen_ids_find_the_first_use_in_memory_and_after_spilling():
    seen = SeenIds(in_memory=3)
    assert [seen.first_use(f"id{n}", n) for n in range(7)] == [None] * 7
    assert seen.db is not None and len(seen.recent) == 1  # six ids on disk, the seventh in memory
    assert seen.first_use("id0", 10) == 0  # from disk
    assert seen.first_use("id6", 11) == 6  # from memory
    assert seen.first_use("id3", 12) == 3
    assert seen.first_use("new", 13) is None and seen.first_use("new", 14) == 13
    seen.close()


def test_a_duplicate_id_far_apart_is_refused_with_its_first_index():
    builder = RecordBuilder(_seen_ids=SeenIds(in_memory=2))
    built = [builder.build({"id": f"r{n % 5}", "state": "s", "questions": QUESTION}, n, None) for n in range(8)]
    invalid = [(item.index, item.error) for item in built if isinstance(item, InvalidRecord)]
    assert [index for index, _ in invalid] == [5, 6, 7]
    assert all(f"first used by record {index - 5}" in error for index, error in invalid)


def test_the_shard_cache_keeps_within_its_budget_and_takes_the_right_rows():
    opened: list[str] = []

    def open_shard(name: str) -> pa.Table:
        opened.append(name)
        failed = [FailedRecord(f"{name}-{row}", row, "e") for row in range(100)]
        return results_table([], failed)

    one = open_shard("probe").nbytes
    cache = ShardCache(open_shard, budget=one + one // 2)  # room for one shard, not two
    for name in ("a", "b", "a", "b"):
        taken = cache.take(name, [5, 1])
        assert taken.column("id").to_pylist() == [f"{name}-5", f"{name}-1"]
        assert len(cache.tables) == 1 and cache.bytes <= cache.budget
    assert opened == ["probe", "a", "b", "a", "b"]
    roomy = ShardCache(open_shard, budget=10 * one)
    for name in ("c", "d", "c", "d"):
        roomy.take(name, [0])
    assert opened[-2:] == ["c", "d"]  # opened once each
    counted = ShardCache(open_shard, budget=10 * one, count=2)  # room in bytes, not in shards
    for name in ("e", "f", "g", "e"):
        counted.take(name, [0])
        assert len(counted.tables) <= 2
    assert opened[-4:] == ["e", "f", "g", "e"]


def test_the_shard_cache_holds_a_shard_of_many_batches_as_one_copy_out_of_its_map(tmp_path):
    """A mapped shard of many small batches costs several times its bytes while kept; the cache
    keeps it as one batch copied into its own memory."""
    table = _rows(0, 90)
    path = tmp_path / "shard.arrow"
    with pa.ipc.new_file(str(path), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=10):
            writer.write_batch(batch)

    def open_shard(name: str) -> pa.Table:
        return pa.ipc.open_file(pa.memory_map(str(path))).read_all()

    assert open_shard("s").column("id").num_chunks == 9
    cache = ShardCache(open_shard, budget=1 << 20)
    taken = cache.take("s", [42, 3, 89])
    assert taken.column("record_index").to_pylist() == [42, 3, 89]
    held = cache.tables["s"]
    assert all(column.num_chunks == 1 for column in held.columns)
    assert held.equals(table)


def _rows(start: int, count: int) -> pa.Table:
    return results_table([], [FailedRecord(str(n), n, "e") for n in range(start, start + count)])


def test_row_groups_cut_ordered_chunks_into_groups_of_the_asked_size():
    chunks = [_rows(0, 3), _rows(3, 0), _rows(3, 6), _rows(9, 2)]
    groups = list(row_groups(chunks, 4))
    assert [(start, table.num_rows) for start, table in groups] == [(0, 4), (4, 4), (8, 3)]
    assert [n for _, table in groups for n in table.column("record_index").to_pylist()] == list(range(11))
    assert all(table.schema == RESULT_SCHEMA for _, table in groups)


def _indexed(*indices: int) -> pa.Table:
    return results_table([], [FailedRecord(str(n), n, "e") for n in indices])


@pytest.mark.parametrize(
    "chunks",
    [
        [_rows(0, 3), _rows(4, 2)],
        [_rows(0, 3), _rows(2, 2)],
        [_rows(1, 3)],
        [_indexed(0, 1, 2, 2)],  # each chunk starts right: only its later rows are wrong
        [_indexed(0, 1, 3, 4)],
    ],
    ids=["gap", "twice", "late", "twice-inside", "gap-inside"],
)
def test_row_groups_refuse_a_result_missing_or_repeated(chunks):
    with pytest.raises(ClefError, match="exactly one result per input record"):
        list(row_groups(chunks, 4))


def test_shard_names_start_over_on_another_list_of_the_same_length():
    """A list reread after a prune can be exactly as long as the one followed: its entries, not
    the remembered ones, are the answer (restarting only on a shorter list kept the old)."""
    from types import SimpleNamespace

    from clef_cli.store.shard_names import ShardNames

    names = ShardNames()
    old = [SimpleNamespace(name="00000001"), SimpleNamespace(name="00000009")]
    assert names.next_name(old) == "00000010"
    rewritten = [SimpleNamespace(name="00000001"), SimpleNamespace(name="00000004")]
    assert names.next_name(rewritten) == "00000005"
    assert names.entry(rewritten, "00000004") is rewritten[1] and names.entry(rewritten, "00000001") is rewritten[0]
    with pytest.raises(KeyError):
        names.entry(rewritten, "00000009")


def test_shard_names_follow_appends_and_start_over_on_another_list():
    from types import SimpleNamespace

    from clef_cli.store.shard_names import ShardNames

    names = ShardNames()
    entries = [SimpleNamespace(name="00000002"), SimpleNamespace(name="ray-x")]
    assert names.next_name(entries) == "00000003"
    entries.append(SimpleNamespace(name="00000007"))
    assert names.next_name(entries) == "00000008" and names.entry(entries, "ray-x") is entries[1]
    pruned = [SimpleNamespace(name="00000004")]
    assert names.next_name(pruned) == "00000005"
    with pytest.raises(KeyError):
        names.entry(pruned, "00000007")
