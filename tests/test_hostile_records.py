"""Values of the wrong JSON type, text that is not Unicode, nesting no parser or pickle can hold,
and ids that are neither strings nor integers: each is that record's error, naming the field,
read from JSONL, JSON and Parquet alike. No model is loaded here."""

from __future__ import annotations

import datetime
import json
import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clef_cli.engines.ray.reading import Slice, read_slice
from clef_cli.errors import UNEXPECTED, UsageError
from clef_cli.inputs.json_values import MAX_NESTING
from clef_cli.inputs.readers import load_questions_file, read_records
from clef_cli.inputs.records import InvalidRecord, Record, RecordBuilder
from clef_cli.job.output import passthrough_types

NOUL = {"ok": {"type": "noul", "instructions": "Fine?"}}
LONE = "\ud800"


def write_ascii_jsonl(path: Path, records: list) -> Path:
    """JSON with `\\uXXXX` escapes, the only way a lone surrogate can sit in a valid JSON file."""
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="ascii")
    return path


def read_one(tmp_path: Path, record: dict) -> Record | InvalidRecord:
    good = {"id": "good", "state": "s", "questions": NOUL}
    items = list(read_records([write_ascii_jsonl(tmp_path / "r.jsonl", [good, record])]))
    assert len(items) == 2 and isinstance(items[0], Record)
    return items[1]


def error_of(tmp_path: Path, record: dict) -> str:
    result = read_one(tmp_path, record)
    assert isinstance(result, InvalidRecord), result
    assert UNEXPECTED not in result.error
    return result.error


@pytest.mark.parametrize("qtype", [["noul"], {"noul": 1}, 1, 2.5, True])
def test_a_question_type_that_is_not_a_string_is_the_records_error(tmp_path, qtype):
    error = error_of(tmp_path, {"id": "r", "state": "s", "questions": {"q": {"type": qtype}}})
    assert error.startswith("record 'r', field 'questions.q.type': a question type must be a string, got ")


def test_lines_the_json_parser_cannot_hold_follow_the_malformed_line_rule(tmp_path):
    deep = '{"id": "deep", "state": ' + "[" * 100_000 + "]" * 100_000 + ', "questions": {"q": {"type": "noul"}}}'
    huge_number = '{"id": "n", "state": ' + "9" * 5000 + ', "questions": {"q": {"type": "noul"}}}'
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join([json.dumps({"id": "a", "state": "s", "questions": NOUL}), deep, huge_number, ""]))
    first, second, third = read_records([path])
    assert isinstance(first, Record)
    assert (second.id, second.index) == (None, 1)  # no id could be read: the row's id is null
    assert second.error == "r.jsonl line 2: JSON that cannot be read (nested deeper than the JSON parser allows)"
    assert third.error.startswith("r.jsonl line 3: JSON that cannot be read (")  # then Python's words


TEXT_PATHS = [
    ({"state": LONE}, "state"),
    ({"state": {"a": [1, {"b": LONE}]}}, "state.a[1].b"),
    ({"state": {LONE: 1}}, "state.\ufffd"),
    ({"questions": {"q": {"type": "noul", "instructions": LONE}}}, "questions.q.instructions"),
    ({"questions": {"q": {"type": "noul", "instructions": {"x": [LONE]}}}}, "questions.q.instructions.x[0]"),
    ({"questions": {"q": {"type": "noul", "criteria": {"true": LONE}}}}, "questions.q.criteria.true"),
    ({"questions": {"q": {"type": "choice", "criteria": {"a": LONE}}}}, "questions.q.criteria.a"),
    ({"questions": {"q": {"type": "choice", "criteria": {LONE: "x"}}}}, "questions.q.criteria.\ufffd"),
    ({"questions": {"q": {"type": "score", "criteria": ["low", LONE]}}}, "questions.q.criteria[1]"),
    ({"questions": {LONE: {"type": "noul"}}}, "questions.\ufffd"),
    ({"questions": {"q": {"type": LONE}}}, "questions.q.type"),
    ({"images": ["a.png", LONE]}, "images[1]"),
    ({"videos": [LONE + ".mp4"]}, "videos[0]"),
]


@pytest.mark.parametrize(("change", "field"), TEXT_PATHS)
def test_text_that_is_not_unicode_is_the_records_error_naming_the_path(tmp_path, change, field):
    error = error_of(tmp_path, {"id": "r", "state": "s", "questions": NOUL} | change)
    assert error.startswith(f"record 'r', field {field!r}: "), error
    error.encode("utf-8")  # the message itself can be written


@pytest.mark.parametrize(
    ("value", "shown"), [("ticket-1", "ticket-1"), (7, "7"), (0, "0"), (-3, "-3"), (10**30, str(10**30))]
)
def test_ids_are_strings_or_integers(tmp_path, value, shown):
    record = read_one(tmp_path, {"id": value, "state": "s", "questions": NOUL})
    assert isinstance(record, Record) and record.id == shown


@pytest.mark.parametrize("value", [True, False, 1.5, float("nan"), float("inf"), [], [1], {}, {"a": 1}, LONE])
def test_any_other_id_is_the_records_error_shown_under_its_position(tmp_path, value):
    record = read_one(tmp_path, {"id": value, "state": "s", "questions": NOUL})
    assert isinstance(record, InvalidRecord)
    assert (record.id, record.index) == (None, 1)  # a null id is never taken for a real record's "1"
    assert record.error.startswith("record at index 1, field 'id': ")
    assert "id is null" in record.error


def nested(levels: int, leaf: object = 1) -> object:
    value = leaf
    for level in range(levels):
        value = [value] if level % 2 else {"k": value}
    return value


def test_nesting_is_bounded_below_what_pickle_can_carry(tmp_path):
    at_limit = read_one(tmp_path, {"id": "r", "state": nested(MAX_NESTING), "questions": NOUL})
    assert isinstance(at_limit, Record)
    assert pickle.loads(pickle.dumps(at_limit)) == at_limit  # encoding workers receive records pickled
    error = error_of(tmp_path, {"id": "r", "state": nested(MAX_NESTING + 1), "questions": NOUL})
    assert error.startswith("record 'r', field 'state.k[0]")
    assert error.endswith(f"nested deeper than {MAX_NESTING} levels of arrays and objects")
    instructions = {"q": {"type": "noul", "instructions": nested(MAX_NESTING + 1)}}
    error = error_of(tmp_path, {"id": "r", "state": "s", "questions": instructions})
    assert error.startswith("record 'r', field 'questions.q.instructions")


def test_ray_readers_turn_unpicklable_nesting_into_the_records_error(tmp_path):
    line = '{"id": "deep", "state": ' + "[" * 600 + "]" * 600 + "}\n"
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"id": "a", "state": "s"}) + "\n" + line)
    size = path.stat().st_size
    rows = read_slice(vars(Slice(str(path), size, "jsonl", 0, size, 0)), b"", None)
    assert [row["record_index"] for row in rows] == [0, 1]
    assert rows[0]["problem"] is None
    assert rows[1]["payload"] is None
    assert rows[1]["problem"] == f"record at index 1: nested deeper than {MAX_NESTING} levels of arrays and objects"


def parquet_errors(tmp_path: Path, columns: dict[str, pa.Array]) -> list[str | None]:
    table = pa.table({"questions": pa.array([json.dumps(NOUL)] * len(next(iter(columns.values()))))} | columns)
    pq.write_table(table, tmp_path / "r.parquet")
    return [item.error if isinstance(item, InvalidRecord) else None for item in read_records([tmp_path / "r.parquet"])]


def test_parquet_values_that_are_not_json_are_the_records_error(tmp_path):
    errors = parquet_errors(
        tmp_path,
        {
            "id": pa.array(["a", "b", "c"]),
            "state": pa.array([b"bytes", b"\xff\xfe", b"x"], pa.binary()),
        },
    )
    assert errors == [f"record '{name}', field 'state': binary data where JSON was expected" for name in "abc"]
    when = datetime.datetime(2026, 1, 1)
    errors = parquet_errors(tmp_path, {"id": pa.array(["a"]), "state": pa.array([{"at": when, "n": 1}])})
    assert errors == ["record 'a', field 'state.at': a value of type datetime (not JSON) where JSON was expected"]


def test_parquet_ids_of_other_types_are_the_records_error(tmp_path):
    errors = parquet_errors(tmp_path, {"id": pa.array([1.5, 2.5]), "state": pa.array(["s", "s"])})
    assert [error.split(":")[0] for error in errors] == [f"record at index {i}, field 'id'" for i in (0, 1)]
    assert parquet_errors(tmp_path, {"id": pa.array([5, 6]), "state": pa.array(["s", "s"])}) == [None, None]


def test_parquet_json_text_nested_too_deep_is_the_records_error(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    errors = parquet_errors(tmp_path, {"id": pa.array(["a", "b"]), "state": pa.array([deep, '{"k": 1}'])})
    assert errors == [
        "record 'a', field 'state': JSON text that cannot be read: nested deeper than the JSON parser allows",
        None,
    ]
    table = pa.table({"id": ["a"], "state": ["s"], "questions": ['{"q": ' * 5000 + "1" + "}" * 5000]})
    pq.write_table(table, tmp_path / "q.parquet")
    (record,) = read_records([tmp_path / "q.parquet"])
    assert record.error.startswith("record 'a', field 'questions': JSON text that cannot be read: nested deeper")


def test_json_and_questions_files_too_deep_are_usage_errors(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "r.json").write_text(deep)
    with pytest.raises(UsageError, match="cannot be read: nested deeper than the JSON parser allows"):
        list(read_records([tmp_path / "r.json"]))
    (tmp_path / "q.json").write_text(deep)
    with pytest.raises(UsageError, match=r"questions file .* cannot be read: nested deeper"):
        load_questions_file(tmp_path / "q.json")
    (tmp_path / "q.json").write_text(json.dumps({"q": {"type": "noul", "instructions": LONE}}))
    with pytest.raises(UsageError, match="lone UTF-16 surrogate"):
        load_questions_file(tmp_path / "q.json")


def test_a_last_guard_turns_what_validation_missed_into_the_records_error():
    """Only a Python caller can hand over an integer id too long for `str` (JSON's parser refuses
    it first); the builder's last guard still makes it that record's error, saying it was unexpected."""
    built = RecordBuilder().build({"id": 10**5000, "state": "s", "questions": NOUL}, 4, None)
    assert isinstance(built, InvalidRecord)
    assert (built.id, built.index) == (None, 4)
    assert built.error.startswith(f"record at index 4: {UNEXPECTED} (ValueError: ")  # the type is clef's


def test_pass_through_integers_past_int64_are_kept_whole_as_json_text(tmp_path):
    path = write_ascii_jsonl(tmp_path / "r.jsonl", [{"id": "a", "n": 2**70}, {"id": "b", "n": -(2**64)}])
    passthrough = passthrough_types([path], ["n"], None)
    assert passthrough.types == {"n": pa.string()} and "n" in passthrough.as_text
