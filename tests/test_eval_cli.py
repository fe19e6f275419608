"""`clef eval` and `clef calibrate` end to end on the sample posts and their hand-written gold
file, then `clef score --calibration` from the finished checkpoint without running the model."""

from __future__ import annotations

import base64
import json
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.release import file_sha256
from clef_cli.results import long_rows

from .support.helpers import SAMPLE_DATA, TINY_MODEL, require_program

runner = CliRunner()
GOLD = SAMPLE_DATA / "posts_gold.jsonl"
POSTS = SAMPLE_DATA / "posts.jsonl"
QUESTIONS = SAMPLE_DATA / "questions.json"


def score(out, *args: str):
    options = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", *args]
    return runner.invoke(app, ["score", str(POSTS), "--questions", str(QUESTIONS), "-o", str(out), *options])


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "out.parquet"
    result = score(out)
    assert result.exit_code == 0, result.output
    return out


def gold_labels() -> dict[str, dict[str, str]]:
    rows = [json.loads(line) for line in GOLD.read_text().splitlines() if line.strip()]

    def text(value: object) -> str:
        return str(value).lower() if isinstance(value, bool) else str(value)

    return {row["id"]: {q: text(v) for q, v in row["labels"].items()} for row in rows}


def direct_metrics(path, temperature: float | None = None) -> dict[str, dict[str, float]]:
    """Accuracy and log loss per question straight from the Parquet rows and the gold file."""
    gold = gold_labels()
    found: dict[str, list[tuple[bool, float]]] = {}
    for row in pq.read_table(path).to_pylist():
        for answer in row["answers"]:
            labels = [label["label"] for label in answer["labels"]]
            if temperature is None:
                p = [label["probability"] for label in answer["labels"]]
            else:
                logits = np.array([label["logit"] for label in answer["labels"]]) / temperature
                p = list(np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum())
            truth = gold[row["id"]][answer["question_id"]]
            best = labels[max(range(len(p)), key=lambda i: (p[i], -i))]
            found.setdefault(answer["question_id"], []).append((best == truth, -np.log(p[labels.index(truth)])))
    return {
        q: {"accuracy": float(np.mean([ok for ok, _ in v])), "log_loss": float(np.mean([loss for _, loss in v]))}
        for q, v in found.items()
    }


def test_eval_on_the_sample(scored, tmp_path):
    metrics_path, report = tmp_path / "m.json", tmp_path / "r.html"
    result = runner.invoke(
        app, ["eval", str(scored), "--gold", str(GOLD), "--json", str(metrics_path), "--report", str(report)]
    )
    assert result.exit_code == 0, result.output
    assert "is_spam" in result.stdout and "joint exact match" in result.stdout
    document = json.loads(metrics_path.read_text())
    assert document["records"] == 5
    assert set(document["questions"]) == {"is_spam", "category", "toxicity"}
    for qid, expected in direct_metrics(scored).items():
        found = document["questions"][qid]
        assert found["n"] == 5
        assert found["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-12)
        assert found["log_loss"] == pytest.approx(expected["log_loss"], abs=1e-12)
    assert {"rps", "mae", "within_one"} <= set(document["questions"]["toxicity"])
    assert document["questions"]["category"]["confusion"]["labels"] == sorted(
        json.loads(QUESTIONS.read_text())["category"]["criteria"]
    )

    page = report.read_text()
    assert not re.search(r"(src|href)=['\"](?!data:|#)", page)  # self-contained: nothing fetched
    for qid, count in (("is_spam", 3), ("category", 3), ("toxicity", 4)):
        section = page.split(f"id='q-{qid}'")[1].split("<h2")[0]
        images = re.findall(r"src='data:image/png;base64,([^']+)'", section)
        assert len(images) == count
        assert all(base64.b64decode(image).startswith(b"\x89PNG\r\n\x1a\n") for image in images)


def test_calibrate_then_score_from_the_checkpoint_without_the_model(scored, tmp_path, monkeypatch):
    cal = tmp_path / "cal.json"
    result = runner.invoke(app, ["calibrate", str(scored), "--gold", str(GOLD), "-o", str(cal), "--method", "global"])
    assert result.exit_code == 0, result.output
    assert "cross-fitted" in result.stdout
    calibration = json.loads(cal.read_text())
    assert calibration["method"] == "global" and calibration["fitted_on"]["n"] == 15
    assert calibration["fitted_on"]["gold_sha256"] == file_sha256(GOLD)
    assert calibration["fitted_on"]["scored_sha256"] == file_sha256(scored)
    assert set(calibration["cross_fitted"]) == {"before", "after"}
    temperature = calibration["default"]

    import clef_cli.model.scoring

    def no_model(*args, **kwargs):
        raise AssertionError("the thinker must not run to recalibrate a finished job")

    monkeypatch.setattr(clef_cli.model.scoring, "load_scorer", no_model)
    monkeypatch.setattr(clef_cli.model.scoring.Scorer, "hidden_states", no_model)
    calibrated = tmp_path / "calibrated.parquet"
    result = score(calibrated, "--checkpoint", f"{scored}.ckpt", "--calibration", str(cal))
    assert result.exit_code == 0, result.output
    assert "0 run through the model, 5 from the checkpoint" in result.stderr

    table = pq.read_table(calibrated)
    assert table.schema.metadata[b"clef.calibration_sha256"].decode() == file_sha256(cal)
    raw = pq.read_table(scored).to_pylist()
    for before, after in zip(raw, table.to_pylist(), strict=True):
        for a, b in zip(before["answers"], after["answers"], strict=True):
            logits = np.array([label["logit"] for label in a["labels"]])
            assert [label["logit"] for label in b["labels"]] == logits.tolist()  # raw logits untouched
            expected = np.exp(logits / temperature) / np.exp(logits / temperature).sum()
            assert [label["probability"] for label in b["labels"]] == pytest.approx(expected.tolist(), abs=1e-12)
            assert b["answer"] == a["answer"]  # a scalar T never changes the answer
            assert b["confidence"] == pytest.approx(max(expected), abs=1e-12)

    # eval --calibration on the raw file is the same as eval on the calibrated file
    metrics = {}
    for name, args in (("applied", [str(calibrated)]), ("as-if", [str(scored), "--calibration", str(cal)])):
        out = tmp_path / f"{name}.json"
        result = runner.invoke(app, ["eval", *args, "--gold", str(GOLD), "--json", str(out)])
        assert result.exit_code == 0, result.output
        metrics[name] = json.loads(out.read_text())["questions"]
    for qid, expected in direct_metrics(scored, temperature).items():
        for name in metrics:
            assert metrics[name][qid]["accuracy"] == expected["accuracy"]
            assert metrics[name][qid]["log_loss"] == pytest.approx(expected["log_loss"], abs=1e-9)


def test_long_layout_gold_column_and_by(scored, tmp_path):
    """A long-layout file evaluates like the wide one; gold and a grouping column passed through."""
    wide = pq.read_table(scored)
    long = tmp_path / "long.parquet"
    pq.write_table(long_rows(wide), long)
    gold = gold_labels()
    ids = wide.column("id").to_pylist()
    source = ["a" if i < 3 else "b" for i in range(len(ids))]
    kept = wide.append_column("gold", pa.array([json.dumps(gold[i]) for i in ids])).append_column(
        "source", pa.array(source)
    )
    with_columns = tmp_path / "kept.parquet"
    pq.write_table(kept, with_columns)
    documents = {}
    for name, args in (
        ("wide", [str(scored), "--gold", str(GOLD)]),
        ("long", [str(long), "--gold", str(GOLD)]),
        ("column", [str(with_columns), "--gold-column", "gold", "--by", "source"]),
    ):
        out = tmp_path / f"{name}.json"
        result = runner.invoke(app, ["eval", *args, "--json", str(out)])
        assert result.exit_code == 0, result.output
        documents[name] = json.loads(out.read_text())
    assert documents["long"]["questions"] == documents["wide"]["questions"]
    assert documents["column"]["questions"] == documents["wide"]["questions"]
    groups = {group["value"]: group for group in documents["column"]["by"]["groups"]}
    assert set(groups) == {"a", "b"} and groups["a"]["records"] == 3 and groups["b"]["records"] == 2
    for value, records in (("a", ids[:3]), ("b", ids[3:])):
        rows = [r for r in wide.to_pylist() if r["id"] in records]
        spam = [next(a for a in r["answers"] if a["question_id"] == "is_spam") for r in rows]
        right = [a["answer"] == gold[r["id"]]["is_spam"] for a, r in zip(spam, rows, strict=True)]
        assert groups[value]["questions"]["is_spam"]["accuracy"] == pytest.approx(np.mean(right), abs=1e-12)


def test_bad_gold_rows_are_named_warnings(scored, tmp_path):
    bad = tmp_path / "bad.jsonl"
    rows = [
        {"id": "post-001", "labels": {"is_spam": "maybe", "category": "safe"}},
        {"id": "post-002", "labels": {"colour": "red", "toxicity": 9}},
        {"id": "post-002", "labels": {"is_spam": True}},
        {"id": "post-404", "labels": {"is_spam": True}},
    ]
    bad.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = runner.invoke(app, ["eval", str(scored), "--gold", str(bad)])
    assert result.exit_code == 0, result.output
    assert "warning: 5 gold problems;" in result.stderr
    for needle in (
        "record 'post-001' question 'is_spam': gold 'maybe' is not an allowed option (true, false)",
        "record 'post-002' question 'toxicity': gold '9' is not an allowed option (0, 1, 2, 3)",
        "question 'colour' is not a question of any scored record",
        "record 'post-002': duplicate id in the gold",
        "record 'post-404' is not in the scored records",
    ):
        assert needle in result.stderr
    assert "Traceback" not in result.output
    assert "category" in result.stdout  # the good label still counts


@pytest.mark.parametrize(
    ("text", "suffix", "needle"),
    [
        ('{"labels": {"is_spam": true}}\n', ".jsonl", "row 1: no `id`"),
        ("{oops\n", ".jsonl", "line 1: not JSON"),
        ("id,is_spam\n", ".txt", "unknown format"),
        ('{"id": "nobody", "labels": {"is_spam": true}}\n', ".jsonl", "no scored record has a usable gold label"),
    ],
)
def test_unusable_gold_files_exit_2_with_one_line(scored, tmp_path, text, suffix, needle):
    path = tmp_path / f"gold{suffix}"
    path.write_text(text)
    for command in (["eval", str(scored)], ["calibrate", str(scored), "-o", str(tmp_path / "c.json")]):
        result = runner.invoke(app, [*command, "--gold", str(path)])
        assert result.exit_code == 2, result.output
        assert needle in result.stderr and "Traceback" not in result.output
        if "nobody" in text:
            assert "record 'nobody' is not in the scored records" in result.stderr


def test_usage_errors(scored, tmp_path):
    cases = [
        (["eval", str(scored)], "exactly one of --gold FILE or --gold-column NAME"),
        (["eval", str(scored), "--gold", str(GOLD), "--by", "nope"], "--by 'nope': the scored file has no such column"),
        (["eval", str(GOLD), "--gold", str(GOLD)], "could not be read as Parquet"),
        (["eval", str(scored), "--gold", str(GOLD), "--calibration", str(GOLD)], "could not be read"),
        (["calibrate", str(scored), "--gold", str(GOLD), "-o", str(tmp_path / "c.json"), "--method", "x"], "--method"),
    ]
    for args, needle in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert needle in result.stderr, (args, result.stderr)


def test_eval_calibrate_review_and_compare_do_not_import_torch_or_ray(scored, tmp_path):
    """One fresh interpreter runs the commands one after another and looks at its modules after
    each (importing is one-way: torch or ray present after a command means that command imported
    them, since they were absent before it)."""
    import subprocess
    import sys

    code = (
        "import json, sys\nfrom clef_cli.cli import main\n"
        "for args in json.loads(sys.argv[1]):\n"
        "    sys.argv = ['clef', *args]\n"
        "    try:\n        main()\n    except SystemExit as done:\n        assert not done.code, (args, done.code)\n"
        "    assert 'torch' not in sys.modules, (args, 'torch was imported')\n"
        "    assert 'ray' not in sys.modules, (args, 'ray was imported')\n"
        "    print('ok', args[0], flush=True)\n"
    )
    shutil.copy(scored, tmp_path / "s.parquet")
    commands = [
        ["eval", "s.parquet", "--gold", str(GOLD)],
        ["calibrate", "s.parquet", "--gold", str(GOLD), "-o", "c.json"],
        ["review", "s.parquet", "-o", "t.json", "--config-out", "c.xml", "--exclude", str(GOLD)],
        ["review", "s.parquet", "-o", "a.json", "--format", "argilla", "--records", str(POSTS)],
        ["compare", "s.parquet", "s.parquet", "--json", "d.json", "--report", "d.html"],
    ]
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(commands)], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stdout.splitlines() if line.startswith("ok ")] == [f"ok {c[0]}" for c in commands]


def test_review_of_a_real_output_shows_the_questions_file(scored, tmp_path):
    """`clef score --questions FILE` keeps the schema in the output (`clef.questions`), so the
    review config shows its instructions and descriptions without being told the file again."""
    schema = json.loads(QUESTIONS.read_text())
    metadata = pq.read_schema(scored).metadata
    assert json.loads(metadata[b"clef.questions"]) == schema.get("questions", schema)
    config = tmp_path / "c.xml"
    result = runner.invoke(app, ["review", str(scored), "-o", str(tmp_path / "t.json"), "--config-out", str(config)])
    assert result.exit_code == 0, result.output
    text = config.read_text()
    assert f'<Header value="category: {schema["category"]["instructions"]}"/>' in text
    assert f'<Choice value="safe" html="safe: {schema["category"]["criteria"]["safe"]}"/>' in text
    assert f'<Choice value="0" html="0: {schema["toxicity"]["criteria"][0]}"/>' in text


def test_report_renders_in_headless_chromium(scored, tmp_path):
    import subprocess

    from PIL import Image

    chromium = require_program("chromium")
    report, shot = tmp_path / "r.html", tmp_path / "shot.png"
    assert runner.invoke(app, ["eval", str(scored), "--gold", str(GOLD), "--report", str(report)]).exit_code == 0
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}"]
    subprocess.run([*command, "--window-size=1100,900", report.as_uri()], capture_output=True, timeout=120)
    image = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert image.shape == (900, 1100)
    # the plots drew: a good share of the page is neither white nor one flat colour
    assert (image < 200).mean() > 0.02 and image.std() > 20


def test_help_texts_end_with_examples():
    for command in ("eval", "calibrate"):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0
        examples = result.stdout.split("Examples, from a source checkout's root", 1)[1]
        assert f"clef {command} posts.parquet --gold sample_data/posts_gold.jsonl" in examples
    assert "--calibration" in runner.invoke(app, ["score", "--help"]).stdout
