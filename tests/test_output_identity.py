"""The streamed output is the output clef wrote before it streamed: byte for byte the files the
code of commit f9a19f9 wrote from the same store (tests/support/output_golden.py), in both layouts, with
pass-through columns and a calibration, over several row groups and shards."""

from __future__ import annotations

import json
import shutil

import pyarrow
import pyarrow.parquet as pq
import pytest

from tests.support.helpers import TINY_MODEL
from tests.support.output_golden import CASES, FOLDER, ROW_GROUP, STORE, prepare, run_case

META = json.loads((FOLDER / "meta.json").read_text())
SAME_WRITER = pyarrow.__version__ == META["pyarrow"]
"""Parquet's footer names the pyarrow that wrote it; another pyarrow gets the structural check."""


@pytest.mark.parametrize("case", sorted(CASES))
def test_output_is_byte_identical_to_the_unstreamed_writers(case, tmp_path):
    prepare(tmp_path, TINY_MODEL)
    shutil.copytree(FOLDER / STORE, tmp_path / STORE)
    written = run_case(tmp_path, case, tmp_path / STORE).read_bytes()
    golden = (FOLDER / f"{case}.parquet").read_bytes()
    if SAME_WRITER:
        assert written == golden
    new, old = pq.ParquetFile(pyarrow.BufferReader(written)), pq.ParquetFile(pyarrow.BufferReader(golden))
    assert new.schema_arrow.equals(old.schema_arrow, check_metadata=True)
    assert new.read().equals(old.read())
    sizes = [new.metadata.row_group(i).num_rows for i in range(new.metadata.num_row_groups)]
    assert sizes == [old.metadata.row_group(i).num_rows for i in range(old.metadata.num_row_groups)]
    if CASES[case]["layout"] == "wide":
        assert sizes == [ROW_GROUP, ROW_GROUP, ROW_GROUP, 3]
