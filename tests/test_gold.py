"""Gold labels: every file format, the value normalisations, and each problem named, never raised."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clef_cli.errors import ClefError
from clef_cli.quality.labels.gold import (
    GoldFileError,
    GoldProblem,
    column_gold_rows,
    load_gold,
    match_gold,
    read_gold_rows,
)
from clef_cli.release import file_sha256

OPTIONS = {
    "r1": {
        "spam": ("noul", ("true", "false")),
        "team": ("choice", ("billing", "tech")),
        "level": ("score", ("0", "1", "2", "3")),
    },
    "r2": {"spam": ("noul", ("true", "false")), "team": ("choice", ("billing", "tech"))},
    "r3": {"spam": ("noul", ("true", "false"))},
}
EXPECTED = {"r1": {"spam": "true", "team": "tech", "level": "2"}, "r2": {"spam": "false", "team": "billing"}}


def write(tmp_path, fmt):
    long = [
        {"id": "r1", "labels": {"spam": True, "team": "tech", "level": 2}},
        {"id": "r2", "labels": {"spam": "false", "team": "billing"}},
    ]
    wide = [{"id": "r1", "spam": True, "team": "tech", "level": 2}, {"id": "r2", "spam": False, "team": "billing"}]
    path = tmp_path / f"gold.{fmt.split('-')[0]}"
    if fmt == "jsonl":
        path.write_text("\n".join(json.dumps(row) for row in long) + "\n\n")
    elif fmt == "json":
        path.write_text(json.dumps(wide))
    elif fmt == "csv":
        path.write_text("id,spam,team,level\nr1,True,tech,2\nr2,false,billing,\n")
    elif fmt == "csv-labels":
        path.write_text(
            'id,labels\nr1,"{""spam"": true, ""team"": ""tech"", ""level"": 2}"\n'
            'r2,"{""spam"": false, ""team"": ""billing""}"\n'
        )
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(wide), path)
    elif fmt == "parquet-map":
        table = pa.table(
            {
                "id": ["r1", "r2"],
                "labels": pa.array(
                    [[("spam", "true"), ("team", "tech"), ("level", "2")], [("spam", "false"), ("team", "billing")]],
                    type=pa.map_(pa.string(), pa.string()),
                ),
            }
        )
        pq.write_table(table, path)
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "csv-labels", "parquet", "parquet-map"])
def test_every_format_reads_the_same_labels(tmp_path, fmt):
    path = write(tmp_path, fmt)
    gold = load_gold(path, OPTIONS)
    assert gold.labels == EXPECTED
    assert gold.problems == []
    assert gold.sha256 == file_sha256(path)


def test_each_problem_is_named_and_skipped():
    rows = [
        ("r1", {"spam": "maybe", "team": "tech", "level": 7}),  # not allowed, allowed, level out of range
        ("r2", {"spam": True, "level": 1}),  # level is a question of r1 only
        ("r2", {"spam": False}),  # duplicate id
        ("r9", {"spam": True}),  # not scored
        ("r3", {"colour": "red", "spam": 1}),  # unknown question everywhere; 1 is not a noul option
        ("r4", {"spam": True}),  # failed in scoring
    ]
    gold = match_gold(rows, OPTIONS, failed_ids=["r4"])
    assert gold.labels == {"r1": {"team": "tech"}, "r2": {"spam": "true"}}
    messages = [problem.message for problem in gold.problems]
    assert "record 'r1' question 'spam': gold 'maybe' is not an allowed option (true, false)" in messages
    assert "record 'r1' question 'level': gold '7' is not an allowed option (0, 1, 2, 3)" in messages
    assert "record 'r2': question 'level' is not one of its questions" in messages
    assert "record 'r2': duplicate id in the gold; the first row is used" in messages
    assert "record 'r9' is not in the scored records; its gold is skipped" in messages
    assert "record 'r3' question 'spam': gold '1' is not an allowed option (true, false)" in messages
    assert "question 'colour' is not a question of any scored record (1 gold row)" in messages
    assert "record 'r4' failed in scoring (no answers); its gold is skipped" in messages
    assert len(messages) == 8
    by_kind = {(p.record_id, p.question_id) for p in gold.problems}
    assert ("r1", "spam") in by_kind and (None, "colour") in by_kind and ("r9", None) in by_kind


def test_empty_cells_mean_no_label():
    gold = match_gold([("r1", {"spam": None, "team": "", "level": float("nan")}), ("r2", {"spam": " "})], OPTIONS)
    assert gold.labels == {} and gold.problems == []


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("gold.jsonl", '{"id": "r1"}\n{not json\n', "line 2: not JSON"),
        ("gold.json", '{"id": "r1"}', "holds a list of rows"),
        ("gold.json", '[{"id": "r1"}, 3]', "row 2: expected an object"),
        ("gold.jsonl", '{"labels": {"spam": true}}\n', "row 1: no `id`"),
        ("gold.csv", "name,spam\nr1,true\n", "row 1: no `id`"),
        ("gold.jsonl", '{"id": "r1", "labels": [1, 2]}\n', "`labels` is not an object"),
        ("gold.txt", "id\n", "unknown format"),
        ("gold.parquet", "not parquet", "could not be read"),
        ("missing.jsonl", None, "could not be read"),
    ],
)
def test_unreadable_files_raise_a_clef_error(tmp_path, name, text, needle):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(GoldFileError, match=needle.replace("`", ".").replace("(", ".").replace(")", ".")) as caught:
        read_gold_rows(path)
    assert isinstance(caught.value, ClefError)


def test_gold_column_cells():
    rows, problems = column_gold_rows(["r1", "r2", "r3"], [{"spam": True}, '{"spam": false}', 5], "gold")
    assert rows == [("r1", {"spam": True}), ("r2", {"spam": False})]
    assert [p.message for p in problems] == ["record 'r3': column 'gold' is not a labels object"]
    assert match_gold(rows, OPTIONS).labels == {"r1": {"spam": "true"}, "r2": {"spam": "false"}}


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "csv-labels"])
def test_a_utf8_byte_order_mark_is_read_as_utf8_sig(tmp_path, fmt):
    """Spreadsheet programs start text files with a BOM; it is not part of the first key or row."""
    path = write(tmp_path, fmt)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    gold = load_gold(path, OPTIONS)
    assert gold.labels == EXPECTED and gold.problems == []


def test_integral_floats_are_score_levels_in_every_format(tmp_path):
    """`2.0` (how pandas writes an integer column with a missing value) is level "2" whether it
    comes as CSV text, a JSON number or string, a Parquet double or decimal; 2.5 stays wrong."""
    from decimal import Decimal

    csv_path = tmp_path / "gold.csv"
    csv_path.write_text("id,spam,level\nr1,true,2.0\nr2,false,\n")
    json_path = tmp_path / "gold.jsonl"
    json_path.write_text('{"id": "r1", "labels": {"level": 2.0}}\n{"id": "r2", "labels": {"spam": false}}\n')
    text_path = tmp_path / "gold.json"
    text_path.write_text('[{"id": "r1", "level": "2.0"}, {"id": "r2", "spam": "false"}]')
    double_path, decimal_path = tmp_path / "gold.parquet", tmp_path / "gold.pq"
    pq.write_table(pa.table({"id": ["r1", "r2"], "level": pa.array([2.0, None], pa.float64())}), double_path)
    decimals = pa.array([Decimal("2.00"), None], pa.decimal128(5, 2))
    pq.write_table(pa.table({"id": ["r1", "r2"], "level": decimals}), decimal_path)
    for path in (csv_path, json_path, text_path, double_path, decimal_path):
        gold = load_gold(path, OPTIONS)
        assert gold.labels["r1"]["level"] == "2", path.name
        assert gold.problems == [], (path.name, gold.problems)
    for value in ("2.5", "-0.5", "nan", "1e999999999"):
        half = match_gold([("r1", {"level": value})], OPTIONS)
        assert half.labels == {} and "is not an allowed option (0, 1, 2, 3)" in half.problems[0].message
    choice = match_gold([("r1", {"team": "2.0"})], {"r1": {"team": ("choice", ("2", "2.0"))}})
    assert choice.labels == {"r1": {"team": "2.0"}}  # a choice id is text, never a number


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet"])
def test_an_empty_gold_file_says_so(tmp_path, fmt):
    path = tmp_path / f"gold.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.table({"id": pa.array([], pa.string()), "spam": pa.array([], pa.bool_())}), path)
    else:
        path.write_text({"jsonl": "\n\n", "json": "[]", "csv": "id,spam\n"}[fmt])
    with pytest.raises(GoldFileError, match="holds no rows"):
        read_gold_rows(path)


def test_wide_columns_next_to_a_labels_object_are_named_as_ignored(tmp_path):
    path = tmp_path / "gold.jsonl"
    rows = [
        {"id": "r1", "labels": {"spam": True}, "team": "tech", "note": ""},
        {"id": "r2", "labels": {"spam": False}, "team": "billing", "note": None},
        {"id": "r3", "spam": True},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    gold = load_gold(path, OPTIONS)
    assert gold.labels == {"r1": {"spam": "true"}, "r2": {"spam": "false"}, "r3": {"spam": "true"}}
    assert [problem.message for problem in gold.problems] == [
        "column 'team' is ignored in 2 rows holding a `labels` object (first: record 'r1'); "
        "give either `labels` or one column per question"
    ]


def test_problems_of_the_whole_file_come_first():
    """A summary line (an unknown question in every row) must not hide behind "... and N more"."""
    rows = [(f"x{number}", {"spam": True}) for number in range(30)] + [("r1", {"": "a", "spam": "maybe"})]
    rows += [("r2", {"": "b"})]
    gold = match_gold(rows, OPTIONS, found=[GoldProblem(None, None, "read")])
    messages = [problem.message for problem in gold.problems]
    assert messages[:2] == ["read", "question '' is not a question of any scored record (2 gold rows)"]
    assert len(messages) == 33 and all(problem.record_id is not None for problem in gold.problems[2:])
