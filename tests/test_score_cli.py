"""`clef score` end to end on the sample data, with media, bad records and every output option."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.prompt import PromptEncoder
from clef_cli.records import Record, read_records

from .conftest import SAMPLE_DATA, TINY_MODEL, write_jsonl

runner = CliRunner()


def score(*args: str):
    return runner.invoke(app, ["score", *args, "--model", str(TINY_MODEL), "--workers", "0", "--quiet"])


@pytest.fixture(scope="module")
def sample_with_bad_records(tmp_path_factory) -> Path:
    """The sample records plus one with a corrupt image and one with an invalid schema."""
    folder = tmp_path_factory.mktemp("sample")
    shutil.copytree(SAMPLE_DATA / "media", folder / "media")
    (folder / "media" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    records = [json.loads(line) for line in (SAMPLE_DATA / "records.jsonl").read_text().splitlines() if line]
    records.insert(
        3, {"id": "bad-image", "state": "photo", "images": ["media/corrupt.png"], "questions": {"ok": {"type": "noul"}}}
    )
    records.insert(7, {"id": "bad-schema", "state": "x", "questions": {"q": {"type": "choice", "criteria": []}}})
    return write_jsonl(folder / "records.jsonl", records)


@pytest.fixture(scope="module")
def scored_sample(sample_with_bad_records, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "scored.parquet"
    result = score(str(sample_with_bad_records), "-o", str(out), "--max-batch-tokens", "3000")
    return result, out


def test_end_to_end_with_media_and_bad_records(scored_sample, sample_with_bad_records, scorer, processor):
    result, out = scored_sample
    assert result.exit_code == 3, result.output
    assert "2 failed of 19 records" in result.stderr
    table = pq.read_table(out)
    rows = table.to_pylist()
    inputs = list(read_records([sample_with_bad_records]))
    assert [row["id"] for row in rows] == [record.id for record in inputs]
    assert [row["record_index"] for row in rows] == list(range(19))
    errors = {row["id"]: row["error"] for row in rows if row["error"]}
    assert set(errors) == {"bad-image", "bad-schema"}
    assert errors["bad-image"].startswith("record 'bad-image', field 'images[0]': not a decodable image")
    assert errors["bad-schema"].startswith("record 'bad-schema', field 'questions.q.criteria'")
    assert all(row["answers"] is None for row in rows if row["error"])

    encoder = PromptEncoder(processor, max_length=64000)
    checked = 0
    for record, row in zip(inputs, rows):
        if not isinstance(record, Record) or row["error"]:
            continue
        expected = scorer.score_batch([encoder.encode(record)])[0]
        assert row["prompt_tokens"] == expected.prompt_tokens
        for answer, question in zip(row["answers"], expected.questions):
            assert answer["question_id"] == question.question_id
            assert [label["label"] for label in answer["labels"]] == list(question.option_ids)
            for label, probability, logit in zip(answer["labels"], question.probabilities, question.logits):
                assert abs(label["probability"] - probability) < 1e-5
                assert abs(label["logit"] - logit) < 1e-4
            assert answer["answer"] == question.answer
        checked += 1
    assert checked == 17


def test_output_schema_and_types(scored_sample):
    _, out = scored_sample
    schema = pq.read_schema(out)
    assert schema.names == ["id", "record_index", "prompt_tokens", "state_tokens_cut", "error", "answers"]
    assert schema.field("record_index").type == pa.int64()
    assert schema.field("prompt_tokens").type == pa.int32()
    answer = schema.field("answers").type.value_type
    assert [answer.field(i).name for i in range(answer.num_fields)] == [
        "question_id",
        "type",
        "answer",
        "confidence",
        "noul",
        "score",
        "labels",
    ]
    rows = pq.read_table(out).to_pylist()
    noul = next(a for row in rows if row["answers"] for a in row["answers"] if a["type"] == "noul")
    assert [label["label"] for label in noul["labels"]] == ["true", "false"]
    assert noul["noul"] == noul["labels"][0]["probability"] and noul["score"] is None
    assert noul["answer"] in ("true", "false")
    score_answer = next(a for row in rows if row["answers"] for a in row["answers"] if a["type"] == "score")
    levels = [label["probability"] for label in score_answer["labels"]]
    assert score_answer["score"] == pytest.approx(sum(i * p for i, p in enumerate(levels)))
    assert score_answer["answer"] == str(levels.index(max(levels)))


def test_provenance_metadata(scored_sample):
    _, out = scored_sample
    metadata = {k.decode(): v.decode() for k, v in pq.read_schema(out).metadata.items()}
    from clef_cli import __version__
    from clef_cli.release import file_sha256

    assert metadata["clef.version"] == __version__
    assert metadata["clef.model"] == str(TINY_MODEL)
    assert metadata["clef.head_sha256"] == file_sha256(TINY_MODEL / "joint_head.safetensors")
    assert metadata["clef.max_length"] == "64000"
    assert metadata["clef.overflow"] == "truncate"
    assert metadata["clef.dtype"] == "float32"
    assert metadata["clef.created"].endswith("Z")
    assert metadata["clef.weights_fingerprint"]


def test_parquet_input_gives_the_same_results(scored_sample, tmp_path):
    out = tmp_path / "from_parquet.parquet"
    result = score(str(SAMPLE_DATA / "records.parquet"), "-o", str(out))
    assert result.exit_code == 0, result.output
    from_parquet = pq.read_table(out).to_pylist()
    from_jsonl = [row for row in pq.read_table(scored_sample[1]).to_pylist() if not row["id"].startswith("bad-")]
    assert [row["id"] for row in from_parquet] == [row["id"] for row in from_jsonl]
    for a, b in zip(from_parquet, from_jsonl):
        assert a["prompt_tokens"] == b["prompt_tokens"]
        for x, y in zip(a["answers"], b["answers"]):
            assert [label["probability"] for label in x["labels"]] == pytest.approx(
                [label["probability"] for label in y["labels"]], abs=1e-6
            )


def test_long_layout_and_keep_columns(tmp_path):
    records = [
        {"id": "a", "state": "s", "questions": {"q": {"type": "noul"}}, "source": "web", "n": 1, "meta": {"k": [1]}},
        {
            "id": "b",
            "state": "t",
            "questions": {
                "c": {"type": "choice", "criteria": {"x": None, "y": "Y"}},
                "s": {"type": "score", "criteria": ["lo", "mid", "hi"]},
            },
            "source": "app",
            "n": 2.5,
        },
        {"id": "c", "questions": {"q": {"type": "noul"}}, "source": "web"},
    ]
    path = write_jsonl(tmp_path / "r.jsonl", records)
    wide, long = tmp_path / "wide.parquet", tmp_path / "long.parquet"
    assert score(str(path), "-o", str(wide), "--keep-columns", "source,n,meta").exit_code == 3
    result = score(str(path), "-o", str(long), "--layout", "long", "--keep-columns", "source,meta")
    assert result.exit_code == 3, result.output
    wide_rows = pq.read_table(wide).to_pylist()
    assert [row["source"] for row in wide_rows] == ["web", "app", "web"]
    assert [row["n"] for row in wide_rows] == [1.0, 2.5, None]
    assert wide_rows[0]["meta"] == '{"k":[1]}' or json.loads(wide_rows[0]["meta"]) == {"k": [1]}
    long_table = pq.read_table(long)
    assert long_table.schema.names == [
        "id",
        "record_index",
        "question_id",
        "type",
        "label",
        "probability",
        "logit",
        "error",
        "source",
        "meta",
    ]
    long_rows = long_table.to_pylist()
    assert len(long_rows) == 2 + (2 + 3) + 1
    assert [row["label"] for row in long_rows if row["id"] == "b"] == ["x", "y", "0", "1", "2"]
    assert [row["source"] for row in long_rows if row["id"] == "b"] == ["app"] * 5
    failed = [row for row in long_rows if row["id"] == "c"]
    assert len(failed) == 1 and failed[0]["error"].startswith("record 'c', field 'state'")
    wide_probabilities = [
        label["probability"] for row in wide_rows if row["answers"] for a in row["answers"] for label in a["labels"]
    ]
    assert [row["probability"] for row in long_rows if row["probability"] is not None] == wide_probabilities


def test_keep_columns_errors(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [{"id": "a", "state": "s", "questions": {"q": {"type": "noul"}}}])
    result = score(str(path), "-o", str(tmp_path / "o.parquet"), "--keep-columns", "nope")
    assert result.exit_code == 2 and "no input record has nope" in result.stderr
    result = score(str(path), "-o", str(tmp_path / "o.parquet"), "--keep-columns", "error")
    assert result.exit_code == 2 and "cannot pass through error" in result.stderr


def test_limit_scores_only_the_first_records(tmp_path):
    out = tmp_path / "limited.parquet"
    result = score(str(SAMPLE_DATA / "records.jsonl"), "-o", str(out), "--limit", "3")
    assert result.exit_code == 0, result.output
    rows = pq.read_table(out).to_pylist()
    assert [row["id"] for row in rows] == ["ticket-001", "ticket-002", "ticket-003"]


def test_dry_run_plans_without_weights(tmp_path):
    release = tmp_path / "no-weights"
    shutil.copytree(TINY_MODEL, release, ignore=shutil.ignore_patterns("model.safetensors"))
    out = tmp_path / "never.parquet"
    result = runner.invoke(
        app,
        [
            "score",
            str(SAMPLE_DATA / "records.jsonl"),
            "-o",
            str(out),
            "--model",
            str(release),
            "--workers",
            "0",
            "--dry-run",
            "--max-batch-tokens",
            "4096",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "records: 17 (17 valid, 0 invalid)" in result.stdout
    assert "prompt tokens: min " in result.stdout and "p90" in result.stdout
    assert "batches: " in result.stdout and "(1 with audio-in-video)" in result.stdout
    assert "padding waste: " in result.stdout
    assert not out.exists() and not Path(str(out) + ".ckpt").exists()


def test_dry_run_reports_invalid_records(sample_with_bad_records, tmp_path):
    result = score(str(sample_with_bad_records), "-o", str(tmp_path / "x.parquet"), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "records: 19 (17 valid, 2 invalid)" in result.stdout
    assert "invalid: record 'bad-image', field 'images[0]'" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layout", "tall"], "--layout must be 'wide' or 'long'"),
        (["--on-overflow", "ignore"], "--on-overflow must be 'truncate' or 'error'"),
        (["--hidden-states", "maybe"], "--hidden-states must be 'keep' or 'drop'"),
        (["--max-file-bytes", "lots"], "not a size: 'lots'"),
    ],
)
def test_usage_errors_exit_2_with_one_line(tmp_path, args, message):
    result = score(str(SAMPLE_DATA / "records.jsonl"), "-o", str(tmp_path / "o.parquet"), *args)
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.output


def test_output_must_be_parquet_and_inputs_must_exist(tmp_path):
    result = score(str(SAMPLE_DATA / "records.jsonl"), "-o", str(tmp_path / "o.csv"))
    assert result.exit_code == 2 and "must end in .parquet" in result.stderr
    result = score(str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o.parquet"))
    assert result.exit_code == 2 and "input not found" in result.stderr


def test_missing_model_is_fatal_exit_1(tmp_path):
    result = runner.invoke(
        app,
        [
            "score",
            str(SAMPLE_DATA / "records.jsonl"),
            "-o",
            str(tmp_path / "o.parquet"),
            "--model",
            str(tmp_path / "nowhere"),
            "--quiet",
        ],
    )
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: model folder not found: {tmp_path / 'nowhere'}"


def test_background_workers_give_the_same_output(scored_sample, tmp_path, sample_with_bad_records):
    out = tmp_path / "workers.parquet"
    result = runner.invoke(
        app,
        [
            "score",
            str(sample_with_bad_records),
            "-o",
            str(out),
            "--model",
            str(TINY_MODEL),
            "--workers",
            "2",
            "--quiet",
            "--window",
            "5",
            "--max-batch-tokens",
            "2500",
        ],
    )
    assert result.exit_code == 3, result.output
    assert_same_rows(pq.read_table(out).to_pylist(), pq.read_table(scored_sample[1]).to_pylist())


def assert_same_rows(rows_a: list, rows_b: list) -> None:
    assert [r["id"] for r in rows_a] == [r["id"] for r in rows_b]
    for a, b in zip(rows_a, rows_b):
        assert a["error"] == b["error"]
        if a["answers"]:
            for x, y in zip(a["answers"], b["answers"]):
                assert [label["probability"] for label in x["labels"]] == pytest.approx(
                    [label["probability"] for label in y["labels"]], abs=1e-5
                )


def test_questions_file_for_records_without_a_schema(tmp_path):
    out = tmp_path / "posts.parquet"
    result = score(str(SAMPLE_DATA / "posts.jsonl"), "-o", str(out), "-q", str(SAMPLE_DATA / "questions.json"))
    assert result.exit_code == 0, result.output
    schema = json.loads((SAMPLE_DATA / "questions.json").read_text())
    schema = schema.get("questions", schema)
    for row in pq.read_table(out).to_pylist():
        assert [answer["question_id"] for answer in row["answers"]] == list(schema)


def test_a_shorter_limit_after_a_longer_run_reuses_the_checkpoint(tmp_path):
    out = tmp_path / "o.parquet"
    assert score(str(SAMPLE_DATA / "records.jsonl"), "-o", str(out), "--limit", "6").exit_code == 0
    result = score(str(SAMPLE_DATA / "records.jsonl"), "-o", str(out), "--limit", "2")
    assert result.exit_code == 0, result.output
    assert "0 run through the model, 6 from the checkpoint" in result.stderr
    assert [row["id"] for row in pq.read_table(out).to_pylist()] == ["ticket-001", "ticket-002"]


def test_dry_run_counts_records_already_in_the_checkpoint(tmp_path):
    out = tmp_path / "o.parquet"
    assert score(str(SAMPLE_DATA / "records.jsonl"), "-o", str(out), "--limit", "5").exit_code == 0
    result = score(str(SAMPLE_DATA / "records.jsonl"), "-o", str(out), "--dry-run")
    assert "already in the checkpoint: 5 (not planned again)" in result.stdout
    assert "records: 12 (12 valid, 0 invalid)" in result.stdout
