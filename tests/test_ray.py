"""`clef score --ray`: the same results as the single-process job, through 2 Ray actors, and a
rerun after an interrupted Ray run skips what was already scored."""

from __future__ import annotations

import threading

import pyarrow.parquet as pq
import pytest

from clef_cli.engines.local.pipeline import ScoreJob, ScoreSettings
from clef_cli.progress import Progress

from .support.helpers import SAMPLE_DATA, SMALL_JOB, assert_same_rows, require_ray, settings_for, write_jsonl

ray = require_ray()
pytestmark = pytest.mark.ray


@pytest.mark.slow
def test_blocks_read_ahead_wait_in_the_object_store_and_scored_blocks_come_inline(cluster):
    """Under the job's runtime environment a read task's 20 KB result (a block of 256 short records
    is larger) is put in Ray's object store, where Ray would otherwise keep it inline in its owner,
    the driver; a 1 KB result stays inline, and so does an actor's 20 KB scored block."""
    from clef_cli.engines.ray.job import actor_inline_env

    @ray.remote
    def result(size: int) -> bytes:
        return b"x" * size

    @ray.remote(runtime_env={"env_vars": actor_inline_env()})
    class Actor:
        def result(self, size: int) -> bytes:
            return b"x" * size

    actor = Actor.remote()
    large, small, scored = result.remote(20_000), result.remote(1_000), actor.result.remote(20_000)
    ray.wait([large, small, scored], num_returns=3)
    where = ray.experimental.get_object_locations([large, small, scored])
    assert where[large]["node_ids"]
    assert not where[small]["node_ids"] and not where[scored]["node_ids"]


def synthetic(count: int = 300) -> list[dict]:
    questions = {
        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
        "team": {"type": "choice", "criteria": {"billing": "Money", "tech": None}},
        "level": {"type": "score", "criteria": ["low", "mid", "high"]},
    }
    rows = [{"id": f"s{i}", "state": "order " * (1 + i % 25), "questions": questions} for i in range(count)]
    rows[5] = {"id": "bad", "state": "x", "questions": {"q": {"type": "rank"}}}
    rows[9]["id"] = "s2"  # a duplicate id
    del rows[11]["id"]  # gets its position as id
    rows[13]["id"] = True  # an id that cannot be read: a null id, skipped by the duplicate check
    return rows


def ray_job(settings: ScoreSettings, stop: threading.Event | None = None, progress=None, block_records: int = 40):
    from clef_cli.engines.ray.job import RayScoreJob, RaySettings

    cluster = RaySettings(num_workers=2, cpus_per_worker=0.5, block_records=block_records)
    return RayScoreJob(settings, cluster, progress=progress, stop=stop)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ray-inputs")
    return [SAMPLE_DATA / "records.parquet", write_jsonl(folder / "synthetic.jsonl", synthetic())]


@pytest.fixture(scope="module")
def local_rows(inputs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("local")
    summary = ScoreJob(settings_for(folder, inputs, "local.parquet", **SMALL_JOB)).run()
    assert summary.records == 317 and summary.failed == 3
    return pq.read_table(folder / "local.parquet").to_pylist()


@pytest.mark.slow
def test_ray_run_equals_the_single_process_run(cluster, inputs, local_rows, tmp_path):
    summary = ray_job(settings_for(tmp_path, inputs, "ray.parquet", **SMALL_JOB)).run()
    assert summary.records == 317 and summary.failed == 3
    table = pq.read_table(tmp_path / "ray.parquet")
    assert table.schema.names == [
        "id", "record_index", "prompt_tokens", "state_tokens_cut", "error", "error_kind", "answers", "record_key"
    ]  # fmt: skip
    assert table.schema.metadata[b"clef.engine"] == b"ray"
    rows = table.to_pylist()
    assert_same_rows(rows, local_rows, probability_tolerance=1e-5)
    keyed = lambda table: [(row["record_key"], row["error_kind"]) for row in table]  # noqa: E731
    assert keyed(rows) == keyed(local_rows)
    errors = {row["id"]: row["error"] for row in rows if row["error"]}
    assert errors["bad"].startswith("record 'bad', field 'questions.q.type'")
    assert errors["s2"] == "record 's2', field 'id': duplicate record id (first used by record 19)"
    assert [row["id"] for row in rows if row["record_index"] == 30] == [None]  # records.parquet holds 17


class StopAfter(Progress):
    """Asks the job to stop once `count` records are committed (a Ctrl-C in the middle)."""

    def __init__(self, stop: threading.Event, count: int) -> None:
        self.stop, self.count, self.done = stop, count, 0

    def advance(self, records, tokens, failed):
        self.done += records
        if self.done >= self.count:
            self.stop.set()


@pytest.mark.slow
def test_rerun_after_an_interrupted_ray_run_skips_records_already_done(cluster, inputs, local_rows, tmp_path):
    stop = threading.Event()
    settings = settings_for(tmp_path, inputs, "resumed.parquet", **SMALL_JOB)
    # the synthetic records repeat their prompts under other ids: only the distinct ones run
    distinct = len({row["record_key"] for row in local_rows if row["record_key"] is not None})
    first = ray_job(settings, stop=stop, progress=StopAfter(stop, 5), block_records=8).run()
    assert first.interrupted
    assert not (tmp_path / "resumed.parquet").exists()
    committed = first.committed
    assert first.run == distinct and 5 <= committed < distinct
    second = ray_job(settings_for(tmp_path, inputs, "resumed.parquet", **SMALL_JOB)).run()
    assert second.reused == committed  # every committed row is one key, reused now
    # nothing committed is read or scored again; the 3 invalid records and later copies never run
    assert second.invalid == 3
    assert second.committed == second.run == 317 - 3 - second.duplicates - committed
    assert_same_rows(pq.read_table(tmp_path / "resumed.parquet").to_pylist(), local_rows, probability_tolerance=1e-5)
