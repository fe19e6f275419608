"""What an engine cannot do is no verdict on the record (issue 36.5): a prompt longer than vLLM's
max_model_len is refused at planning as `overflow`, never
stored as its key's final result, refused again while the limit stands (vLLM not loaded for it),
and scored once the limit is raised. The vLLM engine's lifecycle runs here with the HF scorer in
the worker's place (the real worker: tests/test_vllm_engine.py), so this runs in seconds."""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clef_cli.engines.local.pipeline import ScoreJob
from clef_cli.engines.vllm.job import VllmScoreJob
from clef_cli.engines.vllm.limits import engine_refusal, prompt_limit
from clef_cli.errors import RETRIED_KINDS
from clef_cli.job.settings import VllmOptions
from clef_cli.release import resolve_release
from clef_cli.store.key_index import KeyIndex

from .support.helpers import TINY_MODEL, settings_for

RECORDS = 6
LIMIT = 900  # the first six sample records are 651 to 1,086 tokens long


class CountingScorer:
    """The HF scorer, counting the records it is asked to run."""

    def __init__(self, scorer) -> None:
        self.scorer, self.records = scorer, 0
        self.head, self.backbone = scorer.head, scorer.backbone

    def hidden_states(self, records, batch=None):
        self.records += len(records)
        return self.scorer.hidden_states(records, batch)

    def __getattr__(self, name):
        return getattr(self.scorer, name)


def vllm_job(folder, scorer, max_model_len):
    settings = settings_for(folder, limit=RECORDS, hidden_states="drop", engine="vllm", dtype="float32",
                            vllm=VllmOptions(max_model_len=max_model_len))  # fmt: skip
    return VllmScoreJob(settings, scorer=scorer)


@pytest.fixture
def with_vllm_python(monkeypatch):
    monkeypatch.setenv("CLEF_VLLM_PYTHON", sys.executable)  # the preflight's check; no worker starts


def rows(path):
    return {row["id"]: row for row in pq.read_table(path).to_pylist()}


def test_a_prompt_over_the_engines_limit_runs_again_once_the_limit_is_raised(tmp_path, scorer, with_vllm_python):
    counting = CountingScorer(scorer)
    first = vllm_job(tmp_path, counting, LIMIT).run()
    out = rows(tmp_path / "out.parquet")
    over = {rid for rid, row in out.items() if row["error"] is not None}
    assert over and len(over) < RECORDS
    assert {out[rid]["error_kind"] for rid in over} == {"overflow"}
    assert all("max_model_len of 900" in out[rid]["error"] for rid in over)
    assert all(out[rid]["prompt_tokens"] > LIMIT for rid in over)
    assert counting.records == RECORDS - len(over) == first.forwarded

    counting.records = 0
    same = vllm_job(tmp_path, counting, LIMIT).run()  # the limit stands: refused again, at planning
    assert (same.retried, same.forwarded, counting.records) == (len(over), 0, 0)
    assert {rid for rid, row in rows(tmp_path / "out.parquet").items() if row["error"]} == over

    raised = vllm_job(tmp_path, counting, 65536).run()
    assert (raised.retried, raised.forwarded, raised.failed) == (len(over), len(over), 0)
    alone = tmp_path / "alone"
    alone.mkdir()
    ScoreJob(settings_for(alone, limit=RECORDS, hidden_states="drop", dtype="float32"), scorer=scorer).run()
    want, got = rows(alone / "out.parquet"), rows(tmp_path / "out.parquet")
    for rid in over:
        a, b = got[rid]["answers"], want[rid]["answers"]
        assert [x["answer"] for x in a] == [y["answer"] for y in b]


def test_the_dry_run_counts_the_prompts_over_the_limit_as_the_run_refuses_them(tmp_path, with_vllm_python):
    report = vllm_job(tmp_path, None, LIMIT).dry_run()
    over = sum(length > LIMIT for length in report.lengths)
    assert over and report.over_engine_limit == over and report.engine_limit == LIMIT
    assert report.failed_by_kind.get("overflow") == over and report.valid == RECORDS - over
    assert not (tmp_path / "out.parquet.ckpt").exists()


def test_engine_limits_and_chance_are_never_a_keys_final_result(tmp_path):
    index = KeyIndex(tmp_path / "keys.sqlite")
    kinds = [None, "invalid", "media", "overflow", "unsupported", "transient"]
    table = pa.table({"record_key": [f"k{i}" for i in range(len(kinds))], "error_kind": kinds,
                      "error": [None] + ["e"] * (len(kinds) - 1)})  # fmt: skip
    index.add_shard("00000001", table, has_hidden=False, run_seq=index.begin_run("r"))
    final = dict(index.db.execute("SELECT key, final FROM keys").fetchall())
    assert {kinds[int(key[1:])]: flag for key, flag in final.items()} == {
        None: 1,
        "invalid": 1,
        "media": 1,
        "overflow": 0,
        "unsupported": 0,
        "transient": 0,
    }
    assert set(RETRIED_KINDS) == {"overflow", "unsupported", "transient"}
    index.close()


def test_the_limit_is_the_option_else_the_releases(tmp_path):
    release = resolve_release(str(TINY_MODEL))
    derived = release.text_config["max_position_embeddings"]
    assert prompt_limit(settings_for(tmp_path, engine="vllm"), release) == derived
    assert prompt_limit(settings_for(tmp_path, engine="vllm", vllm=VllmOptions(max_model_len=77)), release) == 77
    assert engine_refusal(78, 77)[0] == "overflow"
    assert engine_refusal(77, 77) is None
    assert engine_refusal(10**6, None) is None


def test_a_vllm_load_failure_is_one_line_and_the_log_has_the_whole_error(tmp_path, monkeypatch):
    """The worker started in an environment without vLLM fails its load: one line on stderr with
    the log's path (exit 1); vllm.log holds a header with the time and vLLM's whole traceback."""
    from typer.testing import CliRunner

    from clef_cli.cli import app

    monkeypatch.setenv("CLEF_VLLM_PYTHON", sys.executable)  # a Python, but without vLLM
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(app, ["score", str(TINY_MODEL.parent.parent.parent / "sample_data" / "records.jsonl"),
                                      "-o", str(out), "--model", str(TINY_MODEL), "--engine", "vllm", "--limit", "2",
                                      "--workers", "0", "--quiet", "--cpu-kv-cache-gib", "1"])  # fmt: skip
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: vLLM failed while loading the model: ModuleNotFoundError")
    log = tmp_path / "out.parquet.ckpt" / "vllm.log"
    assert f"(its log: {log})" in lines[0]
    text = log.read_text()
    assert text.lstrip().startswith("===== clef ") and "Traceback" in text
