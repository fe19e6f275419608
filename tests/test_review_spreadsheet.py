"""`clef review`'s flat files in a spreadsheet: no text cell a record controls can start a formula
(OWASP's CSV injection list), questions whose ids look like each other's columns never share one,
and the reviewed file reads back as gold under the records' own ids, questions and answers."""

from __future__ import annotations

import csv
import io
import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.quality.labels.gold import read_gold_rows
from clef_cli.quality.labels.spreadsheet import cell_text, safe_cell
from clef_cli.results import RESULT_SCHEMA

runner = CliRunner()
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""OWASP's list, written out here rather than imported, so the test checks the module's own."""

QUESTIONS = {  # question id -> options (hostile ones included)
    "r": ("@SUM(A1)", "b"),
    "r.probability": ("-1+1", "=cmd|' /C calc'!A0", "'=quoted"),
    '=HYPERLINK("http://x")': ("yes", "+no"),
    "-minus": ("-", "@"),  # (gold strips the spaces around a label, so no tab or CR here)
    "": ("x", "y"),
    "50%": ("a", "b"),
}
IDS = ["=1+1", "+2", "-3", "@4", "\t5", "\r6", "'=7", "plain", "''-9", "é=10", "row\r=11", "row\n@12"]


def answer(qid: str, options: tuple[str, ...], chosen: int) -> dict:
    probabilities = [0.1 / (len(options) - 1)] * len(options)
    probabilities[chosen] = 0.9
    return {"question_id": qid, "type": "choice", "answer": options[chosen], "confidence": 0.9, "noul": None,
            "score": None, "labels": [{"label": o, "probability": p, "logit": math.log(p)}
                                      for o, p in zip(options, probabilities, strict=True)]}  # fmt: skip


@pytest.fixture
def hostile(tmp_path):
    """A scored file whose ids, question ids and answers start formulas; (path, expected answers)."""
    rows, expected = [], {}
    for index, record_id in enumerate(IDS):
        answers = [answer(q, options, (index + k) % len(options)) for k, (q, options) in enumerate(QUESTIONS.items())]
        rows.append({"id": record_id, "record_index": index, "prompt_tokens": 9, "state_tokens_cut": 0,
                     "error": None, "answers": answers})  # fmt: skip
        expected[record_id] = {a["question_id"]: (a["answer"], 0.9) for a in answers}
    table = pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)
    path = tmp_path / "scored.parquet"
    pq.write_table(table.replace_schema_metadata({"clef.model": "m", "clef.head_sha256": "ab" * 32}), path)
    return path, expected


def written(scored, tmp_path, name: str) -> str:
    out = tmp_path / name
    result = runner.invoke(app, ["review", str(scored), "-o", str(out)])
    assert result.exit_code == 0, result.output
    with open(out, encoding="utf-8", newline="") as handle:  # a CR inside a cell stays a CR
        return handle.read()


def test_no_csv_cell_starts_a_formula(hostile, tmp_path):
    scored, _ = hostile
    text = written(scored, tmp_path, "review.csv")
    cells = [cell for row in csv.reader(io.StringIO(text, newline="")) for cell in row]
    assert len(cells) == (len(IDS) + 1) * (3 + 2 * len(QUESTIONS))
    starting = [cell for cell in cells if cell.startswith(FORMULA_STARTS)]
    assert starting == []
    assert "'=1+1" in cells and "'@SUM(A1)" in cells and "''=7" in cells and "'''-9" in cells
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    assert all(float(row["confidence"]) == 0.9 for row in rows)  # numbers clef computes stay numbers
    assert [int(row["record_index"]) for row in rows] == sorted(int(row["record_index"]) for row in rows)


@pytest.mark.parametrize("name", ["review.csv", "review.jsonl"])
def test_questions_never_share_a_column(hostile, tmp_path, name):
    scored, expected = hostile
    text = written(scored, tmp_path, name)
    if name.endswith(".csv"):
        header = next(csv.reader(io.StringIO(text, newline="")))
    else:
        header = list(json.loads(text.splitlines()[0]))
    assert len(header) == len(set(header)) == 3 + 2 * len(QUESTIONS)
    assert [c for c in header if c in ("r", "r.probability", "r%2Eprobability", "r%2Eprobability.probability")] == [
        "r", "r.probability", "r%2Eprobability", "r%2Eprobability.probability"
    ]  # fmt: skip
    if name.endswith(".jsonl"):  # r's probability is kept beside r.probability's answer
        first = json.loads(text.splitlines()[0])
        assert first["r.probability"] == expected[first["id"]]["r"][1] == 0.9
        assert first["r%2Eprobability"] == expected[first["id"]]["r.probability"][0]


@pytest.mark.parametrize("name", ["review.csv", "review.jsonl"])
def test_the_reviewed_file_reads_back_as_gold(hostile, tmp_path, name):
    """Every id, question id and answer comes back exactly (escapes undone), and the columns that
    are no labels (record_index, confidence, the probabilities) are no gold problems."""
    scored, expected = hostile
    written(scored, tmp_path, name)
    rows, problems = read_gold_rows(tmp_path / name)
    assert problems == []
    assert {record_id: labels for record_id, labels in rows} == {
        record_id: {question_id: found for question_id, (found, _) in answers.items()}
        for record_id, answers in expected.items()
    }
    result = runner.invoke(
        app, ["eval", str(scored), "--gold", str(tmp_path / name), "--json", str(tmp_path / "m.json")]
    )
    assert result.exit_code == 0, result.output
    assert "gold problems" not in result.output
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["records"] == len(IDS) and metrics["joint_exact_match"] == 1.0
    assert list(metrics["questions"]) == list(QUESTIONS)
    tsv = runner.invoke(app, ["eval", str(scored), "--gold", str(tmp_path / name), "--format", "tsv"])
    assert tsv.exit_code == 0, tsv.output
    cells = [cell for row in tsv.stdout.splitlines() for cell in row.split("\t")]
    assert [cell for cell in cells if cell.startswith(FORMULA_STARTS)] == []  # question ids come from records
    assert '\'=HYPERLINK("http://x")' in cells and "'-minus" in cells


@given(st.text())
def test_the_escape_is_undone_exactly_and_leaves_no_formula(text):
    cell = safe_cell(text)
    assert not cell.startswith(FORMULA_STARTS)
    assert cell_text(cell) == text
    assert cell == text or cell == "'" + text
