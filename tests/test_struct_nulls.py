"""Parquet struct columns never silently change a record's prompt (issue: nulls merged across rows).

The oracle for every mode is the same records read from JSONL, which keeps each record's own keys.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.inputs.parquet_rows import StructNulls
from clef_cli.inputs.readers import read_records
from clef_cli.inputs.records import InvalidRecord, Record

from .support.helpers import TINY_MODEL, assert_same_rows, write_jsonl

runner = CliRunner()

# Rows with different keys in state (also nested), in questions, in choice criteria and in
# structured instructions. Question order follows first appearance, as a struct column keeps it.
ROWS = [
    {
        "id": "r1",
        "state": {"text": "hello"},
        "questions": {
            "team": {"type": "choice", "instructions": "Who?", "criteria": {"x": "ex", "a": "ay"}},
        },
    },
    {
        "id": "r2",
        "state": {"text": "bye", "n": 3},
        "questions": {
            "team": {"type": "choice", "criteria": {"b": "bee", "d": "dee"}},
            "urgent": {"type": "noul", "instructions": {"en": "Urgent?"}, "criteria": {"true": "Yes, now"}},
        },
    },
    {
        "id": "r3",
        "state": {"text": "mid", "meta": {"k": 1}},
        "questions": {
            "urgent": {
                "type": "noul",
                "instructions": {"en": "Urgent?", "de": "Dringend?"},
                "criteria": {"false": "Not now"},
            },
            "level": {"type": "score", "criteria": ["low", "high"]},
        },
    },
    {
        "id": "full",  # every key of every other row: nothing to refuse
        "state": {"text": "all", "n": 1, "meta": {"k": 2}},
        "questions": {
            "team": {"type": "choice", "instructions": "Who?", "criteria": {"x": "1", "a": "2", "b": "3", "d": "4"}},
            "urgent": {"type": "noul", "instructions": {"en": "U", "de": "D"}, "criteria": {"true": "T", "false": "F"}},
            "level": {"type": "score", "criteria": ["low", "high"]},
        },
    },
]

NULL_MODE_EXPECTED = {
    # what `--struct-nulls null` reads: every key of the column, missing ones as explicit nulls
    "r1": (
        {"text": "hello", "n": None, "meta": None},
        {"team": ("a", "b", "d", "x")},
    ),
    "r2": (
        {"text": "bye", "n": 3, "meta": None},
        {"team": ("a", "b", "d", "x"), "urgent": ("true", "false")},
    ),
    "r3": ({"text": "mid", "n": None, "meta": {"k": 1}}, {"urgent": ("true", "false"), "level": ("0", "1")}),
}


def write_struct_parquet(path, rows=ROWS):
    table = pa.Table.from_pylist(rows)  # the ordinary way; it merges keys across rows
    assert pa.types.is_struct(table.schema.field("questions").type)
    pq.write_table(table, path)
    return path


def by_id(items):
    return {item.id: item for item in items}


def test_struct_nulls_are_refused_by_default_naming_column_key_path_and_fix(tmp_path):
    records = by_id(read_records([write_struct_parquet(tmp_path / "r.parquet")]))
    assert isinstance(records["full"], Record)
    assert {name for name, item in records.items() if isinstance(item, InvalidRecord)} == {"r1", "r2", "r3"}
    # the state is checked first; the message names the record, the key path, the column and both fixes
    assert records["r1"].error == (
        "record 'r1', field 'state.n': null in the Parquet struct column 'state' (and 1 more): a struct column "
        "gives every row the keys of every record, so this record may not have this key at all, and scoring "
        "would change its prompt. Store 'state' as JSON text or as a Parquet map, or say what the nulls mean "
        "with --struct-nulls absent (keys the record does not have) or --struct-nulls null (explicit nulls)"
    )
    assert records["r2"].error.startswith("record 'r2', field 'state.meta': null in the Parquet struct column 'state'")
    assert records["r3"].error.startswith("record 'r3', field 'state.n': null in the Parquet struct column 'state'")


def test_questions_are_checked_too_down_to_criteria_and_instructions(tmp_path):
    rows = [{**row, "state": "plain text"} for row in ROWS]
    records = by_id(read_records([write_struct_parquet(tmp_path / "r.parquet", rows)]))
    assert isinstance(records["full"], Record)
    assert records["r1"].error.startswith(
        "record 'r1', field 'questions.team.criteria.b': null in the Parquet struct column 'questions' (and 1 more)"
    )
    # r2 has team's b and d but not x and a; its urgent question lacks instructions.de and criteria.false
    assert records["r2"].error.startswith(
        "record 'r2', field 'questions.team.criteria.x': null in the Parquet struct column 'questions' (and 3 more)"
    )
    assert records["r3"].error.startswith(
        "record 'r3', field 'questions.urgent.criteria.true': null in the Parquet struct column 'questions':"
    )


def test_absent_mode_reads_each_record_as_written(tmp_path):
    oracle = by_id(read_records([write_jsonl(tmp_path / "r.jsonl", ROWS)]))
    got = by_id(read_records([write_struct_parquet(tmp_path / "r.parquet")], struct_nulls=StructNulls.absent))
    assert list(got) == list(oracle) == ["r1", "r2", "r3", "full"]
    for record_id, record in got.items():
        assert isinstance(record, Record)
        assert record == oracle[record_id]  # state, questions (order, options, descriptions), media


def test_null_mode_reads_missing_keys_as_explicit_nulls(tmp_path):
    got = by_id(read_records([write_struct_parquet(tmp_path / "r.parquet")], struct_nulls=StructNulls.null))
    for record_id, (state, options) in NULL_MODE_EXPECTED.items():
        record = got[record_id]
        assert isinstance(record, Record), record
        assert record.state == state
        assert {q.id: q.option_ids for q in record.questions} == options
    team = dict(got["r1"].questions[0].options)
    assert team == {"a": "ay", "b": None, "d": None, "x": "ex"}
    # a null instructions field reads as missing (the id is shown), nested instruction keys as nulls
    urgent = next(q for q in got["r3"].questions if q.id == "urgent")
    assert urgent.instructions == {"en": "Urgent?", "de": "Dringend?"}
    urgent_r2 = next(q for q in got["r2"].questions if q.id == "urgent")
    assert urgent_r2.instructions == {"en": "Urgent?", "de": None}
    assert dict(urgent_r2.options) == {"true": "Yes, now", "false": None}  # an explicit null drops the default


def test_json_text_and_map_columns_keep_exact_keys_under_the_default(tmp_path):
    rows = [
        {
            "id": "t1",
            "state": {"text": "hi", "flag": None},
            "questions": {"c": {"type": "choice", "criteria": {"x": None}}},
        },
        {
            "id": "t2",
            "state": {"text": "yo"},
            "questions": {"c": {"type": "choice", "criteria": {"y": "why", "z": "zed"}}},
        },
    ]
    oracle = by_id(read_records([write_jsonl(tmp_path / "r.jsonl", rows)]))
    text = pa.table(
        {
            "id": [row["id"] for row in rows],
            "state": [json.dumps(row["state"]) for row in rows],
            "questions": [json.dumps(row["questions"]) for row in rows],
        }
    )
    pq.write_table(text, tmp_path / "text.parquet")
    question = pa.struct([("type", pa.string()), ("criteria", pa.map_(pa.string(), pa.string()))])
    mapped = pa.table(
        {
            "id": [row["id"] for row in rows],
            "state": pa.array([list(row["state"].items()) for row in rows], type=pa.map_(pa.string(), pa.string())),
            "questions": pa.array(
                [
                    [
                        (qid, {"type": q["type"], "criteria": list(q["criteria"].items())})
                        for qid, q in row["questions"].items()
                    ]
                    for row in rows
                ],
                type=pa.map_(pa.string(), question),
            ),
        }
    )
    pq.write_table(mapped, tmp_path / "map.parquet")
    for name in ("text.parquet", "map.parquet"):
        got = by_id(read_records([tmp_path / name]))
        assert list(got) == ["t1", "t2"]
        for record_id, record in got.items():
            assert isinstance(record, Record), (name, record)
            assert record.state == oracle[record_id].state
            assert record.questions == oracle[record_id].questions
    assert by_id(read_records([tmp_path / "map.parquet"]))["t1"].state == {"text": "hi", "flag": None}


def test_uniform_struct_columns_need_no_option(tmp_path):
    rows = [{"id": f"u{i}", "state": {"a": i, "b": "x"}, "questions": {"q": {"type": "noul"}}} for i in range(3)]
    records = list(read_records([write_struct_parquet(tmp_path / "r.parquet", rows)]))
    assert [r.state for r in records] == [{"a": 0, "b": "x"}, {"a": 1, "b": "x"}, {"a": 2, "b": "x"}]


def test_inspect_spans_honours_the_rule_and_the_option(tmp_path):
    path = write_struct_parquet(tmp_path / "r.parquet")
    base = ["inspect-spans", str(path), "--model", str(TINY_MODEL), "--id", "r1", "--json"]
    refused = runner.invoke(app, base)
    assert refused.exit_code == 1
    assert "record 'r1', field 'state.n': null in the Parquet struct column 'state'" in refused.stderr
    assert "--struct-nulls absent" in refused.stderr
    jsonl = write_jsonl(tmp_path / "r.jsonl", ROWS)
    want = json.loads(runner.invoke(app, [*base[:1], str(jsonl), *base[2:]]).stdout)
    absent = runner.invoke(app, [*base, "--struct-nulls", "absent"])
    assert absent.exit_code == 0, absent.output
    assert json.loads(absent.stdout)["input_ids"] == want["input_ids"]
    null = json.loads(runner.invoke(app, [*base, "--struct-nulls", "null"]).stdout)
    assert null["input_ids"] != want["input_ids"]
    null_view = runner.invoke(app, [*base[:-1], "--struct-nulls", "null"])  # the human view shows the prompt
    assert 'STATE:\n{"meta":null,"n":null,"text":"hello"}\n' in null_view.stdout


def test_score_records_the_choice_in_keys_and_provenance(tmp_path):
    path = write_struct_parquet(tmp_path / "r.parquet")
    common = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--hidden-states", "drop"]
    refused = runner.invoke(app, ["score", str(path), "-o", str(tmp_path / "refused.parquet"), *common])
    assert refused.exit_code == 3, refused.output
    assert "1 scored, 3 failed of 4 records" in refused.stderr
    out = tmp_path / "absent.parquet"
    absent = runner.invoke(app, ["score", str(path), "-o", str(out), "--struct-nulls", "absent", *common])
    assert absent.exit_code == 0, absent.output
    oracle_out = tmp_path / "oracle.parquet"
    jsonl = write_jsonl(tmp_path / "r.jsonl", ROWS)
    assert runner.invoke(app, ["score", str(jsonl), "-o", str(oracle_out), *common]).exit_code == 0
    assert pq.read_table(out).to_pylist() == pq.read_table(oracle_out).to_pylist()
    assert pq.read_schema(out).metadata[b"clef.struct_nulls"] == b"absent"
    # the choice shapes the records, so it is in their keys: the records it changes run again
    # on the same store, and the output is a fresh `null` run's
    changed = runner.invoke(app, ["score", str(path), "-o", str(out), "--struct-nulls", "null", *common])
    assert changed.exit_code == 0, changed.output
    fresh = tmp_path / "fresh-null.parquet"
    assert runner.invoke(app, ["score", str(path), "-o", str(fresh), "--struct-nulls", "null", *common]).exit_code == 0
    got, want = pq.read_table(out).to_pylist(), pq.read_table(fresh).to_pylist()
    assert_same_rows(got, want, probability_tolerance=1e-5)  # stored results came from other batches
    assert [row["record_key"] for row in got] == [row["record_key"] for row in want]
    assert pq.read_schema(out).metadata[b"clef.struct_nulls"] == b"null"


def test_readme_snippet_writes_records_losslessly(tmp_path):
    page = (Path(__file__).parent.parent / "docs" / "records.md").read_text()
    section = page.split("### Parquet input", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(snippet, namespace)
    rows = [
        *ROWS,
        {"id": "text", "state": "plain text", "questions": {"q": {"type": "noul", "criteria": {"true": None}}}},
    ]
    namespace["to_parquet"](rows, tmp_path / "r.parquet")
    oracle = list(read_records([write_jsonl(tmp_path / "r.jsonl", rows)]))
    got = list(read_records([tmp_path / "r.parquet"]))
    assert all(isinstance(record, Record) for record in got)
    assert got == oracle


def test_the_choice_is_checked_in_the_library_and_the_cli(tmp_path):
    from clef_cli.engines.local.pipeline import ScoreSettings
    from clef_cli.errors import UsageError

    inputs = [str(write_jsonl(tmp_path / "r.jsonl", []))]  # an input that exists: validate checks that too
    settings = ScoreSettings(inputs=inputs, output=tmp_path / "o.parquet", struct_nulls="absent")
    settings.validate()
    assert settings.struct_nulls is StructNulls.absent
    with pytest.raises(UsageError, match=r"^--struct-nulls must be refuse, absent or null, not 'maybe'$"):
        ScoreSettings(inputs=inputs, output=tmp_path / "o.parquet", struct_nulls="maybe").validate()
    result = runner.invoke(app, ["score", "r.jsonl", "-o", str(tmp_path / "o.parquet"), "--struct-nulls", "maybe"])
    assert result.exit_code == 2 and "'maybe' is not one of refuse, absent or null" in result.output


# Structs inside lists: `state.items` is a list of structs, so every element gets every key of every
# element of every row. The second item of r1 and the first of r2 have no `qty`.
ONE_QUESTION = {"q": {"type": "noul"}}
LISTED = [
    {"id": "r1", "state": {"items": [{"sku": "a", "qty": 2}, {"sku": "b"}]}, "questions": ONE_QUESTION},
    {"id": "r2", "state": {"items": [{"sku": "c"}], "tags": [[{"k": 1}]]}, "questions": ONE_QUESTION},
    {"id": "r3", "state": {"items": [{"sku": "d", "qty": 1}], "tags": [[{"k": 2}]]}, "questions": ONE_QUESTION},
]


def test_structs_inside_lists_are_checked_element_by_element(tmp_path):
    path = write_struct_parquet(tmp_path / "listed.parquet", LISTED)
    assert pa.types.is_list(pq.read_schema(path).field("state").type.field("items").type)
    records = by_id(read_records([path]))
    assert isinstance(records["r3"], Record)
    assert records["r1"].error.startswith(
        "record 'r1', field 'state.items[1].qty': null in the Parquet struct column 'state' (and 1 more):"
    )  # and state.tags, a list of lists of structs, which r1 lacks
    assert records["r2"].error.startswith(
        "record 'r2', field 'state.items[0].qty': null in the Parquet struct column 'state':"
    )
    oracle = by_id(read_records([write_jsonl(tmp_path / "listed.jsonl", LISTED)]))
    absent = by_id(read_records([path], struct_nulls=StructNulls.absent))
    assert {name: record.state for name, record in absent.items()} == {
        name: record.state for name, record in oracle.items()
    }
    explicit = by_id(read_records([path], struct_nulls=StructNulls.null))
    assert explicit["r1"].state == {"items": [{"sku": "a", "qty": 2}, {"sku": "b", "qty": None}], "tags": None}
    # a state that is itself a list of structs
    rows = [{"id": "top", "state": [{"sku": "a", "qty": 1}, {"sku": "b"}], "questions": ONE_QUESTION}]
    (top,) = read_records([write_struct_parquet(tmp_path / "top.parquet", rows)])
    assert top.error.startswith("record 'top', field 'state[1].qty': null in the Parquet struct column 'state':")
