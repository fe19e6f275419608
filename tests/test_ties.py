"""Exact ties, for every question type, follow the rule in DESIGN.md and the README: noul goes to
`true` (head order: true, false), choice to the first tied option in the record's criteria order,
score to the lowest tied level (head order). Checked in the answer rules, and end to end through a
release whose head gives every option the same logit."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.inputs.records import Question
from clef_cli.model.answers import derive_answer, question_result

from .support.helpers import TINY_MODEL, write_jsonl

runner = CliRunner()

NOUL = Question("urgent", "noul", "?", (("true", None), ("false", None)), ("true", "false"))
# head order is sorted (alpha, mid, zeta); the record lists zeta first, then alpha, then mid
CHOICE = Question("team", "choice", "?", (("alpha", "a"), ("mid", "m"), ("zeta", "z")), ("zeta", "alpha", "mid"))
SCORE = Question("level", "score", "?", (("0", "low"), ("1", "mid"), ("2", "high"), ("3", "top")), ("0", "1", "2", "3"))


def test_a_tied_noul_answers_true():
    result = question_result(NOUL, torch.tensor([0.25, 0.25]))
    assert (result.answer, result.confidence, result.noul) == ("true", 0.5, 0.5)
    assert derive_answer("noul", ("true", "false"), (0.5, 0.5), ("true", "false")).answer == "true"
    assert question_result(NOUL, torch.tensor([0.25, 0.5])).answer == "false"  # no tie: the larger wins


@pytest.mark.parametrize(
    ("logits", "expected"),
    [
        ([1.0, 1.0, 1.0], "zeta"),  # all tied: first in the criteria order
        ([1.0, 1.0, -3.0], "alpha"),  # alpha and mid tied on top, zeta lower: alpha comes first in the record
        ([-3.0, 1.0, 1.0], "zeta"),  # mid and zeta tied: zeta comes first in the record
        ([0.0, 2.0, 1.0], "mid"),
    ],
)
def test_a_tied_choice_answers_the_first_tied_option_in_the_records_order(logits, expected):
    result = question_result(CHOICE, torch.tensor(logits))
    assert result.answer == expected
    assert result.confidence == max(result.probabilities)


@pytest.mark.parametrize(
    ("logits", "expected"),
    [
        ([0.5, 0.5, 0.5, 0.5], "0"),
        ([-1.0, 2.0, 2.0, 0.0], "1"),  # levels 1 and 2 tied on top: the lower level
        ([-1.0, 0.0, 2.0, 2.0], "2"),
    ],
)
def test_a_tied_score_answers_the_lowest_tied_level(logits, expected):
    result = question_result(SCORE, torch.tensor(logits))
    assert result.answer == expected
    assert result.confidence == max(result.probabilities)
    assert result.score == pytest.approx(sum(level * p for level, p in enumerate(result.probabilities)), abs=1e-12)


def tied_release(folder):
    """The tiny release with a head whose every logit is exactly 0: both logit scales at exp(-200),
    which is 0 in float32, and a zero residual scorer output."""
    shutil.copytree(TINY_MODEL, folder)
    for path in folder.iterdir():
        path.chmod(0o644)
    weights = load_file(str(folder / "joint_head.safetensors"))
    weights["prior_logit_scale"] = torch.tensor(-200.0)
    weights["joint_logit_scale"] = torch.tensor(-200.0)
    weights["residual_scorer.3.weight"] = torch.zeros_like(weights["residual_scorer.3.weight"])
    weights["residual_scorer.3.bias"] = torch.zeros_like(weights["residual_scorer.3.bias"])
    save_file(weights, str(folder / "joint_head.safetensors"), metadata={"format": "pt"})
    return folder


def test_ties_through_the_scorer_end_to_end(tmp_path):
    release = tied_release(tmp_path / "tied")
    questions = {
        "urgent": {"type": "noul", "instructions": "Urgent?"},
        "team": {"type": "choice", "criteria": {"zeta": "Last", "alpha": "First", "mid": None}},
        "level": {"type": "score", "criteria": ["low", "mid", "high", "top"]},
    }
    records = [{"id": f"t{i}", "state": "ticket " + "word " * (2 + 5 * i), "questions": questions} for i in range(3)]
    inputs = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out.parquet"
    args = ["score", str(inputs), "-o", str(out), "--model", str(release), "--workers", "0", "--quiet"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 3
    for row in rows:
        by_question = {answer["question_id"]: answer for answer in row["answers"]}
        for answer in row["answers"]:
            labels = answer["labels"]
            assert {label["logit"] for label in labels} == {0.0}, json.dumps(answer)
            assert {label["probability"] for label in labels} == {labels[0]["probability"]}  # exactly tied
        assert [label["label"] for label in by_question["team"]["labels"]] == ["alpha", "mid", "zeta"]
        assert (by_question["urgent"]["answer"], by_question["urgent"]["noul"]) == ("true", 0.5)
        assert by_question["team"]["answer"] == "zeta"
        assert by_question["level"]["answer"] == "0"
        assert by_question["level"]["score"] == pytest.approx(1.5, abs=1e-12)
        assert by_question["level"]["confidence"] == pytest.approx(0.25, abs=1e-12)
