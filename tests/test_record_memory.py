"""One huge record adds a bounded amount to a job's peak memory, and the other records are scored
(issue 50, Deliver 4 and 5): measured as benchmarks/scale/record_memory.py measures it, each job a
fresh `clef score` process, at the issue's sizes, with the goal (512 MiB) as the assertion."""

from __future__ import annotations

import pytest

from benchmarks.scale.record_memory import GOAL_MIB, measure

RECORDS = 12


@pytest.mark.slow
def test_a_huge_state_a_gzip_bomb_and_a_huge_cell_each_add_at_most_the_goal(tmp_path):
    results = measure(["state", "bomb", "cell"], RECORDS, tmp_path)
    plain = results["plain"]
    assert plain["exit"] == 0 and plain["scored"] == RECORDS
    for case in ("state", "bomb", "cell"):
        added = results[case]["peak_mib"] - plain["peak_mib"]
        assert added <= GOAL_MIB, (case, added, results[case]["stderr"])
    assert results["state"]["scored"] == RECORDS and "huge" not in results["state"]["errors"]  # cut, then scored
    assert results["bomb"]["scored"] == RECORDS
    assert "over --max-record-bytes" in next(iter(results["bomb"]["errors"].values()))
    cell = results["cell"]
    huge = cell["errors"]["huge"]  # its page is larger than a cell may be: never decompressed
    assert huge.startswith("record 'huge', field 'images[0]': ") and "are not read" in huge, huge
    assert cell["scored"] == RECORDS - (len(cell["errors"]) - 1)  # only the huge cell's row group is refused
    assert len(cell["errors"]) <= 8
