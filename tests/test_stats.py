"""Where the time goes: the summary's model-busy figure, the --stats-json file, the advice line."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli import faults
from clef_cli.cli import app
from clef_cli.stats import ADVICE_THRESHOLD, STAGES, JobStats, modality

from .support.helpers import SAMPLE_DATA, TINY_MODEL, write_jsonl

runner = CliRunner()


def score(*args: str):
    return runner.invoke(app, ["score", *args, "--model", str(TINY_MODEL), "--quiet"])


def text_records(count: int) -> list[dict]:
    return [
        {"id": f"r{i}", "state": "word " * (5 + 7 * i), "questions": {"urgent": {"type": "noul"}}} for i in range(count)
    ]


@pytest.fixture(scope="module")
def media_input(tmp_path_factory):
    folder = tmp_path_factory.mktemp("media")
    shutil.copytree(SAMPLE_DATA / "media", folder / "media")
    records = [
        {"id": "t", "state": "plain text", "questions": {"q": {"type": "noul"}}},
        {"id": "i", "state": "a photo", "images": ["media/parcel.jpg"], "questions": {"q": {"type": "noul"}}},
        {"id": "a", "state": "a call", "audio": ["media/voicemail.wav"], "questions": {"q": {"type": "noul"}}},
        {"id": "bad", "state": "x", "questions": {"q": {"type": "choice", "criteria": []}}},
    ]
    return write_jsonl(folder / "records.jsonl", records)


def test_stats_json_is_consistent_with_the_output(media_input, tmp_path):
    out, stats_path = tmp_path / "out.parquet", tmp_path / "stats.json"
    result = score(str(media_input), "-o", str(out), "--workers", "0", "--stats-json", str(stats_path))
    assert result.exit_code == 3, result.output  # one invalid record
    assert "model busy " in result.stderr
    stats = json.loads(stats_path.read_text())
    rows = pq.read_table(out).to_pylist()
    assert stats["records"] == len(rows) == 4
    scored = [row for row in rows if row["error"] is None]
    assert stats["tokens"] == sum(row["prompt_tokens"] for row in scored)
    assert stats["real_tokens"] == stats["tokens"]
    assert stats["padded_tokens"] >= stats["real_tokens"]
    assert stats["padding_waste"] == pytest.approx(stats["padded_tokens"] / stats["real_tokens"] - 1, abs=1e-6)
    stages = stats["stages_seconds"]
    assert set(stages) == set(STAGES)
    assert all(value >= 0 for value in stages.values())
    assert stages["forward"] > 0 and stages["head"] > 0 and stages["load"] > 0
    assert sum(stages.values()) <= stats["wall_seconds"]
    in_scoring = stages["startup"] + stages["encode_wait"] + stages["forward"] + stages["head"] + stages["commit_wait"]
    assert in_scoring <= stats["scoring_seconds"] + 1e-6
    # start-up (imports, the processor) is a stage: the stages account for the scoring time, less
    # untimed bookkeeping (a ratio of two measured spans, not a duration; it was 0.07 unnamed)
    assert stages["startup"] > 0 and in_scoring >= 0.8 * stats["scoring_seconds"]
    shown = f"start-up {stages['startup']:.1f} s" in result.stderr
    assert shown is (stages["startup"] >= 0.05)  # the summary names a start-up of 0.05 s or more
    assert stats["scoring_seconds"] + stages["load"] <= stats["wall_seconds"]
    busy = (stages["forward"] + stages["head"]) / stats["scoring_seconds"]
    # the JSON rounds each time to 1e-6 s: (forward + head) is off by up to 1e-6, the scoring time by
    # 5e-7; and model_busy itself to 1e-6 (off by up to 5e-7)
    assert stats["model_busy"] == pytest.approx(busy, abs=5e-7 + 2e-6 / stats["scoring_seconds"])
    assert f"model busy {stats['model_busy']:.0%}" in result.stderr
    encode = stats["encode"]
    assert set(encode) == {"text", "image", "audio"}
    by_id = {row["id"]: row["prompt_tokens"] for row in scored}
    assert encode["image"]["tokens"] == by_id["i"] and encode["audio"]["tokens"] == by_id["a"]
    assert sum(item["records"] for item in encode.values()) == 3
    for item in encode.values():
        assert item["tokens_per_s"] == pytest.approx(item["tokens"] / item["seconds"], rel=1e-3)


def test_no_workers_advice_on_a_cpu_backbone_however_long_it_waited(tmp_path, monkeypatch):
    """On the CPU the encoding workers take the cores the model computes on: `--workers 1` made
    such a job slower (docs/scoring.md), so the summary does not advise it."""
    monkeypatch.setenv(faults.SLOW_ENCODE, "0.3")
    source = write_jsonl(tmp_path / "records.jsonl", text_records(4))
    out, stats_path = tmp_path / "out.parquet", tmp_path / "stats.json"
    result = score(str(source), "-o", str(out), "--workers", "0", "--device", "cpu", "--stats-json", str(stats_path))
    assert result.exit_code == 0, result.output
    stats = json.loads(stats_path.read_text())
    assert stats["stages_seconds"]["encode_wait"] >= 4 * 0.3  # each record planned once, slowly
    assert stats["encode_wait_share"] > ADVICE_THRESHOLD  # beside a GPU this would advise
    assert "--workers" not in result.stderr and "the model waited" not in result.stderr


def test_advice_names_media_and_modality_rules():
    stats = JobStats(scoring_seconds=10.0, workers=1)
    stats.stages["encode_wait"] = 3.5
    stats.stages["forward"] = 6.0
    stats.encoded("video", 100, 1.0)
    assert stats.model_busy == pytest.approx(0.6)
    assert stats.advice() == "the model waited 35% of the time for media decoding: add --workers (this run had 1)"
    stats.backbone_on_cpu = True  # the workers would take the model's cores
    assert stats.advice() is None
    stats.backbone_on_cpu = False
    stats.stages["encode_wait"] = 1.0
    assert stats.advice() is None
    assert [modality(0, 0, 0), modality(2, 0, 0), modality(0, 1, 0), modality(0, 0, 1), modality(1, 0, 1)] == [
        "text",
        "image",
        "audio",
        "video",
        "mixed",
    ]


def test_a_stage_opened_inside_another_counts_only_in_the_inner_one(monkeypatch):
    """A commit while waiting for the next window: the stages still add up to the wall time."""
    import clef_cli.stats as stats_module

    clock = iter([0.0, 1.0, 3.0, 4.0, 10.0, 11.0])  # outer in, inner in/out, outer out, then alone
    monkeypatch.setattr(stats_module.time, "perf_counter", lambda: next(clock))
    stats = JobStats()
    with stats.stage("encode_wait"), stats.stage("commit_wait"):
        pass
    with stats.stage("commit_wait"):
        pass
    assert stats.stages["commit_wait"] == 3.0  # 1 -> 3, and 10 -> 11
    assert stats.stages["encode_wait"] == 2.0  # 0 -> 4 less the 2 s inside
