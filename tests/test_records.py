"""Reading records from JSONL, JSON and Parquet, and validating them with specific messages."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clef_cli.errors import UsageError
from clef_cli.inputs.readers import load_questions_file, read_records
from clef_cli.inputs.records import InvalidRecord, Record

from .helpers import GOLDEN_RECORDS, write_jsonl

NOUL = {"ok": {"type": "noul", "instructions": "Fine?"}}


def only(records: list) -> Record | InvalidRecord:
    assert len(records) == 1
    return records[0]


def error_of(tmp_path: Path, record: dict) -> str:
    result = only(list(read_records([write_jsonl(tmp_path / "r.jsonl", [record])])))
    assert isinstance(result, InvalidRecord), result
    return result.error


def test_jsonl_keeps_order_and_question_order():
    records = list(read_records([GOLDEN_RECORDS]))
    assert [r.index for r in records] == list(range(15))
    four = records[3]
    assert [q.id for q in four.questions] == ["is_spam", "has_link", "language", "tone"]


def test_option_order_follows_the_contract():
    records = {r.id: r for r in read_records([GOLDEN_RECORDS])}
    questions = {q.id: q for q in records["a04-four-questions-overrides"].questions}
    assert questions["has_link"].options == (
        ("true", "The proposition is true or the answer is yes."),
        ("false", None),
    )
    assert questions["language"].option_ids == ("de", "en", "fr")
    assert questions["language"].criteria_order == ("fr", "en", "de")
    assert questions["tone"].option_ids == ("0", "1", "2")
    bucket = {q.id: q for q in records["a13-scalar-state"].questions}["bucket"]
    assert bucket.option_ids == ("0", "1", "10", "2")


def test_json_file_with_one_record_or_a_list(tmp_path):
    record = {"id": "x", "state": "s", "questions": NOUL}
    (tmp_path / "one.json").write_text(json.dumps(record))
    (tmp_path / "many.json").write_text(json.dumps([record, {**record, "id": "y"}]))
    assert [r.id for r in read_records([tmp_path / "one.json"])] == ["x"]
    assert [r.id for r in read_records([tmp_path / "many.json"])] == ["x", "y"]


def test_missing_id_becomes_the_row_index_across_inputs(tmp_path):
    first = write_jsonl(tmp_path / "a.jsonl", [{"state": "s", "questions": NOUL}])
    second = write_jsonl(
        tmp_path / "b.jsonl", [{"state": "t", "questions": NOUL}, {"id": 7, "state": "u", "questions": NOUL}]
    )
    assert [(r.id, r.index) for r in read_records([first, second])] == [("0", 0), ("1", 1), ("7", 2)]


def test_relative_media_resolve_against_the_input_folder(tmp_path):
    folder = tmp_path / "deep"
    folder.mkdir()
    path = write_jsonl(folder / "r.jsonl", [{"state": "s", "questions": NOUL, "images": ["img/a.png"]}])
    record = only(list(read_records([path])))
    assert record.base_dir == folder.resolve()
    assert record.images == ("img/a.png",)


def test_parquet_with_json_text_columns(tmp_path):
    table = pa.table(
        {
            "id": ["p1", "p2"],
            "state": ['{"b": 2, "a": 1}', "plain text"],
            "questions": [json.dumps(NOUL), json.dumps({"c": {"type": "choice", "criteria": {"x": None, "a": "A"}}})],
            "images": [["m/a.png"], []],
            "audio": [None, None],
            "videos": [[], []],
        }
    )
    pq.write_table(table, tmp_path / "r.parquet")
    records = list(read_records([tmp_path / "r.parquet"]))
    assert records[0].state == {"b": 2, "a": 1}
    assert records[1].state == "plain text"
    assert records[0].images == ("m/a.png",)
    assert records[1].questions[0].option_ids == ("a", "x")


def test_parquet_with_nested_columns(tmp_path):
    table = pa.table(
        {
            "id": ["n1"],
            "state": [{"text": "hi", "n": 3}],
            "questions": [{"ok": {"type": "noul", "instructions": "Fine?"}, "absent": None}],
        }
    )
    pq.write_table(table, tmp_path / "r.parquet")
    record = only(list(read_records([tmp_path / "r.parquet"])))
    assert record.state == {"text": "hi", "n": 3}
    assert [q.id for q in record.questions] == ["ok"]


def test_folder_of_parquet_parts_in_name_order(tmp_path):
    for part, name in enumerate(["part-1.parquet", "part-0.parquet"]):
        pq.write_table(pa.table({"id": [f"r{part}"], "state": ["s"], "questions": [json.dumps(NOUL)]}), tmp_path / name)
    assert [r.id for r in read_records([tmp_path])] == ["r1", "r0"]


def test_questions_file_supplies_a_schema_only_where_missing(tmp_path):
    schema = tmp_path / "q.json"
    schema.write_text(json.dumps({"questions": {"team": {"type": "choice", "criteria": {"a": None, "b": None}}}}))
    path = write_jsonl(tmp_path / "r.jsonl", [{"id": "1", "state": "s"}, {"id": "2", "state": "s", "questions": NOUL}])
    records = list(read_records([path], questions=load_questions_file(schema)))
    assert [q.id for q in records[0].questions] == ["team"]
    assert [q.id for q in records[1].questions] == ["ok"]


def test_bad_questions_file_is_a_usage_error(tmp_path):
    schema = tmp_path / "q.json"
    schema.write_text(json.dumps({"x": {"type": "maybe"}}))
    with pytest.raises(UsageError, match="unknown question type 'maybe'"):
        load_questions_file(schema)
    with pytest.raises(UsageError, match="not found"):
        load_questions_file(tmp_path / "missing.json")


def test_limit_stops_reading(tmp_path):
    assert len(list(read_records([GOLDEN_RECORDS], limit=4))) == 4


def test_unknown_input_type_and_missing_input_are_usage_errors(tmp_path):
    (tmp_path / "r.xlsx").write_text("a,b\n")
    with pytest.raises(UsageError, match="unsupported input type"):
        list(read_records([tmp_path / "r.xlsx"]))
    with pytest.raises(UsageError, match="input not found"):
        list(read_records([tmp_path / "nope.jsonl"]))


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"id": "r", "questions": NOUL}, "record 'r', field 'state': missing state"),
        ({"id": "r", "state": "s"}, "record 'r', field 'questions': no questions"),
        (
            {"id": "r", "state": "s", "questions": {}},
            "record 'r', field 'questions': no questions: the schema is empty",
        ),
        (
            {"id": "r", "state": "s", "questions": {"q": {"type": "rank"}}},
            "record 'r', field 'questions.q.type': unknown question type 'rank'",
        ),
        (
            {"id": "r", "state": "s", "questions": {"q": {"type": "choice", "criteria": ["a", "b"]}}},
            "record 'r', field 'questions.q.criteria': choice criteria must be a non-empty object",
        ),
        (
            {"id": "r", "state": "s", "questions": {"q": {"type": "choice", "criteria": {}}}},
            "record 'r', field 'questions.q.criteria': choice criteria must be a non-empty object",
        ),
        (
            {"id": "r", "state": "s", "questions": {"q": {"type": "score", "criteria": {"a": 1}}}},
            "record 'r', field 'questions.q.criteria': score criteria must be a non-empty list",
        ),
        (
            {"id": "r", "state": "s", "questions": {"q": {"type": "score", "criteria": []}}},
            "record 'r', field 'questions.q.criteria': score criteria must be a non-empty list",
        ),
        (
            {"id": "r", "state": "s", "questions": {"q": {"type": "noul", "criteria": "yes"}}},
            "record 'r', field 'questions.q.criteria': noul criteria must be an object with keys true/false",
        ),
        (
            {"id": "r", "state": "s", "questions": NOUL, "images": ["a.png", 3]},
            "record 'r', field 'images[1]': media entries must be strings, got a number",
        ),
        (
            {"id": "r", "state": "s", "questions": NOUL, "audio": 7},
            "record 'r', field 'audio': must be a list of media entries, got a number",
        ),
    ],
)
def test_validation_messages_name_the_record_and_field(tmp_path, record, message):
    assert error_of(tmp_path, record).startswith(message)


def test_duplicate_ids_are_refused_after_the_first(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [{"id": "d", "state": "s", "questions": NOUL}] * 2)
    first, second = read_records([path])
    assert isinstance(first, Record)
    assert isinstance(second, InvalidRecord)
    assert second.error == "record 'd', field 'id': duplicate record id (first used by record 0)"


def test_broken_json_line_is_one_bad_record(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": "a", "state": "s", "questions": {"ok": {"type": "noul"}}}\n{broken\n\n[1]\n')
    good, broken, not_object = read_records([path])
    assert isinstance(good, Record)
    assert broken.error.startswith("r.jsonl line 2: invalid JSON")
    assert not_object.error == "record 2: a record must be a JSON object"
    assert [r.index for r in (good, broken, not_object)] == [0, 1, 2]
