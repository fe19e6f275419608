"""`clef eval`, `calibrate`, `compare` and `review` read a `--layout flat` output as they read the
wide output of the same results (issue 51): its `clef.flat_columns` metadata names each column's
question, option and question type, so records, answers, options in head order and
probabilities come back exactly; the log-probabilities stand for the logits (the same softmax at
every temperature). A flat file written with --calibration holds no logits to fit on: refused."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.quality.labels.scored import read_scored

from .support.helpers import SAMPLE_DATA, TINY_MODEL, write_jsonl

runner = CliRunner()
GOLD = SAMPLE_DATA / "posts_gold.jsonl"
POSTS = SAMPLE_DATA / "posts.jsonl"
QUESTIONS = SAMPLE_DATA / "questions.json"


def score(out, *args: str):
    options = ["--model", str(TINY_MODEL), "--workers", "0", "--hidden-states", "drop", *args]
    return runner.invoke(app, ["score", str(POSTS), "--questions", str(QUESTIONS), "-o", str(out), *options])


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """The sample posts scored once, written wide and flat from the one store."""
    root = tmp_path_factory.mktemp("flat")
    store = str(root / "store.ckpt")
    for layout in ("wide", "flat"):
        done = score(root / f"{layout}.parquet", "--layout", layout, "--checkpoint", store, "--quiet")
        assert done.exit_code == 0, done.output
    return root


def test_a_flat_output_reads_as_its_wide_twin(layouts):
    wide, flat = read_scored(layouts / "wide.parquet"), read_scored(layouts / "flat.parquet")
    assert (flat.ids, flat.options, flat.answers, flat.failed, flat.indices) == (
        wide.ids, wide.options, wide.answers, wide.failed, wide.indices
    )  # fmt: skip
    for record_id, questions in wide.scores.items():
        for question_id, (probabilities, logits) in questions.items():
            got_p, got_logits = flat.scores[record_id][question_id]
            assert got_p == probabilities  # the same float64 values
            shift = [a - b for a, b in zip(got_logits, logits, strict=True)]  # one constant per question
            assert max(shift) - min(shift) == pytest.approx(0, abs=1e-6)
    described = json.loads(pq.read_schema(layouts / "flat.parquet").metadata[b"clef.flat_columns"])
    assert {entry["type"] for entry in described} == {"noul", "choice", "score"}


def test_eval_calibrate_compare_and_review_read_a_flat_output(layouts, tmp_path):
    for layout in ("wide", "flat"):
        scored = str(layouts / f"{layout}.parquet")
        for args in (
            ["eval", scored, "--gold", str(GOLD), "--json", str(tmp_path / f"{layout}.metrics.json")],
            ["calibrate", scored, "--gold", str(GOLD), "-o", str(tmp_path / f"{layout}.cal.json")],
            ["review", scored, "-o", str(tmp_path / f"{layout}.review.jsonl"), "--records", str(POSTS)],
        ):
            done = runner.invoke(app, args)
            assert done.exit_code == 0, f"{args}\n{done.output}"
    metrics = [json.loads((tmp_path / f"{layout}.metrics.json").read_text()) for layout in ("wide", "flat")]
    assert metrics[0]["questions"] == metrics[1]["questions"]
    fitted = [json.loads((tmp_path / f"{layout}.cal.json").read_text()) for layout in ("wide", "flat")]
    assert fitted[1]["method"] == fitted[0]["method"]
    for name in ("temperatures", "type_temperatures", "default"):  # the same fit: logits less a constant
        assert fitted[1][name] == pytest.approx(fitted[0][name], rel=1e-5), name
    review = [(tmp_path / f"{layout}.review.jsonl").read_text() for layout in ("wide", "flat")]
    assert review[0] == review[1]
    drift = runner.invoke(app, ["compare", str(layouts / "wide.parquet"), str(layouts / "flat.parquet"), "--json", "-"])
    assert drift.exit_code == 0, drift.output
    found = json.loads(drift.stdout)
    assert found["shared_records"] == 5 and found["flips"] == []
    assert all(question["flipped"] == 0 and question["psi"] == 0 for question in found["questions"].values())


def test_a_calibrated_flat_output_is_not_calibrated_again(layouts, tmp_path):
    calibration = tmp_path / "cal.json"
    fit = ["calibrate", str(layouts / "wide.parquet"), "--gold", str(GOLD), "-o", str(calibration)]
    fitted = runner.invoke(app, fit)
    assert fitted.exit_code == 0, fitted.output
    out = tmp_path / "calibrated.parquet"
    done = score(out, "--layout", "flat", "--checkpoint", str(layouts / "store.ckpt"), "--calibration",
                 str(calibration), "--quiet")  # fmt: skip
    assert done.exit_code == 0, done.output
    assert runner.invoke(app, ["eval", str(out), "--gold", str(GOLD)]).exit_code == 0  # its probabilities are fine
    for args in (["calibrate", str(out), "--gold", str(GOLD), "-o", str(tmp_path / "again.json")],
                 ["eval", str(out), "--gold", str(GOLD), "--calibration", str(calibration)]):  # fmt: skip
        refused = runner.invoke(app, args)
        assert refused.exit_code == 2 and "written with --calibration" in refused.stderr, refused.output


def test_a_flat_file_without_question_types_is_refused_saying_what_reads(layouts, tmp_path):
    """A flat file whose clef.flat_columns lack the types (an older clef's) is refused in one true
    line; a Parquet with neither answers nor clef's flat columns is "not an output of clef score"."""
    table = pq.read_table(layouts / "flat.parquet")
    metadata = dict(table.schema.metadata)
    described = json.loads(metadata[b"clef.flat_columns"])
    metadata[b"clef.flat_columns"] = json.dumps([{k: v for k, v in e.items() if k != "type"} for e in described])
    pq.write_table(table.replace_schema_metadata(metadata), tmp_path / "old.parquet")
    old = runner.invoke(app, ["eval", str(tmp_path / "old.parquet"), "--gold", str(GOLD)])
    assert old.exit_code == 2 and "--layout flat output that does not record its questions' types" in old.stderr
    pq.write_table(table.replace_schema_metadata({}), tmp_path / "plain.parquet")
    plain = runner.invoke(app, ["compare", str(tmp_path / "plain.parquet"), str(layouts / "wide.parquet")])
    assert plain.exit_code == 2 and "is not an output of `clef score`" in plain.stderr


def test_the_flat_summary_names_only_columns_a_flat_file_has(tmp_path):
    records = [{"id": "ok", "state": "fine"}, {"id": "bad", "state": "s", "questions": {"q": {"type": "maybe"}}}]
    inputs = write_jsonl(tmp_path / "r.jsonl", records)
    for layout in ("wide", "flat"):
        out = tmp_path / f"{layout}.parquet"
        done = runner.invoke(app, ["score", str(inputs), "-o", str(out), "--questions", str(QUESTIONS), "--layout",
                                   layout, "--model", str(TINY_MODEL), "--workers", "0", "--hidden-states", "drop",
                                   "--checkpoint", str(tmp_path / "store.ckpt")])  # fmt: skip
        assert done.exit_code == 3, done.output
        line = next(line for line in done.stderr.splitlines() if line.startswith("failed by kind"))
        named = {name for name in ("error", "error_kind") if f"`{name}`" in line}
        assert named <= set(pq.read_schema(out).names) and "error" in named, line
