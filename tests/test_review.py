"""`clef review`: the orders against a direct computation of their definitions (ties included),
the Label Studio tasks and config, the flat formats, and the Argilla document built into the
`argilla` SDK's own classes offline."""

from __future__ import annotations

import csv
import heapq
import json
import math
import os
import xml.etree.ElementTree as ElementTree

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app

from .support.scored_files import SCHEMA, random_records, write_scored

runner = CliRunner()


@pytest.fixture(scope="module", params=["wide", "long"])
def scored(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("review") / f"{request.param}.parquet"
    return write_scored(path, random_records(seed=3, n=60), layout=request.param, extra={"state": [
        f"text of record {i}" for i in range(60)
    ]})  # fmt: skip


def direct(path, questions=None) -> list[dict]:
    """Per scored record, the definitions computed straight from the Parquet rows (wide or long)."""
    table = pq.read_table(path)
    records: dict[str, dict] = {}
    if "answers" in table.column_names:
        for row in table.to_pylist():
            for answer in row["answers"] or ():
                probabilities = [label["probability"] for label in answer["labels"]]
                entry = records.setdefault(row["id"], {"id": row["id"], "index": row["record_index"], "q": {}})
                entry["q"][answer["question_id"]] = (probabilities, answer["answer"])
    else:
        for row in table.to_pylist():
            if row["question_id"] is None:
                continue
            entry = records.setdefault(row["id"], {"id": row["id"], "index": row["record_index"], "q": {}})
            entry["q"].setdefault(row["question_id"], ([], []))
            entry["q"][row["question_id"]][0].append(row["probability"])
            entry["q"][row["question_id"]][1].append(row["label"])
        for entry in records.values():
            for qid, (probabilities, labels) in entry["q"].items():
                entry["q"][qid] = (probabilities, labels[int(np.argmax(probabilities))])
    found = []
    for entry in records.values():
        chosen = {q: v for q, v in entry["q"].items() if questions is None or q in questions}
        if not chosen:
            continue
        tops = [[*heapq.nlargest(2, p), 0.0] for p, _ in chosen.values()]
        entry["confidence"] = min(top[0] for top in tops)
        entry["margin"] = min(top[0] - top[1] for top in tops)
        entry["entropy"] = max(-math.fsum(x * math.log(x) for x in p if x > 0) for p, _ in chosen.values())
        entry["chosen"] = chosen
        found.append(entry)
    return found


def direct_order(records: list[dict], order: str, first: str) -> list[str]:
    if order == "uncertainty":
        return [r["id"] for r in sorted(records, key=lambda r: (r["confidence"], r["index"]))]
    if order == "margin":
        return [r["id"] for r in sorted(records, key=lambda r: (r["margin"], r["index"]))]
    if order == "entropy":
        return [r["id"] for r in sorted(records, key=lambda r: (-r["entropy"], r["index"]))]
    groups: dict = {}
    for r in sorted(records, key=lambda r: (r["confidence"], r["index"])):
        groups.setdefault(r["chosen"][first][1] if first in r["chosen"] else None, []).append(r["id"])
    result, turn = [], 0
    while any(turn < len(g) for g in groups.values()):
        result += [g[turn] for g in groups.values() if turn < len(g)]
        turn += 1
    return result


def review(scored, tmp_path, *args: str) -> list[dict]:
    out = tmp_path / "tasks.json"
    result = runner.invoke(app, ["review", str(scored), "-o", str(out), *args])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


@pytest.mark.parametrize("order", ["uncertainty", "margin", "entropy", "stratified"])
@pytest.mark.parametrize("questions", [None, "team,severity", "severity"])
def test_orders_equal_the_definitions(scored, tmp_path, order, questions):
    wanted = questions.split(",") if questions else None
    records = direct(scored, wanted)
    expected = direct_order(records, order, (wanted or list(SCHEMA))[0])
    ties = len(records) - len({r["confidence"] for r in records})
    assert ties > 5, "the fixture must hold confidence ties"
    args = ["--order", order] + (["--questions", questions] if questions else [])
    tasks = review(scored, tmp_path, *args)
    assert [task["data"]["id"] for task in tasks] == expected
    limited = review(scored, tmp_path, *args, "--limit", "7")
    assert [task["data"]["id"] for task in limited] == expected[:7]


def test_random_order_is_a_seeded_permutation(scored, tmp_path):
    everyone = sorted(r["id"] for r in direct(scored))
    first = [t["data"]["id"] for t in review(scored, tmp_path, "--order", "random", "--seed", "1")]
    again = [t["data"]["id"] for t in review(scored, tmp_path, "--order", "random", "--seed", "1")]
    other = [t["data"]["id"] for t in review(scored, tmp_path, "--order", "random", "--seed", "2")]
    assert sorted(first) == everyone and first == again and other != first


def test_label_studio_tasks_and_config(scored, tmp_path):
    config = tmp_path / "label_config.xml"
    tasks = review(scored, tmp_path, "--limit", "20", "--config-out", str(config))
    by_id = {r["id"]: r for r in direct(scored)}
    view = ElementTree.fromstring(config.read_text())
    choices = {c.get("name"): [o.get("value") for o in c.findall("Choice")] for c in view.iter("Choices")}
    assert choices == {q: list(options) for q, (_, options) in SCHEMA.items()}
    assert {c.get("toName") for c in view.iter("Choices")} == {"state"}
    assert [t.get("name") for t in view.iter("Text")] == ["state"]
    for task in tasks:
        record = by_id[task["data"]["id"]]
        assert task["data"]["state"] == f"text of record {record['index']}"
        [prediction] = task["predictions"]
        assert prediction["model_version"] == "clef-omni-test@" + "ab" * 6
        assert prediction["score"] == record["confidence"]
        results = {r["from_name"]: r for r in prediction["result"]}
        assert list(results) == list(record["chosen"])
        for qid, (probabilities, answer) in record["chosen"].items():
            assert results[qid]["score"] == probabilities[SCHEMA[qid][1].index(answer)]
            assert results[qid]["value"] == {"choices": [answer]} and results[qid]["to_name"] == "state"
            assert answer in choices[qid]


def test_flat_formats(scored, tmp_path):
    records = {r["id"]: r for r in direct(scored)}
    result = runner.invoke(app, ["review", str(scored), "-o", str(tmp_path / "r.csv"), "--format", "csv"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert len(rows) == len(records)
    for row in rows:
        record = records[row["id"]]
        assert float(row["confidence"]) == record["confidence"]
        for qid, (probabilities, answer) in record["chosen"].items():
            options = SCHEMA[qid][1]
            assert row[qid] == answer and float(row[f"{qid}.probability"]) == probabilities[options.index(answer)]
    result = runner.invoke(app, ["review", str(scored), "-o", str(tmp_path / "r.jsonl"), "--format", "jsonl"])
    lines = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [line["id"] for line in lines] == [row["id"] for row in rows]


def test_exclude_leaves_out_labelled_records(scored, tmp_path):
    everyone = [r["id"] for r in sorted(direct(scored), key=lambda r: (r["confidence"], r["index"]))]
    gold = tmp_path / "gold.jsonl"
    labelled = everyone[:4]
    lines = [{"id": i, "labels": {"urgent": "true"}} for i in labelled] + [{"id": everyone[4], "labels": {}}]
    gold.write_text("".join(json.dumps(line) + "\n" for line in lines))
    tasks = review(scored, tmp_path, "--exclude", str(gold))
    assert [t["data"]["id"] for t in tasks] == everyone[4:]


def test_usage_errors(scored, tmp_path):
    out = str(tmp_path / "x.json")
    cases = [
        (["--questions", "nope"], "'nope' is not a question of the scored file"),
        (["--order", "sideways"], "--order"),
        (["--format", "argilla", "--config-out", str(tmp_path / "c.xml")], "--config-out goes with"),
        (["--limit", "0"], "--limit"),
    ]
    for args, needle in cases:
        result = runner.invoke(app, ["review", str(scored), "-o", out, *args])
        assert result.exit_code == 2, (args, result.output)
        assert needle in result.stderr, (args, result.stderr)


def offline_argilla():
    """The `argilla` SDK with a client that never calls a server (its classes want one)."""
    try:
        import argilla as rg
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("argilla is not installed (pip install -e '.[test]')")

    class Offline(rg.Argilla):
        def _validate_connection(self) -> None:
            """No server: the settings and records are only built and checked here."""

    rg.Argilla._default_client = Offline(api_url="http://127.0.0.1:9", api_key="offline")
    return rg


def test_argilla_document_builds_sdk_classes(scored, tmp_path):
    rg = offline_argilla()
    out = tmp_path / "argilla.json"
    result = runner.invoke(app, ["review", str(scored), "-o", str(out), "--format", "argilla", "--limit", "15"])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    settings = rg.Settings._from_dict(document["settings"])
    allowed = {
        q.name: list(q.values) if isinstance(q, rg.RatingQuestion) else list(q.labels) for q in settings.questions
    }
    assert allowed == {"urgent": list(NOUL_OPTIONS), "team": ["billing", "sales", "tech"], "severity": [0, 1, 2, 3]}
    assert [f.name for f in settings.fields] == ["state"]
    records = [rg.Record.from_dict(r) for r in document["records"]]
    expected = {r["id"]: r for r in direct(scored)}
    assert len(records) == 15
    for record in records:
        found = expected[record.id]
        assert record.fields["state"] == f"text of record {found['index']}"
        suggestions = record.to_dict()["suggestions"]
        assert set(suggestions) == set(found["chosen"])
        for qid, suggestion in suggestions.items():
            probabilities, answer = found["chosen"][qid]
            assert suggestion["value"] in allowed[qid] and str(suggestion["value"]) == answer
            assert suggestion["score"] == probabilities[SCHEMA[qid][1].index(answer)]
            assert suggestion["agent"] == "clef-omni-test@" + "ab" * 6


NOUL_OPTIONS = SCHEMA["urgent"][1]


def test_argilla_export_reads_back_as_gold(scored, tmp_path):
    rg = offline_argilla()
    out = tmp_path / "argilla.json"
    assert runner.invoke(app, ["review", str(scored), "-o", str(out), "--format", "argilla"]).exit_code == 0
    document = json.loads(out.read_text())
    user, other = "00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002"
    exported, expected = [], {}
    for number, raw in enumerate(document["records"][:12]):
        record = rg.Record.from_dict(raw)
        team = ["billing", "sales", "tech"][number % 3]
        if number % 4 == 0:  # submitted, in Record.serialize's shape (responses carry their status)
            record.responses.add(rg.Response("team", team, user_id=user, status="submitted"))
            record.responses.add(rg.Response("team", "tech", user_id=other, status="draft"))
            item = record.to_dict()
            item["responses"] = [r.serialize() | {"user_id": str(r.user_id)} for r in record.responses]
            expected[record.id] = {"team": team}
        elif number % 4 == 1:  # records.to_json's shape (no response status): a completed record counts
            record.responses.add(rg.Response("severity", 2, user_id=user, status="submitted"))
            item = record.to_dict() | {"status": "completed"}
            expected[record.id] = {"severity": "2"}
        elif number % 4 == 2:  # a pending record's responses are not gold
            record.responses.add(rg.Response("team", team, user_id=user, status="draft"))
            item = record.to_dict()
        else:  # no response at all: no gold, not an error
            item = record.to_dict()
        exported.append(item)
    export = tmp_path / "export.json"
    export.write_text(json.dumps(exported))
    from clef_cli.quality.labels.gold import read_gold_rows

    rows = {record_id: {q: str(v) for q, v in labels.items()} for record_id, labels in read_gold_rows(export)[0]}
    assert {k: v for k, v in rows.items() if v} == expected
    metrics = tmp_path / "m.json"
    result = runner.invoke(app, ["eval", str(scored), "--gold", str(export), "--json", str(metrics)])
    assert result.exit_code == 0, result.output
    found = json.loads(metrics.read_text())["questions"]
    assert found["team"]["n"] == sum("team" in v for v in expected.values())
    assert found["severity"]["n"] == sum("severity" in v for v in expected.values())


def test_state_and_media_from_the_inputs(tmp_path):
    """--records: the state as text (JSON compact, sorted keys) and media as local-files URLs
    relative to --document-root; URLs pass through; tasks with fewer media get empty slots."""
    (tmp_path / "img").mkdir()
    inputs = [
        {"id": "r000", "state": {"b": 1, "a": "x y"}, "images": ["img/a b.png", "https://h/x.png"]},
        {"id": "r001", "state": "plain text", "audio": ["clip.wav"]},
    ]
    records_path = tmp_path / "records.jsonl"
    records_path.write_text("".join(json.dumps(r) + "\n" for r in inputs))
    scored = write_scored(tmp_path / "s.parquet", random_records(seed=2, n=2))
    config = tmp_path / "c.xml"
    tasks = review(scored, tmp_path, "--records", str(records_path), "--document-root", str(tmp_path),
                   "--config-out", str(config))  # fmt: skip
    data = {task["data"]["id"]: task["data"] for task in tasks}
    assert data["r000"]["state"] == '{"a":"x y","b":1}' and data["r001"]["state"] == "plain text"
    assert data["r000"]["image_0"] == "/data/local-files/?d=img/a%20b.png"
    assert data["r000"]["image_1"] == "https://h/x.png" and data["r001"]["image_0"] == ""
    assert data["r001"]["audio_0"] == "/data/local-files/?d=clip.wav" and data["r000"]["audio_0"] == ""
    view = ElementTree.fromstring(config.read_text())
    assert [(t.tag, t.get("value")) for t in view if t.tag in ("Image", "Audio")] == [
        ("Image", "$image_0"), ("Image", "$image_1"), ("Audio", "$audio_0")
    ]  # fmt: skip
    outside = runner.invoke(app, ["review", str(scored), "-o", str(tmp_path / "x.json"), "--records",
                                  str(records_path), "--document-root", str(tmp_path / "img")])  # fmt: skip
    assert outside.exit_code == 2 and "record 'r001', field 'audio'" in outside.stderr


def test_the_url_options_have_their_own_names_and_the_old_ones_still_work_with_a_warning(tmp_path):
    """Review's folder is --document-root and its URL prefix --url-prefix (`clef score --media-root`
    is a fence, another thing); --media-root and --media-url-prefix are hidden aliases that warn;
    an option given by both names is refused."""
    (tmp_path / "img").mkdir()
    records_path = tmp_path / "records.jsonl"
    records_path.write_text(json.dumps({"id": "r000", "state": "s", "images": ["img/a.png"]}) + "\n")
    scored = write_scored(tmp_path / "s.parquet", random_records(seed=2, n=1))
    out = str(tmp_path / "t.json")
    base = ["review", str(scored), "-o", out, "--records", str(records_path)]
    new = runner.invoke(app, [*base, "--document-root", str(tmp_path / "img"), "--url-prefix", "https://ls/files/"])
    assert new.exit_code == 0 and "warning" not in new.stderr, new.output
    want = json.loads((tmp_path / "t.json").read_text())
    assert want[0]["data"]["image_0"] == "https://ls/files/a.png"
    old = runner.invoke(app, [*base, "--media-root", str(tmp_path / "img"), "--media-url-prefix", "https://ls/files/"])
    assert old.exit_code == 0, old.output
    assert json.loads((tmp_path / "t.json").read_text()) == want
    assert "warning: --media-root is now --document-root" in old.stderr
    assert "warning: --media-url-prefix is now --url-prefix" in old.stderr
    both = runner.invoke(app, [*base, "--media-root", str(tmp_path), "--document-root", str(tmp_path)])
    assert both.exit_code == 2 and "give --document-root only" in both.stderr
    shown = runner.invoke(app, ["review", "--help"]).stdout
    assert "--document-root" in shown and "--url-prefix" in shown
    assert "--media-root" not in shown and "--media-url-prefix" not in shown


# ----------------------------------------------------------------------------- records that share an id


SCORED_ROWS = {
    "a": {"urgent": (0.9, 0.1), "team": (0.6, 0.3, 0.1)},
    "b": {"urgent": (0.2, 0.8), "team": (0.1, 0.2, 0.7)},
    "c": {"urgent": (0.7, 0.3), "team": (0.3, 0.4, 0.3)},
}


@pytest.mark.parametrize("layout", ["wide", "long"])
@pytest.mark.parametrize("failed_first", [False, True])
def test_a_failed_row_with_a_scored_rows_id_enters_no_command(tmp_path, layout, failed_first):
    """A duplicate id is an invalid row that carries a scored row's id ("b"). It is no record:
    eval counts 3 records (not 4), calibrate fits 6 labels (not 8), and review writes one task
    per scored record, b's with b's own text and answers (not the failed row's)."""
    rows = [(rid, answers) for rid, answers in SCORED_ROWS.items()]
    texts = [f"text of {rid}" for rid in SCORED_ROWS]
    failed = ("b", None)
    if failed_first:
        rows, texts = [failed, *rows], ["the failed row's text", *texts]
    else:
        rows, texts = [*rows, failed], [*texts, "the failed row's text"]
    scored = write_scored(tmp_path / "s.parquet", rows, layout=layout, extra={"state": texts})
    gold = tmp_path / "gold.jsonl"
    labels = {"a": {"urgent": "true", "team": "billing"}, "b": {"urgent": "false", "team": "tech"},
              "c": {"urgent": "false", "team": "billing"}}  # fmt: skip
    gold.write_text("".join(json.dumps({"id": rid, "labels": found}) + "\n" for rid, found in labels.items()))

    metrics = tmp_path / "m.json"
    result = runner.invoke(app, ["eval", str(scored), "--gold", str(gold), "--json", str(metrics)])
    assert result.exit_code == 0, result.output
    document = json.loads(metrics.read_text())
    assert document["records"] == 3
    for qid in ("urgent", "team"):
        hits = [SCHEMA[qid][1][int(np.argmax(SCORED_ROWS[rid][qid]))] == labels[rid][qid] for rid in labels]
        assert document["questions"][qid]["n"] == 3
        assert document["questions"][qid]["accuracy"] == pytest.approx(np.mean(hits))

    cal = tmp_path / "cal.json"
    result = runner.invoke(app, ["calibrate", str(scored), "--gold", str(gold), "-o", str(cal)])
    assert result.exit_code == 0, result.output
    assert json.loads(cal.read_text())["fitted_on"]["n"] == 6

    tasks = review(scored, tmp_path)
    assert sorted(task["data"]["id"] for task in tasks) == ["a", "b", "c"]
    for task in tasks:
        rid = task["data"]["id"]
        assert task["data"]["state"] == f"text of {rid}"
        [prediction] = task["predictions"]
        answers = {r["from_name"]: r["value"]["choices"][0] for r in prediction["result"]}
        assert answers == {q: SCHEMA[q][1][int(np.argmax(p))] for q, p in SCORED_ROWS[rid].items()}


# ----------------------------------------------------------------------------- what reviewers read

QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Is this urgent?"},
    "team": {"type": "choice", "instructions": "Who handles it?",
             "criteria": {"billing": "Payments & refunds", "sales": "Buying <more>", "tech": None}},
    "severity": {"type": "score", "criteria": ["none", "minor", "major", "critical"]},
}  # fmt: skip


def test_reviewers_read_the_instructions_and_the_options_descriptions(tmp_path):
    """The `--questions` schema the job was scored with (`clef.questions`) reaches the Label Studio
    config (a Header with the instructions, each Choice's `html` with its description, its value
    still the option id) and the Argilla settings (instructions and level criteria as the
    question's description, each label's text); a record's own `questions` in `--records` win."""
    scored = write_scored(tmp_path / "s.parquet", random_records(seed=8, n=6), extra={"state": ["x"] * 6},
                          metadata={"clef.questions": json.dumps(QUESTIONS)})  # fmt: skip
    config = tmp_path / "c.xml"
    review(scored, tmp_path, "--config-out", str(config))
    view = ElementTree.fromstring(config.read_text())
    headers = [h.get("value") for h in view.iter("Header")]
    assert headers == ["Record $id", "urgent: Is this urgent?", "team: Who handles it?", "severity"]
    shown = {c.get("name"): {o.get("value"): o.get("html") for o in c.findall("Choice")} for c in view.iter("Choices")}
    assert shown["urgent"] == {
        "true": "true: The proposition is true or the answer is yes.",
        "false": "false: The proposition is false or the answer is no.",
    }
    # `html` is HTML: the text is escaped once more inside it
    assert shown["team"] == {
        "billing": "billing: Payments &amp; refunds",
        "sales": "sales: Buying &lt;more&gt;",
        "tech": None,
    }
    assert shown["severity"] == {"0": "0: none", "1": "1: minor", "2": "2: major", "3": "3: critical"}

    rg = offline_argilla()
    out = tmp_path / "argilla.json"
    assert runner.invoke(app, ["review", str(scored), "-o", str(out), "--format", "argilla"]).exit_code == 0
    settings = rg.Settings._from_dict(json.loads(out.read_text())["settings"])
    questions = {q.name: q for q in settings.questions}
    assert questions["urgent"].description == "Is this urgent?"
    assert questions["team"]._model.settings.options == [
        {"text": "billing: Payments & refunds", "value": "billing"},
        {"text": "sales: Buying <more>", "value": "sales"},
        {"text": "tech", "value": "tech"},
    ]
    assert questions["severity"].values == [0, 1, 2, 3]
    assert questions["severity"].description == "0: none\n1: minor\n2: major\n3: critical"

    own = {"urgent": {"type": "noul", "instructions": "Does it need an answer today?"}}
    inputs = [tmp_path / "one.jsonl", tmp_path / "two.jsonl"]
    lines = [json.dumps({"id": f"r00{i}", "state": "s", **({"questions": own} if i < 3 else {})}) for i in range(6)]
    inputs[0].write_text("\n".join(lines[:3]) + "\n")
    inputs[1].write_text("\n".join(lines[3:]) + "\n")
    tasks = review(scored, tmp_path, "--config-out", str(config), "--records", str(inputs[0]), "--records",
                   str(inputs[1]))  # fmt: skip
    assert {task["data"]["state"] for task in tasks} == {"s"}  # every record found in the two files
    headers = [h.get("value") for h in ElementTree.fromstring(config.read_text()).iter("Header")]
    assert headers == ["Record $id", "urgent: Does it need an answer today?", "team: Who handles it?", "severity"]


def test_the_ids_only_note_is_for_formats_that_show_records(tmp_path):
    scored = write_scored(tmp_path / "s.parquet", random_records(seed=8, n=6))
    for form, noted in (("label-studio", True), ("argilla", True), ("csv", False), ("jsonl", False)):
        result = runner.invoke(app, ["review", str(scored), "-o", str(tmp_path / "out"), "--format", form])
        assert result.exit_code == 0, result.output
        assert ("tasks hold ids only" in result.stderr) == noted, form


def test_identical_prompts_are_queued_once(tmp_path):
    """Ids with the same record_key (copies of one prompt) make one task, under the copy with the
    smallest record_index; --exclude naming any copy leaves the prompt out."""
    drawn = random_records(seed=9, n=8)
    keys = ["k0", "k1", "k0", "k2", "k1", "k0", "k3", "k4"]
    first = {key: drawn[keys.index(key)][1] or drawn[0][1] for key in keys}  # a copy has its key's result
    records = [(rid, first[key]) for (rid, _), key in zip(drawn, keys, strict=True)]
    scored = write_scored(tmp_path / "s.parquet", records, extra={"record_key": keys})
    out = tmp_path / "tasks.json"
    result = runner.invoke(app, ["review", str(scored), "-o", str(out)])
    assert result.exit_code == 0, result.output
    ids = sorted(task["data"]["id"] for task in json.loads(out.read_text()))
    assert ids == ["r000", "r001", "r003", "r006", "r007"]  # r002, r005 copy r000; r004 copies r001
    assert "3 record(s) repeat the prompt of a queued record" in result.stderr
    gold = tmp_path / "gold.jsonl"
    gold.write_text(json.dumps({"id": "r005", "labels": {"urgent": "true"}}) + "\n")
    ids = [t["data"]["id"] for t in review(scored, tmp_path, "--exclude", str(gold))]
    assert sorted(ids) == ["r001", "r003", "r006", "r007"]


def test_a_record_edited_since_it_was_scored_is_left_out_not_shown_beside_old_answers(tmp_path):
    """--records text is checked against the scored record_key (recomputed as `clef score` made
    it: the output says how): an edited state or image is left out with a note naming it; the
    others, a local image and a `--questions` schema included, are shown."""
    import shutil

    from .support.helpers import MEDIA, TINY_MODEL, write_jsonl

    shutil.copy(MEDIA / "image_a.png", tmp_path / "a.png")
    shutil.copy(MEDIA / "image_a.png", tmp_path / "b.png")
    questions = tmp_path / "questions.json"
    questions.write_text(json.dumps({"urgent": {"type": "noul", "instructions": "Is this urgent?"}}))
    records = [
        {"id": "same", "state": "the printer is on fire"},
        {"id": "edited", "state": "my invoice is wrong"},
        {"id": "picture", "state": "see the photo", "images": ["a.png"]},
        {"id": "repainted", "state": "see this one", "images": ["b.png"]},
    ]
    inputs = write_jsonl(tmp_path / "records.jsonl", records)
    scored = tmp_path / "out.parquet"
    result = runner.invoke(app, ["score", str(inputs), "-o", str(scored), "--model", str(TINY_MODEL), "--quiet",
                                 "--questions", str(questions), "--hidden-states", "drop"])  # fmt: skip
    assert result.exit_code == 0, result.output
    unchanged = review(scored, tmp_path, "--records", str(inputs))
    assert {task["data"]["id"] for task in unchanged} == {"same", "edited", "picture", "repainted"}

    records[1]["state"] = "my invoice is wrong, and late"
    write_jsonl(inputs, records)
    shutil.copy(MEDIA / "image_b.png", tmp_path / "b.png")  # the same path, other pixels
    out = tmp_path / "tasks.json"
    result = runner.invoke(app, ["review", str(scored), "-o", str(out), "--records", str(inputs)])
    assert result.exit_code == 0, result.output
    shown = {task["data"]["id"]: task["data"]["state"] for task in json.loads(out.read_text())}
    assert shown == {"same": "the printer is on fire", "picture": "see the photo"}
    assert "2 record(s) in --records changed since they were scored (first: 'edited')" in result.stderr


def test_a_remote_media_record_stays_in_the_queue_unchecked_and_nothing_is_fetched(tmp_path):
    """Keying a record with a remote image would download it (and, without --allow-remote-media,
    key a refusal that never matches): it is shown unchecked, with a note, and never asked for.
    The output's `clef.media_limits` may name the allow-list and the private-hosts flag too
    (`MediaLimits.as_metadata`); recomputing keys reads only the fields keys are made of."""
    from clef_cli.encoding.media_limits import MediaLimits
    from clef_cli.inputs.readers import read_records
    from clef_cli.store.record_key import MediaHasher, PromptShape, record_key

    from .support.helpers import MEDIA, write_jsonl
    from .support.media_server import body, media_server

    prompt = PromptShape("d" * 64, frozenset())
    scored_with = MediaLimits(allow_remote=True, allowed_media_domains=("127.0.0.1",), allow_private_media_hosts=True)
    noul = {"urgent": {"type": "noul", "instructions": "Is this urgent?"}}
    with media_server(routes={"/a.png": body((MEDIA / "image_a.png").read_bytes(), "image/png")}) as server:
        records = [
            {"id": "text", "state": "the printer is on fire", "questions": noul},
            {"id": "remote", "state": "see the photo", "questions": noul, "images": [server.url("/a.png")]},
        ]
        inputs = write_jsonl(tmp_path / "records.jsonl", records)
        local = MediaHasher(MediaLimits(**{**scored_with.as_dict(), "allow_remote": False}))
        text_key = record_key(next(iter(read_records([inputs]))), prompt, local)
        metadata = {"clef.key_prompt": prompt.as_metadata(), "clef.media_limits": json.dumps(scored_with.as_metadata())}
        answers = {"urgent": (0.3, 0.7)}
        scored = write_scored(tmp_path / "s.parquet", [("text", answers), ("remote", answers)],
                              extra={"record_key": [text_key, "k" * 64]}, metadata=metadata)  # fmt: skip
        out = tmp_path / "tasks.json"
        result = runner.invoke(app, ["review", str(scored), "-o", str(out), "--records", str(inputs)])
        assert server.requests == []
    assert result.exit_code == 0, result.output
    shown = {task["data"]["id"]: task["data"] for task in json.loads(out.read_text())}
    assert set(shown) == {"text", "remote"} and shown["remote"]["image_0"] == server.url("/a.png")
    assert "1 record(s) with remote media shown unchecked against their record_key" in result.stderr
    assert "changed since they were scored" not in result.stderr


def test_the_output_extension_chooses_the_format(scored, tmp_path):
    """`clef review -o x.csv` wrote Label Studio JSON into x.csv: the extension now chooses the
    format (.csv, .jsonl, .json Label Studio), and a --format it contradicts is refused."""
    made = {}
    for name in ("x.csv", "x.jsonl", "x.json", "argilla.json"):
        extra = ["--format", "argilla"] if name == "argilla.json" else []
        result = runner.invoke(app, ["review", str(scored), "-o", str(tmp_path / name), "--limit", "5", *extra])
        assert result.exit_code == 0, result.output
        made[name] = (tmp_path / name).read_text()
    for name, form in (("x.csv", "csv"), ("x.jsonl", "jsonl"), ("x.json", "label-studio"), ("argilla.json", "argilla")):
        out = tmp_path / f"given.{name}"
        given = runner.invoke(app, ["review", str(scored), "-o", str(out), "--limit", "5", "--format", form])
        assert given.exit_code == 0, given.output
        assert out.read_text() == made[name], name
    assert next(csv.reader(made["x.csv"].splitlines()))[:3] == ["id", "record_index", "confidence"]
    refused = runner.invoke(app, ["review", str(scored), "-o", str(tmp_path / "r.csv"), "--format", "label-studio"])
    assert refused.exit_code == 2 and not (tmp_path / "r.csv").exists()
    assert refused.stderr.strip() == (
        "error: --format label-studio writes a .json file, but -o r.csv says csv: end its name in .json, or leave "
        "--format out"
    )
