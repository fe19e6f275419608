"""What `clef eval` and `clef calibrate` print and write, on scored Parquet files written here
(real Parquet in `clef score`'s schema): whole tables off a terminal in every --format, strict
JSON with the reason of a null metric, --by groups, the few-records marker, the fold count, and
report legends that stay off the data. Numbers are checked against direct loops over the file."""

from __future__ import annotations

import csv
import io
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.results import RESULT_SCHEMA

runner = CliRunner()
LONG_ID = "does_this_post_ask_for_money_or_personal_details_in_exchange_for_a_prize_or_a_refund"
NOUL = ("true", "false")


def write_scored(path, records, **kept):
    """records: [(id, {question_id: (type, option ids, probabilities)})]; kept: passed-through columns."""
    rows = []
    for index, (record_id, questions) in enumerate(records):
        answers = []
        for question_id, (qtype, options, probabilities) in questions.items():
            best = int(np.argmax(probabilities))
            labels = [
                {"label": option, "probability": float(p), "logit": float(np.log(p))}
                for option, p in zip(options, probabilities, strict=True)
            ]
            answers.append(
                {"question_id": question_id, "type": qtype, "answer": options[best],
                 "confidence": float(probabilities[best]), "noul": None, "score": None, "labels": labels}
            )  # fmt: skip
        rows.append(
            {"id": record_id, "record_index": index, "prompt_tokens": 10, "state_tokens_cut": 0, "error": None,
             "answers": answers}
        )  # fmt: skip
    table = pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)
    for name, values in kept.items():
        table = table.append_column(name, pa.array(values))
    pq.write_table(table, path)
    return path


def write_gold(path, labels):
    path.write_text("".join(json.dumps({"id": rid, "labels": found}) + "\n" for rid, found in labels.items()))
    return path


def noul_case(tmp_path, n=40, seed=0, **kept):
    """n records, two noul questions (one with a long id), gold drawn so that both are imperfect."""
    rng = np.random.default_rng(seed)
    records, gold = [], {}
    for number in range(n):
        yes = rng.uniform(0.5, 0.999, size=2)
        questions = {
            LONG_ID: ("noul", NOUL, [yes[0], 1 - yes[0]]),
            "short": ("noul", NOUL, [1 - yes[1], yes[1]]),
        }
        records.append((f"r{number}", questions))
        gold[f"r{number}"] = {LONG_ID: str(rng.random() < yes[0]).lower(), "short": str(rng.random() > yes[1]).lower()}
    scored = write_scored(tmp_path / "scored.parquet", records, **kept)
    return scored, write_gold(tmp_path / "gold.jsonl", gold), records, gold


def strict_json(path):
    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_the_table_is_whole_when_stdout_is_not_a_terminal(tmp_path):
    scored, gold, _, _ = noul_case(tmp_path)
    metrics_path = tmp_path / "m.json"
    result = runner.invoke(app, ["eval", str(scored), "--gold", str(gold), "--json", str(metrics_path)])
    assert result.exit_code == 0, result.output
    document = strict_json(metrics_path)
    assert "…" not in result.stdout
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("question"))
    assert re.split(r"\s{2,}", header) == [
        "question", "type", "n", "accuracy (95% CI)", "log loss", "Brier", "ECE", "threshold", "coverage",
    ]  # fmt: skip
    for qid, found in document["questions"].items():
        row = next(line for line in lines if line.startswith(qid + " "))
        low, high = found["accuracy_ci"]
        assert f"{found['accuracy']:.3f} [{low:.3f}, {high:.3f}]" in row
        assert f"{found['log_loss']:.3f}" in row and f"{found['ece']:.3f}" in row
    assert "40 records with gold" in result.stdout


def test_a_terminal_gets_the_rich_table():
    from clef_cli.quality.evaluate.tables import print_eval

    document = {"records": 1, "joint_exact_match": 1.0, "questions": {"q": {
        "type": "noul", "n": 1, "accuracy": 1.0, "accuracy_ci": [1.0, 1.0], "log_loss": 0.1, "brier": 0.02,
        "ece": 0.1, "threshold": None, "coverage": None, "threshold_records": None}}}  # fmt: skip
    shown = io.StringIO()
    print_eval(Console(file=shown, force_terminal=True, color_system=None, width=120), document)
    assert "┃ question" in shown.getvalue() and "1.000 [1.000, 1.000]" in shown.getvalue()


def test_tsv_and_markdown_formats(tmp_path):
    scored, gold, _, _ = noul_case(tmp_path, source=["web" if i % 2 else "mail" for i in range(40)])
    metrics_path = tmp_path / "m.json"
    args = ["eval", str(scored), "--gold", str(gold), "--json", str(metrics_path), "--by", "source"]
    result = runner.invoke(app, [*args, "--format", "tsv"])
    assert result.exit_code == 0, result.output
    document = strict_json(metrics_path)
    rows = list(csv.DictReader(io.StringIO(result.stdout), delimiter="\t", quoting=csv.QUOTE_NONE))
    assert len(rows) == 2 * 3  # overall, mail, web
    groups = {"": document, **{json.dumps(group["value"]): group for group in document["by"]["groups"]}}
    assert set(groups) == {"", '"mail"', '"web"'}
    for row in rows:
        found = groups[row["source"]]["questions"][row["question"]]
        assert float(row["accuracy"]) == found["accuracy"]  # full precision, not 3 digits
        assert [float(row["accuracy_ci_low"]), float(row["accuracy_ci_high"])] == found["accuracy_ci"]
        assert float(row["log_loss"]) == found["log_loss"] and float(row["ece"]) == found["ece"]
        assert row["threshold"] == ("" if found["threshold"] is None else repr(found["threshold"]))
    result = runner.invoke(app, [*args, "--format", "markdown"])
    assert result.exit_code == 0, result.output
    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    assert table[1] == "|---|---|---:|---:|---:|---:|---:|---:|---:|"
    assert len(table) == 3 * 4 and all(line.count(" | ") == 8 for line in table if not line.startswith("|-"))
    assert '### source = "web"' in result.stdout and LONG_ID.replace("_", "\\_") in result.stdout
    assert runner.invoke(app, [*args, "--format", "html"]).exit_code == 2


def test_by_keeps_null_apart_from_the_string_null(tmp_path):
    values = ["null" if i % 3 == 0 else None if i % 3 == 1 else "a" for i in range(40)]
    scored, gold, records, labels = noul_case(tmp_path, source=values)
    metrics_path = tmp_path / "m.json"
    result = runner.invoke(
        app, ["eval", str(scored), "--gold", str(gold), "--by", "source", "--json", str(metrics_path)]
    )
    assert result.exit_code == 0, result.output
    groups = strict_json(metrics_path)["by"]["groups"]
    assert [group["value"] for group in groups] == ["null", None, "a"]
    for group in groups:
        members = [i for i, value in enumerate(values) if value == group["value"]]
        assert group["records"] == len(members)
        right = [NOUL[int(np.argmax(records[i][1]["short"][2]))] == labels[f"r{i}"]["short"] for i in members]
        assert group["questions"]["short"]["accuracy"] == pytest.approx(np.mean(right), abs=1e-12)
    assert 'source = "null"' in result.stdout and "source = null\n" in result.stdout


def test_an_undefined_metric_is_null_in_json_with_its_reason_in_the_table(tmp_path):
    records = [(f"r{i}", {"lonely": ("score", ("0",), [1.0]), "s": ("noul", NOUL, [0.6, 0.4])}) for i in range(3)]
    scored = write_scored(tmp_path / "scored.parquet", records)
    gold = write_gold(tmp_path / "gold.jsonl", {f"r{i}": {"lonely": 0, "s": True} for i in range(3)})
    metrics_path = tmp_path / "m.json"
    result = runner.invoke(app, ["eval", str(scored), "--gold", str(gold), "--json", str(metrics_path)])
    assert result.exit_code == 0, result.output
    found = strict_json(metrics_path)["questions"]["lonely"]
    assert found["rps"] is None and found["mae"] == 0.0 and found["accuracy"] == 1.0
    assert "lonely: rps is undefined (null in --json): a score question with one level" in result.stdout


def test_a_threshold_on_few_records_is_marked_in_table_json_and_report(tmp_path):
    """`sharp` reaches 95% only on its 10 most confident records; `easy` is right on all 60."""
    confidences = np.linspace(0.99, 0.55, 60)
    records = [(f"r{i}", {q: ("noul", NOUL, [c, 1 - c]) for q in ("sharp", "easy")}) for i, c in enumerate(confidences)]
    labels = {f"r{i}": {"sharp": i < 10 or i % 2 == 1, "easy": True} for i in range(60)}
    scored = write_scored(tmp_path / "scored.parquet", records)
    gold = write_gold(tmp_path / "gold.jsonl", labels)
    metrics_path, report = tmp_path / "m.json", tmp_path / "r.html"
    args = ["eval", str(scored), "--gold", str(gold), "--json", str(metrics_path), "--report", str(report)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    questions = strict_json(metrics_path)["questions"]
    for qid, found in questions.items():
        counted = int(np.sum(confidences >= found["threshold"]))  # direct count over the file's confidences
        assert found["threshold_records"] == counted == {"sharp": 10, "easy": 60}[qid]
    lines = result.stdout.splitlines()
    for qid, found in questions.items():
        row = next(line for line in lines if line.startswith(qid + " "))
        assert (f"{found['threshold']:.3f}*" in row) == (qid == "sharp"), row
    assert "* the threshold rests on fewer than 30 records (records at or above it: sharp 10)" in result.stdout
    page = report.read_text()
    assert f"{questions['sharp']['threshold']:.4f}*</td>" in page
    assert f"{questions['easy']['threshold']:.4f}</td>" in page
    assert "rests on fewer than 30 records (the records at or above it; see threshold_records): sharp." in page


def test_calibrate_warns_about_skipped_labels_and_says_its_fold_count(tmp_path):
    records = [(f"r{i}", {"q": ("choice", ("a", "b"), [0.7, 0.3] if i % 2 else [0.2, 0.8])}) for i in range(3)]
    records.append(("odd", {"q": ("choice", ("a", "b", "c"), [0.5, 0.3, 0.2])}))
    scored = write_scored(tmp_path / "scored.parquet", records)
    gold = write_gold(tmp_path / "gold.jsonl", {rid: {"q": "a"} for rid, _ in records})
    for command in (["eval"], ["calibrate", "-o", str(tmp_path / "c.json")]):
        result = runner.invoke(app, [*command, str(scored), "--gold", str(gold)])
        assert result.exit_code == 0, result.output
        assert "warning: question 'q': skipped 1 record with other options than the first" in result.stderr
    labelled = len(records) - 1  # the odd record's label is skipped
    assert f"cross-fitted ({labelled} folds of records)" in result.stdout
    many = [(f"r{i}", {"q": ("choice", ("a", "b"), [0.7, 0.3])}) for i in range(7)]
    write_scored(scored, many)
    write_gold(gold, {rid: {"q": "a" if i % 3 else "b"} for i, (rid, _) in enumerate(many)})
    result = runner.invoke(app, ["calibrate", str(scored), "--gold", str(gold), "-o", str(tmp_path / "c.json")])
    assert result.exit_code == 0 and "cross-fitted (5 folds of records)" in result.stdout


def test_calibrate_says_when_a_temperature_is_only_the_edge_of_its_search(tmp_path):
    """Equally sure of every answer and right half the time: the NLL falls as T grows, so the
    search stops at its upper bound, 50. calibrate warns (naming it and the 16 labels) and lists
    it in the file; a temperature inside the range is not flagged."""
    records = [(f"r{i}", {"q": ("noul", NOUL, [0.9, 0.1])}) for i in range(16)]
    scored = write_scored(tmp_path / "s.parquet", records)
    labels = {rid: {"q": "true" if i % 2 else "false"} for i, (rid, _) in enumerate(records)}
    gold = write_gold(tmp_path / "g.jsonl", labels)
    out = tmp_path / "c.json"
    result = runner.invoke(app, ["calibrate", str(scored), "--gold", str(gold), "-o", str(out), "--method", "global"])
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    assert written["default"] == pytest.approx(50.0, rel=1e-3) and written["at_search_bound"] == ["default"]
    assert "warning: temperature default = 50 is the edge of the search range [0.02, 50] (16 labels)" in result.stderr
    fine, gold_fine, _, _ = noul_case(tmp_path)
    result = runner.invoke(app, ["calibrate", str(fine), "--gold", str(gold_fine), "-o", str(out)])
    assert result.exit_code == 0 and "edge of the search" not in result.stderr
    assert json.loads(out.read_text())["at_search_bound"] == []


def test_calibrate_table_formats(tmp_path):
    """Every column has a header; `--format` as eval's: plain off a terminal, markdown, tsv."""
    scored, gold, _, _ = noul_case(tmp_path)
    out = tmp_path / "c.json"
    args = ["calibrate", str(scored), "--gold", str(gold), "-o", str(out)]
    plain = runner.invoke(app, args)
    assert plain.exit_code == 0, plain.output
    lines = plain.stdout.splitlines()
    assert re.split(r"\s{2,}", lines[1]) == ["method", "log loss", "Brier", "ECE", "chosen"]
    assert lines[-1].startswith("temperatures: ")
    chosen = json.loads(out.read_text())["method"]
    tsv = runner.invoke(app, [*args, "--format", "tsv"])
    assert tsv.exit_code == 0, tsv.output
    rows = list(csv.DictReader(io.StringIO(tsv.stdout), delimiter="\t"))
    assert [row["method"] for row in rows] == ["none", "global", "type", "question"]
    assert [row["method"] for row in rows if row["chosen"] == "true"] == [chosen]
    assert all(float(row["log_loss"]) > 0 for row in rows) and "temperatures: " in tsv.stderr
    markdown = runner.invoke(app, [*args, "--format", "markdown"])
    assert "| method | log loss | Brier | ECE | chosen |" in markdown.stdout


def test_gold_files_without_a_usable_label_say_why(tmp_path):
    scored, _, _, _ = noul_case(tmp_path, n=3)
    empty, blank = tmp_path / "empty.csv", tmp_path / "blank.jsonl"
    empty.write_text("id,short\n")
    blank.write_text('{"id": "r0", "labels": {"short": null}}\n')
    for path, needle in ((empty, "holds no rows"), (blank, "the gold holds no label for any scored record")):
        result = runner.invoke(app, ["eval", str(scored), "--gold", str(path)])
        assert result.exit_code == 2 and needle in result.stderr, result.output
        assert "above" not in result.stderr


def test_a_problem_of_every_row_is_shown_before_the_cut(tmp_path):
    scored, _, _, _ = noul_case(tmp_path, n=30)
    gold = tmp_path / "gold.csv"
    gold.write_text("id,short,\n" + "".join(f"r{i},maybe,1\n" for i in range(30)))  # trailing comma: column ''
    result = runner.invoke(app, ["eval", str(scored), "--gold", str(gold)])
    assert result.exit_code == 2, result.output  # every label is wrong
    lines = result.stderr.splitlines()
    assert lines[0] == "warning: 31 gold problems; the labels concerned are skipped"
    assert lines[1] == "  question '' is not a question of any scored record (30 gold rows)"
    assert lines[2] == "  record 'r0' question 'short': gold 'maybe' is not an allowed option (true, false)"
    assert "  ... and 11 more" in lines and "see the 31 problems above" in lines[-1]


def test_report_legends_stay_off_the_axes(tmp_path):
    """Every legend lies outside every axes of its figure (pixels of the drawn figure)."""
    from clef_cli.quality import metrics
    from clef_cli.quality.evaluate import report
    from clef_cli.quality.labels.scored import QuestionData

    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(4), size=80)
    data = QuestionData("q", "score", ("0", "1", "2", "3"), [f"r{i}" for i in range(80)], p, np.log(p),
                        rng.integers(0, 4, 80))  # fmt: skip
    found = metrics.question_metrics(data, 15, 0.3)
    assert found["threshold"] is not None
    drawn = report.figures(data, 15, 0.3, found)
    assert len(drawn) == 4
    legends = 0
    for figure in drawn:
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        boxes = [axes.get_window_extent(renderer) for axes in figure.axes]
        for legend in [*figure.legends, *(axes.get_legend() for axes in figure.axes)]:
            if legend is None:
                continue
            legends += 1
            extent = legend.get_window_extent(renderer)
            assert not any(extent.overlaps(box) for box in boxes), figure.axes[0].get_title()
            assert extent.x0 >= 0 and extent.x1 <= figure.bbox.width and extent.y0 >= 0  # on the canvas
    assert legends == 3  # reliability, coverage, levels
