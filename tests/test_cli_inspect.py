"""`clef inspect-spans`: both views, record selection and its error paths."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

from typer.testing import CliRunner

from clef_cli.cli import app

from .support.helpers import GOLDEN_RECORDS, TINY_MODEL, write_jsonl

runner = CliRunner()
BASE = ["inspect-spans", str(GOLDEN_RECORDS), "--model", str(TINY_MODEL), "--max-length", "1024"]


def test_json_view_input_ids_equal_the_encoder(golden_encoded):
    for position in (0, 4, 8):
        result = runner.invoke(app, [*BASE, "--index", str(position), "--json"])
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        encoded = golden_encoded[position]
        assert report["id"] == encoded.record.id
        assert report["input_ids"] == encoded.input_ids
        assert report["prompt_tokens"] == encoded.length
        assert report["option_order"] == {q.question_id: list(q.option_ids) for q in encoded.questions}
        for question, reported in zip(encoded.questions, report["questions"], strict=True):
            assert reported["question_span"] == list(question.question_span)
            assert [o["span"] for o in reported["options"]] == [list(s) for s in question.option_spans]


def test_json_view_media_and_state_totals(expected):
    result = runner.invoke(app, [*BASE, "--id", "a09-video-with-sound", "--json"])
    report = json.loads(result.stdout)
    assert report["use_audio_in_video"] is True
    assert report["media_tokens"]["video"] > 0 and report["media_tokens"]["audio"] > 0
    assert report["media_tokens"]["image"] == 0
    truncated = json.loads(runner.invoke(app, [*BASE, "--id", "a11-truncated-state", "--json"]).stdout)
    assert truncated["state_tokens_cut"] > 0
    assert truncated["prompt_tokens"] == 1024


def test_human_view_shows_prompt_spans_table_and_totals():
    result = runner.invoke(app, [*BASE, "--id", "a05-one-image"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "[70 image tokens]" in out
    assert "<|image_pad|>" not in out
    assert "main_colour" in out and "yellow" in out
    assert "prompt tokens: 427 of max length 1024" in out
    assert "media tokens: image 70, audio 0, video 0" in out
    assert "state tokens:" in out and "0 cut" in out


def test_record_selection_errors_are_usage_errors():
    result = runner.invoke(app, [*BASE, "--index", "99"])
    assert result.exit_code == 2
    assert "has no record at index 99" in result.stderr
    result = runner.invoke(app, [*BASE, "--id", "nope"])
    assert result.exit_code == 2 and "no record with id 'nope'" in result.stderr
    result = runner.invoke(app, [*BASE, "--id", "a01-text-noul", "--index", "1"])
    assert result.exit_code == 2 and "not both" in result.stderr


def test_invalid_record_is_one_line_and_exit_1(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [{"id": "x", "state": "s", "questions": {"q": {"type": "rank"}}}])
    result = runner.invoke(app, ["inspect-spans", str(path), "--model", str(TINY_MODEL)])
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: record 'x', field 'questions.q.type': "
        "unknown question type 'rank' (expected one of noul, choice, score)"
    )
    assert "Traceback" not in result.output


def test_missing_model_is_one_line(tmp_path):
    result = runner.invoke(app, ["inspect-spans", str(GOLDEN_RECORDS), "--model", str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: model folder not found: {tmp_path / 'nowhere'}"


def test_python_dash_m_and_version():
    done = subprocess.run([sys.executable, "-m", "clef_cli", "--version"], capture_output=True, text=True, check=True)
    assert done.stdout == f"clef {version('clef-cli')}\n"
    helped = subprocess.run([sys.executable, "-m", "clef_cli", "--help"], capture_output=True, text=True, check=True)
    assert "inspect-spans" in helped.stdout


def test_ignored_noul_criteria_keys_are_shown(tmp_path):
    record = {
        "id": "typo",
        "state": "s",
        "questions": {
            "urgent": {"type": "noul", "criteria": {"true": "Yes.", "maybe": "Unsure."}},
            "team": {"type": "choice", "criteria": {"a": None, "b": None}},
        },
    }
    path = write_jsonl(tmp_path / "r.jsonl", [record])
    args = ["inspect-spans", str(path), "--model", str(TINY_MODEL)]
    human = runner.invoke(app, args)
    assert human.exit_code == 0, human.output
    assert "urgent: criteria keys ignored: maybe" in human.stdout
    assert "team: criteria keys ignored" not in human.stdout
    report = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert [q["ignored_criteria"] for q in report["questions"]] == [["maybe"], []]
    assert report["option_order"]["urgent"] == ["true", "false"]
