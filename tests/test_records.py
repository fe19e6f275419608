"""Reading records from JSONL, JSON and Parquet, and validating them with specific messages."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clef_cli.errors import UsageError
from clef_cli.inputs.readers import load_questions_file, read_records
from clef_cli.inputs.records import InvalidRecord, Record

from .support.helpers import GOLDEN_RECORDS, write_jsonl

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
    assert not_object.error == "record at index 2: a record must be a JSON object"
    assert (broken.id, not_object.id) == (None, None)  # no id could be read: never a made-up one
    assert [r.index for r in (good, broken, not_object)] == [0, 1, 2]


NEAR_MISSES = [
    ("image", "images"), ("Images", "images"), ("IMAGE", "images"), ("video", "videos"), ("Video", "videos"),
    ("Audios", "audio"), ("audios", "audio"), ("ID", "id"), ("ids", "id"), ("States", "state"),
    ("question", "questions"), ("Questions", "questions"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "field"), NEAR_MISSES)
def test_a_field_that_looks_like_a_record_field_is_the_records_error(tmp_path, name, field):
    """`"image": [...]` was dropped without a word: the record was scored as text only."""
    record = {"id": "r", "state": "s", "questions": NOUL, name: ["a.png"]}
    assert error_of(tmp_path, record) == f"record 'r': unknown field {name!r} (did you mean {field!r}?)"


def test_a_near_miss_the_user_claims_or_leaves_null_and_other_fields_are_allowed(tmp_path):
    records = [
        {"id": "kept", "state": "s", "questions": NOUL, "image": ["a.png"]},
        {"id": "null", "state": "s", "questions": NOUL, "Video": None},  # nothing is lost
        {"id": "other", "state": "s", "questions": NOUL, "note": "x", "imagery": ["a.png"], "_id": 3},
    ]
    path = write_jsonl(tmp_path / "r.jsonl", records)
    claimed = list(read_records([path], claimed=["image"]))
    assert all(isinstance(record, Record) for record in claimed), claimed
    assert claimed[0].images == ()  # a kept column is the user's, never a media field
    unclaimed = list(read_records([path]))
    assert isinstance(unclaimed[0], InvalidRecord) and isinstance(unclaimed[1], Record)


def test_a_parquet_near_miss_column_is_each_records_error_when_read_as_a_library(tmp_path):
    pq.write_table(pa.table({"id": ["a", "b"], "state": ["s", "t"], "questions": [json.dumps(NOUL)] * 2,
                             "Images": [["a.png"], None]}), tmp_path / "r.parquet")  # fmt: skip
    first, second = read_records([tmp_path / "r.parquet"])
    assert first.error == "record 'a': unknown field 'Images' (did you mean 'images'?)"
    assert isinstance(second, Record)


def test_a_byte_order_mark_does_not_cost_the_first_record(tmp_path):
    """Windows tools write a UTF-8 BOM; gold files read past it, and so do records (JSONL, JSON)."""
    record = {"id": "first", "state": "s", "questions": NOUL}
    plain = only(list(read_records([write_jsonl(tmp_path / "plain.jsonl", [record])])))
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + (json.dumps(record) + "\n").encode() * 2)
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps([record]).encode())
    with_bom = list(read_records([tmp_path / "bom.jsonl"]))
    assert isinstance(with_bom[0], Record), with_bom[0]
    assert with_bom[0].state == plain.state and with_bom[0].questions == plain.questions
    assert isinstance(with_bom[1], InvalidRecord) and "duplicate record id" in with_bom[1].error
    assert only(list(read_records([tmp_path / "bom.json"]))) == plain
    (tmp_path / "q.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(NOUL).encode())
    assert load_questions_file(tmp_path / "q.json") == NOUL


def test_binary_media_cells_are_the_media_they_hold(tmp_path):
    """A Parquet binary column (or list of binary) in a media field was "got a number": it is the
    medium itself (inputs/media_cells.py), the bytes the record carries, never a number or text."""
    from clef_cli.inputs.media_cells import InlineBytes

    questions = json.dumps(NOUL)
    common = {"state": ["s"], "questions": [questions]}
    whole_cell = pa.array([b"\x89PNG"], pa.binary())
    pq.write_table(pa.table({"id": ["a"], **common, "images": whole_cell}), tmp_path / "bin.parquet")
    entry_cells = pa.array([[b"RIFF"]], pa.list_(pa.binary()))
    pq.write_table(pa.table({"id": ["b"], **common, "audio": entry_cells}), tmp_path / "list.parquet")
    whole, inner = read_records([tmp_path / "bin.parquet", tmp_path / "list.parquet"])
    [image] = whole.images
    [clip] = inner.audio
    assert isinstance(image, InlineBytes) and isinstance(clip, InlineBytes)
    assert (image.digest, clip.digest) == (hashlib.sha256(b"\x89PNG").hexdigest(), hashlib.sha256(b"RIFF").hexdigest())
