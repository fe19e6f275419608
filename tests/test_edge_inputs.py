"""Edges of the input a user will meet: nothing to score, nothing valid, a missing output folder,
unicode ids, a prompt exactly at --max-length, a cut inside a multibyte character, and native
Parquet columns passed through with --keep-columns."""

from __future__ import annotations

import datetime
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.encoding.prompt import OverflowPolicy, PromptEncoder
from clef_cli.errors import RecordError
from clef_cli.inputs.readers import read_records
from clef_cli.inputs.records import Record
from clef_cli.results import RESULT_SCHEMA

from .support.helpers import TINY_MODEL, write_jsonl

runner = CliRunner()
NOUL = {"ok": {"type": "noul", "instructions": "Fine?"}}


def score(*args: str):
    return runner.invoke(
        app, ["score", *args, "--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--hidden-states", "drop"]
    )


def test_an_empty_input_writes_an_empty_output_when_the_job_means_it(tmp_path):
    """--allow-empty; without it an empty input is refused (tests/test_exit_codes.py)."""
    (tmp_path / "empty.jsonl").write_text("\n\n")
    out = tmp_path / "out.parquet"
    result = score(str(tmp_path / "empty.jsonl"), "-o", str(out), "--allow-empty")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("0 scored, 0 failed of 0 records")
    table = pq.read_table(out)
    assert table.num_rows == 0
    assert table.schema.names == RESULT_SCHEMA.names


def test_only_invalid_records_exit_3_with_every_error(tmp_path):
    path = write_jsonl(
        tmp_path / "bad.jsonl", [{"id": "a", "state": "s"}, {"id": "b", "state": "s", "questions": {"q": {}}}]
    )
    out = tmp_path / "out.parquet"
    result = score(str(path), "-o", str(out))
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith("0 scored, 2 failed of 2 records")
    rows = pq.read_table(out).to_pylist()
    assert [(row["id"], row["answers"], row["prompt_tokens"]) for row in rows] == [("a", None, None), ("b", None, None)]
    assert rows[0]["error"].startswith("record 'a', field 'questions': no questions")
    assert (
        rows[1]["error"]
        == "record 'b', field 'questions.q.type': unknown question type None (expected one of noul, choice, score)"
    )


def test_an_output_folder_that_does_not_exist_is_a_usage_error(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [{"id": "a", "state": "s", "questions": NOUL}])
    result = score(str(path), "-o", str(tmp_path / "missing" / "out.parquet"))
    assert result.exit_code == 2
    missing = tmp_path / "missing"
    assert result.stderr == f"error: --output/-o {missing / 'out.parquet'}: folder {missing} does not exist\n"
    assert not (tmp_path / "missing").exists()


def test_unicode_ids_survive_output_and_resume(tmp_path):
    ids = ["票-001", "Zürich/ß", "emoji 🙂", "right-to-left שלום", "a\tb"]
    path = write_jsonl(tmp_path / "r.jsonl", [{"id": i, "state": f"state {i}", "questions": NOUL} for i in ids])
    out = tmp_path / "out.parquet"
    first = score(str(path), "-o", str(out), "--limit", "3")
    assert first.exit_code == 0, first.output
    second = score(str(path), "-o", str(out))
    assert second.exit_code == 0, second.output
    assert "2 run through the model, 3 from the checkpoint" in second.stderr
    assert [row["id"] for row in pq.read_table(out).to_pylist()] == ids


@pytest.fixture
def one_record(tmp_path) -> Record:
    path = write_jsonl(tmp_path / "r.jsonl", [{"id": "m", "state": "plain state " * 6, "questions": NOUL}])
    (record,) = read_records([path])
    assert isinstance(record, Record)
    return record


def test_a_prompt_exactly_at_max_length_is_not_cut(processor, one_record):
    full = PromptEncoder(processor, max_length=64000).encode(one_record)
    exact = PromptEncoder(processor, max_length=full.length, overflow=OverflowPolicy.error).encode(one_record)
    assert exact.input_ids == full.input_ids and exact.state_tokens_cut == 0 and exact.length == full.length
    one_less = PromptEncoder(processor, max_length=full.length - 1).encode(one_record)
    assert one_less.length == full.length - 1 and one_less.state_tokens_cut == 1
    start, end = full.state_span
    assert one_less.input_ids == full.input_ids[: end - 1] + full.input_ids[end:]  # the state's last token goes
    with pytest.raises(RecordError, match=rf"state is {end - start} tokens but only {end - start - 1} fit"):
        PromptEncoder(processor, max_length=full.length - 1, overflow=OverflowPolicy.error).encode(one_record)


def test_a_cut_inside_a_multibyte_character_keeps_whole_tokens(processor, scorer, tmp_path):
    state = "naïve café — 東京の天気は晴れ、気温は二十度です。🙂🙂 " * 3
    path = write_jsonl(tmp_path / "r.jsonl", [{"id": "u", "state": state, "questions": NOUL}])
    (record,) = read_records([path])
    state_ids = processor.tokenizer(state, add_special_tokens=False)["input_ids"]
    fixed = PromptEncoder(processor, max_length=64000).encode(record).length - len(state_ids)
    # a cut that falls inside a character: the kept tokens do not decode to a prefix of the text
    room = next(n for n in range(5, len(state_ids)) if not state.startswith(processor.tokenizer.decode(state_ids[:n])))
    encoded = PromptEncoder(processor, max_length=fixed + room).encode(record)
    start, end = encoded.state_span
    assert encoded.input_ids[start:end] == state_ids[:room]  # the reference cuts token ids, not text
    assert encoded.state_tokens_cut == len(state_ids) - room
    assert "\ufffd" in processor.tokenizer.decode(encoded.input_ids[start:end])
    (result,) = scorer.score_batch([encoded])
    assert all(abs(sum(question.probabilities) - 1) < 1e-6 for question in result.questions)
    spans = runner.invoke(
        app, ["inspect-spans", str(path), "--model", str(TINY_MODEL), "--max-length", str(fixed + room)]
    )
    assert spans.exit_code == 0, spans.output
    assert f"state tokens: {room} kept, {len(state_ids) - room} cut" in spans.stdout


def test_keep_columns_pass_native_parquet_columns_through_exactly(tmp_path):
    stamps = [datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.timezone.utc), None]
    meta_type = pa.struct([("source", pa.string()), ("score", pa.float64()), ("extra", pa.int64())])
    table = pa.table(
        {
            "id": ["k1", "k2"],
            "state": ["first", "second"],
            "questions": [json.dumps(NOUL)] * 2,
            "tags": pa.array([["a", "b"], []], type=pa.list_(pa.string())),
            "meta": pa.array([{"source": "web", "score": 0.5, "extra": None}, None], type=meta_type),
            "seen": pa.array(stamps, type=pa.timestamp("us", tz="UTC")),
        }
    )
    pq.write_table(table, tmp_path / "in.parquet")
    out = tmp_path / "out.parquet"
    result = score(str(tmp_path / "in.parquet"), "-o", str(out), "--keep-columns", "tags,meta,seen")
    assert result.exit_code == 0, result.output
    written = pq.read_table(out)
    for name in ("tags", "meta", "seen"):
        assert written.schema.field(name).type == table.schema.field(name).type, name
        assert written.column(name).to_pylist() == table.column(name).to_pylist(), name
    assert [row["error"] for row in written.to_pylist()] == [None, None]


def test_a_near_miss_field_fails_its_record_unless_keep_columns_claims_it(tmp_path):
    """`"image": [...]` was scored as text only, exit 0. Now it is that record's error (the others
    are scored); named in --keep-columns it is the user's column, passed through, not media."""
    records = [
        {"id": "typo", "state": "look", "questions": NOUL, "image": ["a.png"]},
        {"id": "fine", "state": "look", "questions": NOUL},
    ]
    path = write_jsonl(tmp_path / "r.jsonl", records)
    result = score(str(path), "-o", str(tmp_path / "o.parquet"))
    assert result.exit_code == 3, result.output
    rows = {row["id"]: row for row in pq.read_table(tmp_path / "o.parquet").to_pylist()}
    assert rows["typo"]["error"] == "record 'typo': unknown field 'image' (did you mean 'images'?)"
    assert rows["fine"]["error"] is None
    kept = score(str(path), "-o", str(tmp_path / "k.parquet"), "--keep-columns", "image")
    assert kept.exit_code == 0, kept.output
    rows = {row["id"]: row for row in pq.read_table(tmp_path / "k.parquet").to_pylist()}
    assert rows["typo"]["image"] == json.dumps(["a.png"]) and rows["fine"]["image"] is None  # JSON text, as kept
    assert rows["typo"]["record_key"] == rows["fine"]["record_key"]  # the same prompt: no media in it


def test_questions_that_no_record_uses_warn_and_a_bom_keeps_the_first_record(tmp_path):
    """--questions while every record has its own was silently ignored: now a warning line. The
    file starts with a UTF-8 byte order mark, which cost its first record ("invalid JSON")."""
    lines = [json.dumps({"id": name, "state": "s", "questions": NOUL}) + "\n" for name in ("a", "b")]
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(lines).encode())
    (tmp_path / "q.json").write_text(json.dumps({"other": {"type": "noul"}}))
    result = score(str(path), "-o", str(tmp_path / "o.parquet"), "--questions", str(tmp_path / "q.json"))
    assert result.exit_code == 0, result.output
    assert "warning: --questions changes nothing for the first 2 records: each has its own questions" in result.stderr
    rows = pq.read_table(tmp_path / "o.parquet").to_pylist()
    assert [(row["id"], row["error"]) for row in rows] == [("a", None), ("b", None)]
