"""The last guard: a result with a NaN or infinite logit or probability is never committed; it is
that record's error (and its hidden states are not kept), in a scoring run and in --rehead.

The non-finite numbers come from a real head whose `score` type embedding is NaN: records with a
score question get NaN logits, records with only noul questions are untouched."""

from __future__ import annotations

import copy
import math
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.engines.local.pipeline import ScoreJob
from clef_cli.inputs.records import QUESTION_TYPES
from clef_cli.model.scoring import Scorer
from clef_cli.store.checkpoint import Checkpoint

from .support.helpers import TINY_MODEL, settings_for, write_jsonl

NOUL = {"ok": {"type": "noul", "instructions": "Fine?"}}
SCORE = {"level": {"type": "score", "criteria": ["low", "mid", "high"]}, "ok": {"type": "noul"}}
SCORE_TYPE = QUESTION_TYPES["score"]


def records(count: int = 6) -> list[dict]:
    return [
        {"id": f"r{i}", "state": f"state number {i} " * (i + 1), "questions": SCORE if i % 2 else NOUL}
        for i in range(count)
    ]


def nan_score_head(scorer: Scorer) -> Scorer:
    head = copy.deepcopy(scorer.head)
    with torch.no_grad():
        head.type_embedding.weight[SCORE_TYPE] = float("nan")
    return Scorer(backbone=scorer.backbone, head=head, pad_token_id=scorer.pad_token_id, release=scorer.release)


def all_numbers_finite(row: dict) -> bool:
    numbers = [row_answer[key] for row_answer in row["answers"] or [] for key in ("confidence", "noul", "score")]
    numbers += [
        label[key] for answer in row["answers"] or [] for label in answer["labels"] for key in ("probability", "logit")
    ]
    return all(number is None or math.isfinite(number) for number in numbers)


def test_a_non_finite_result_is_the_records_error_and_keeps_no_hidden_states(tmp_path, scorer):
    inputs = write_jsonl(tmp_path / "in.jsonl", records())
    settings = settings_for(tmp_path, inputs=[inputs], hidden_states="keep", max_batch_size=4)
    summary = ScoreJob(settings, scorer=nan_score_head(scorer)).run()
    assert (summary.scored, summary.failed) == (3, 3)
    rows = pq.read_table(settings.output).to_pylist()
    assert [row["id"] for row in rows] == [f"r{i}" for i in range(6)]
    for row in rows:
        assert all_numbers_finite(row)
        if int(row["id"][1:]) % 2:
            assert row["answers"] is None
            assert row["error"] == (
                f"record {row['id']!r}, field 'questions.level': the model gave non-finite logits (NaN or infinity); "
                "no scores are written for this record"
            )
            assert row["prompt_tokens"] > 0
        else:
            assert row["error"] is None and row["answers"][0]["labels"][0]["probability"] > 0
    checkpoint = Checkpoint.open_existing(settings.output.with_name(settings.output.name + ".ckpt"))
    stored = [record.encoded.record.id for _, shard in checkpoint.hidden_reader().by_shard() for record in shard]
    assert sorted(stored) == ["r0", "r2", "r4"]


def nan_head_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "nan-head"
    folder.mkdir()
    shutil.copy(TINY_MODEL / "joint_head_config.json", folder)
    state = load_file(str(TINY_MODEL / "joint_head.safetensors"))
    state["type_embedding.weight"][SCORE_TYPE] = float("nan")
    save_file(state, str(folder / "joint_head.safetensors"))
    return folder


@pytest.mark.slow
def test_rehead_turns_non_finite_results_into_errors(tmp_path):
    inputs = write_jsonl(tmp_path / "in.jsonl", records())
    output = tmp_path / "out.parquet"
    common = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--hidden-dtype", "float32"]
    runner = CliRunner()
    first = runner.invoke(app, ["score", str(inputs), "-o", str(output), *common])
    assert first.exit_code == 0, first.output
    reheaded = tmp_path / "rehead.parquet"
    checkpoint = ["--checkpoint", str(output) + ".ckpt", "--rehead", str(nan_head_folder(tmp_path))]
    result = runner.invoke(app, ["score", str(inputs), "-o", str(reheaded), *common, *checkpoint])
    assert result.exit_code == 3, result.output
    rows = pq.read_table(reheaded).to_pylist()
    assert [row["id"] for row in rows] == [f"r{i}" for i in range(6)]
    assert [row["error"] is None for row in rows] == [True, False] * 3
    assert all(all_numbers_finite(row) for row in rows)
    assert "field 'questions.level': the model gave non-finite logits" in rows[1]["error"]
