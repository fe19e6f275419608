"""`clef score` end to end on the sample data, with media, bad records and every output option."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.encoding.prompt import PromptEncoder
from clef_cli.inputs.readers import read_records
from clef_cli.inputs.records import Record

from .support.helpers import (
    LOGIT_TOLERANCE,
    PROBABILITY_TOLERANCE,
    SAMPLE_DATA,
    TINY_MODEL,
    assert_same_rows,
    write_jsonl,
)

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
    for record, row in zip(inputs, rows, strict=True):
        if not isinstance(record, Record) or row["error"]:
            continue
        expected = scorer.score_batch([encoder.encode(record)])[0]
        assert row["prompt_tokens"] == expected.prompt_tokens
        for answer, question in zip(row["answers"], expected.questions, strict=True):
            assert answer["question_id"] == question.question_id
            assert [label["label"] for label in answer["labels"]] == list(question.option_ids)
            for label, probability, logit in zip(
                answer["labels"], question.probabilities, question.logits, strict=True
            ):
                assert abs(label["probability"] - probability) <= PROBABILITY_TOLERANCE
                assert abs(label["logit"] - logit) <= LOGIT_TOLERANCE
            assert answer["answer"] == question.answer
        checked += 1
    assert checked == 17


def test_output_schema_and_types(scored_sample):
    _, out = scored_sample
    schema = pq.read_schema(out)
    assert schema.names == [
        "id",
        "record_index",
        "prompt_tokens",
        "state_tokens_cut",
        "error",
        "error_kind",
        "answers",
        "record_key",
    ]
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


def test_long_layout_end_to_end_holds_the_wide_values_row_by_row(scored_sample, sample_with_bad_records, tmp_path):
    """`--layout long`: one row per (record, question, label) in input, question and head order, and
    one row per failed record with its error; the values are the wide output's."""
    _, wide_out = scored_sample
    out = tmp_path / "long.parquet"
    result = score(str(sample_with_bad_records), "-o", str(out), "--max-batch-tokens", "3000", "--layout", "long")
    assert result.exit_code == 3, result.output
    assert "2 failed of 19 records" in result.stderr
    table = pq.read_table(out)
    assert table.schema.names == [
        "id", "record_index", "question_id", "type", "label", "probability", "logit",
        "error", "error_kind", "record_key",
    ]  # fmt: skip
    assert table.schema.metadata[b"clef.layout"] == b"long"
    want = []
    for row in pq.read_table(wide_out).to_pylist():
        if row["error"]:
            want.append((row["id"], row["record_index"], None, None, None, None, None, row["error"],
                         row["error_kind"], row["record_key"]))  # fmt: skip
            continue
        for answer in row["answers"]:
            for label in answer["labels"]:
                want.append((row["id"], row["record_index"], answer["question_id"], answer["type"], label["label"],
                             label["probability"], label["logit"], None, None, row["record_key"]))  # fmt: skip
    got = [tuple(row.values()) for row in table.to_pylist()]
    assert len(got) == len(want) > 19 * 2
    for a, b in zip(got, want, strict=True):
        assert a[:5] == b[:5] and a[7:] == b[7:]
        if b[5] is not None:
            assert abs(a[5] - b[5]) <= PROBABILITY_TOLERANCE and abs(a[6] - b[6]) <= LOGIT_TOLERANCE, a


def test_provenance_metadata(scored_sample):
    _, out = scored_sample
    metadata = {k.decode(): v.decode() for k, v in pq.read_schema(out).metadata.items()}
    weights = TINY_MODEL / "model.safetensors"
    weights_digest = hashlib.sha256(
        f"model.safetensors:{weights.stat().st_size}\n".encode() + sha256_of(weights).encode()
    ).hexdigest()  # the fingerprint's definition: no shard index, one small shard hashed in full
    created = metadata.pop("clef.created")
    # how the keys were made (for `clef review --records`), checked against the release's own files
    key_prompt = json.loads(metadata.pop("clef.key_prompt"))
    added = json.loads((TINY_MODEL / "tokenizer.json").read_text())["added_tokens"]
    assert key_prompt["literal_marks"] == sorted(token["content"] for token in added)
    assert len(key_prompt["digest"]) == 64
    assert json.loads(metadata.pop("clef.media_limits")) == {
        "max_image_pixels": 40_000_000, "max_audio_seconds": 1800.0, "max_video_seconds": 300.0,
        "max_file_bytes": 256 * 1024 * 1024, "allow_remote": False,
        "allowed_media_domains": [], "allow_private_media_hosts": False,
    }  # fmt: skip
    assert metadata == {
        "clef.version": version("clef-cli"),
        "clef.model": str(TINY_MODEL),
        "clef.model_revision": "",
        "clef.model_family": "omni",
        "clef.model_config_sha256": sha256_of(TINY_MODEL / "config.json"),
        "clef.weights_fingerprint": weights_digest,
        "clef.head_sha256": sha256_of(TINY_MODEL / "joint_head.safetensors"),
        "clef.max_length": "64000",
        "clef.overflow": "truncate",
        "clef.struct_nulls": "refuse",
        "clef.special_tokens": "text",
        "clef.dtype": "float32",
        "clef.layout": "wide",
        "clef.engine": "hf",
        "clef.hidden_states": "keep",
        "clef.key_version": "1",
        # 19 records: bad-schema is invalid (never keyed), bad-image is run and fails in encoding,
        # the other 17 are forwarded; a fresh checkpoint reuses nothing.
        "clef.records_run": "18",
        "clef.records_forwarded": "17",
        "clef.records_reused": "0",
        "clef.records_duplicates": "0",
        "clef.records_retried": "0",
        "clef.records_invalid": "1",
    }
    made = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert abs(made.timestamp() - out.stat().st_mtime) < 120


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_limit_scores_only_the_first_records(tmp_path):
    out = tmp_path / "limited.parquet"
    result = score(str(SAMPLE_DATA / "records.jsonl"), "-o", str(out), "--limit", "3")
    assert result.exit_code == 0, result.output
    rows = pq.read_table(out).to_pylist()
    assert [row["id"] for row in rows] == ["ticket-001", "ticket-002", "ticket-003"]


def test_dry_run_plans_without_weights(tmp_path, processor):
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
    fields, plan = result.stdout.split("records: ", 1)  # how each field is read, then the plan
    assert fields.splitlines()[:3] == ["records.jsonl:", "  id <- id: text", "  state <- state: text"]
    assert "images <- images: array: locations (paths, URIs, data: URLs)" in fields  # a later record's key
    records = list(read_records([SAMPLE_DATA / "records.jsonl"]))
    assert "records: " + plan == expected_dry_run(records, processor, 4096, 64)
    assert not out.exists() and not Path(str(out) + ".ckpt").exists()


def expected_dry_run(records: list, processor, max_batch_tokens: int, max_batch_size: int) -> str:
    """The plan printed by --dry-run, from each record's own encoding: nearest-rank percentiles,
    batches of the length-sorted planner, padded tokens / real tokens - 1, 132 bytes a token
    (64 bf16 values and a 4-byte id)."""
    from clef_cli.encoding.batching import PlanEntry, plan_batches

    encoder = PromptEncoder(processor, max_length=64000)
    encoded = [encoder.encode(record) for record in records]
    lengths = sorted(item.length for item in encoded)
    at = lambda fraction: lengths[math.ceil(fraction * len(lengths)) - 1]  # noqa: E731
    entries = [PlanEntry(item.record.index, item.length, item.use_audio_in_video) for item in encoded]
    batches = plan_batches(entries, max_batch_tokens, max_batch_size)
    with_sound = sum(batch.entries[0].audio_in_video for batch in batches)
    waste = sum(batch.padded_tokens for batch in batches) / sum(lengths) - 1
    hidden = sum(lengths) * 132
    sample = int(hidden * 0.02)  # --keep-sample's default: the low end of selective's range
    return (
        f"records: {len(records)} ({len(records)} valid, 0 invalid)\n"
        f"prompt tokens: min {lengths[0]}, p50 {at(0.5)}, p90 {at(0.9)}, p99 {at(0.99)}, max {lengths[-1]}\n"
        f"total prompt tokens: {sum(lengths):,}\n"
        f"batches: {len(batches)} ({with_sound} with audio-in-video) under {max_batch_tokens:,} padded tokens "
        f"and at most {max_batch_size} records each\n"
        f"padding waste: {waste:.2%}\n"
        f"hidden states on disk with --hidden-states keep (this run): about {size_text(hidden)}\n"
        f"hidden states on disk with --hidden-states selective: about {size_text(sample)} to {size_text(hidden)}: "
        "the sample to every record (no stored results to measure the share under --keep-below)\n"
        "hidden states on disk with --hidden-states drop: about 0 B\n"
    )


def size_text(count: int) -> str:
    if count >= 2**20:
        return f"{count / 2**20:.1f} MiB"
    return f"{count / 2**10:.1f} KiB" if count >= 2**10 else f"{count} B"


def test_dry_run_reports_failing_records_by_the_kind_a_run_gives_them(sample_with_bad_records, tmp_path):
    result = score(str(sample_with_bad_records), "-o", str(tmp_path / "x.parquet"), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "records: 19 (17 valid, 1 invalid, 1 media)" in result.stdout  # an undecodable image is media
    assert "media: record 'bad-image', field 'images[0]'" in result.stdout
    assert "invalid: record 'bad-schema', field 'questions.q.criteria'" in result.stdout


def test_dry_run_counts_a_missing_image_as_media_as_a_run_does(tmp_path):
    records = [
        {"id": "ok", "state": "fine", "questions": {"q": {"type": "noul"}}},
        {"id": "no-image", "state": "photo", "images": ["missing.png"], "questions": {"q": {"type": "noul"}}},
        {"id": "no-state", "questions": {"q": {"type": "noul"}}},
    ]
    inputs = write_jsonl(tmp_path / "in.jsonl", records)
    planned = score(str(inputs), "-o", str(tmp_path / "plan.parquet"), "--dry-run")
    assert planned.exit_code == 0, planned.output
    done = score(str(inputs), "-o", str(tmp_path / "run.parquet"), "--hidden-states", "drop")
    assert done.exit_code == 3, done.output
    kinds = {row["id"]: row["error_kind"] for row in pq.read_table(tmp_path / "run.parquet").to_pylist()}
    assert kinds == {"ok": None, "no-image": "media", "no-state": "invalid"}  # the real run: the oracle
    assert "records: 3 (1 valid, 1 invalid, 1 media)" in planned.stdout
    assert "media: record 'no-image', field 'images[0]'" in planned.stdout


def test_a_failed_run_says_why_and_its_counts_add_up(scored_sample):
    """Counts by error kind, the first errors (id and message), the `error` column named; the
    bracket's counts (all but retried) add up to the records: the media failure is one of them."""
    result, out = scored_sample
    lines = result.stderr.splitlines()
    summary = next(line for line in lines if " failed of " in line)
    records = int(summary.split(" failed of ")[1].split()[0])
    bracket = summary.split(" records (", 1)[1].split(");", 1)[0].split(", ")
    counted = {" ".join(item.split()[1:]): int(item.split()[0]) for item in bracket}
    assert counted["failed while running"] == 1 and counted["invalid"] == 1  # bad-image, bad-schema
    assert sum(count for what, count in counted.items() if what != "retried") == records == 19
    why = [line for line in lines[lines.index(summary) + 1 :] if not line.startswith("the model waited")]
    assert why[0].startswith("failed by kind: 1 invalid, 1 media; every failed row's `error` column says why")
    assert str(out) in why[0]
    assert why[1].startswith("  record 'bad-image', field 'images[0]': not a decodable image")
    assert why[2].startswith("  record 'bad-schema', field 'questions.q.criteria'")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layout", "tall"], "'tall' is not one of wide, long or flat"),
        (["--on-overflow", "ignore"], "'ignore' is not one of truncate or error"),
        (["--hidden-states", "maybe"], "'maybe' is not one of keep, selective or drop"),
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


def test_missing_model_is_a_usage_error_exit_2(tmp_path):
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
    assert result.exit_code == 2  # a bad file: nothing was done
    assert result.stderr.strip() == f"error: model folder not found: {tmp_path / 'nowhere'}"


@pytest.mark.slow  # the quick loop's budget (issue 36.12): CI's whole run has it
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
    assert_same_rows(pq.read_table(out).to_pylist(), pq.read_table(scored_sample[1]).to_pylist(), 1e-5)


def test_questions_file_for_records_without_a_schema(tmp_path):
    out = tmp_path / "posts.parquet"
    result = score(str(SAMPLE_DATA / "posts.jsonl"), "-o", str(out), "--questions", str(SAMPLE_DATA / "questions.json"))
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
    assert "0 run through the model, 2 from the checkpoint" in result.stderr  # this run's 2 records
    assert [row["id"] for row in pq.read_table(out).to_pylist()] == ["ticket-001", "ticket-002"]


def test_dry_run_counts_records_already_in_the_checkpoint(tmp_path):
    out = tmp_path / "o.parquet"
    assert score(str(SAMPLE_DATA / "records.jsonl"), "-o", str(out), "--limit", "5").exit_code == 0
    result = score(str(SAMPLE_DATA / "records.jsonl"), "-o", str(out), "--dry-run")
    assert "already in the checkpoint: 5 (not planned again)" in result.stdout
    assert "records: 17 (17 valid, 0 invalid)" in result.stdout  # every record, those stored too
    planned = result.stdout.split("total prompt tokens: ")[1].split()[0].replace(",", "")
    fresh = score(str(SAMPLE_DATA / "records.jsonl"), "-o", str(tmp_path / "fresh.parquet"), "--dry-run")
    skipped = sum(row["prompt_tokens"] for row in pq.read_table(out).to_pylist())
    assert int(planned) == int(fresh.stdout.split("total prompt tokens: ")[1].split()[0].replace(",", "")) - skipped
