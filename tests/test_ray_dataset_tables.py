"""`--ray` reading a `datasets` table with inline images (issue 47): the Ray actors build the
mapped records from the rows the read tasks pass them, and score and key them as the single
process scores the same records with image files."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clef_cli.engines.local.pipeline import ScoreJob
from clef_cli.inputs.columns import ColumnMapping

from .support.helpers import MEDIA, SMALL_JOB, assert_same_rows, require, require_ray, settings_for, write_jsonl
from .test_ray import ray_job

require_ray()
datasets = require("datasets")
pytestmark = pytest.mark.ray
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Is this urgent?"}}


@pytest.mark.slow
def test_ray_scores_a_datasets_image_table_as_its_files(cluster, tmp_path):
    names = ["image_a.png", "image_b.png"]
    folder = tmp_path / "files"
    folder.mkdir()
    for name in names:
        shutil.copy(MEDIA / name, folder / name)
    records = [{"id": f"r{i}", "state": f"ticket {i}", "pics": [names[i % 2], names[(i + 1) % 2]][: 1 + i % 2]}
               for i in range(12)]  # fmt: skip
    files = write_jsonl(folder / "records.jsonl",
                        [{"id": r["id"], "state": r["state"], "images": r["pics"]} for r in records])  # fmt: skip
    features = datasets.Features({"id": datasets.Value("string"), "state": datasets.Value("string"),
                                  "pics": datasets.List(datasets.Image())})  # fmt: skip
    rows = [r | {"pics": [{"bytes": (MEDIA / name).read_bytes(), "path": name} for name in r["pics"]]} for r in records]
    table = tmp_path / "table.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=features.arrow_schema), table, row_group_size=4)
    read = datasets.Dataset.from_parquet(str(table), cache_dir=str(tmp_path / "hf-cache"))
    assert isinstance(read.features["pics"].feature, datasets.Image)
    (tmp_path / "questions.json").write_text(json.dumps(QUESTIONS))
    common = SMALL_JOB | {"questions": tmp_path / "questions.json"}
    ScoreJob(settings_for(tmp_path, [files], "local.parquet", **common)).run()
    mapping = ColumnMapping((("images", "pics"),))
    summary = ray_job(settings_for(tmp_path, [table], "ray.parquet", columns=mapping, **common), block_records=4).run()
    assert summary.records == 12 and summary.failed == 0
    got = pq.read_table(tmp_path / "ray.parquet").to_pylist()
    want = pq.read_table(tmp_path / "local.parquet").to_pylist()
    assert_same_rows(got, want, probability_tolerance=1e-5)
    assert [row["record_key"] for row in got] == [row["record_key"] for row in want]
