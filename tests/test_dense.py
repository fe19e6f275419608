"""The dense Clef family (Clef, Clef-Flash: Qwen3.5): parity with the dense reference's outputs,
batch invariance, refusals, and the same commands end to end."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.errors import ModelLoadError
from clef_cli.inputs.readers import read_records
from clef_cli.inputs.records import InvalidRecord

from .support.helpers import FIXTURES, MEDIA, write_jsonl

TINY_DENSE = FIXTURES / "tiny-clef-dense"
GOLDEN_DENSE = FIXTURES / "golden_dense"
DENSE_RECORDS = GOLDEN_DENSE / "records_D.jsonl"
DENSE_MAX_LENGTH = json.loads((GOLDEN_DENSE / "meta.json").read_text())["max_length"]
LOGIT_TOLERANCE = 1e-5
PROBABILITY_TOLERANCE = 1e-6
runner = CliRunner()


@pytest.fixture(scope="module")
def dense_release():
    from clef_cli.release import resolve_release

    return resolve_release(str(TINY_DENSE))


@pytest.fixture(scope="module")
def dense_encoder(dense_release):
    from clef_cli.encoding.prompt import PromptEncoder
    from clef_cli.families import family_of
    from clef_cli.release import load_processor

    return PromptEncoder(load_processor(dense_release), DENSE_MAX_LENGTH, family=family_of(dense_release))


@pytest.fixture(scope="module")
def dense_scorer(dense_release):
    from clef_cli.model.scoring import load_scorer

    return load_scorer(dense_release, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def golden():
    expected = [json.loads(line) for line in (GOLDEN_DENSE / "expected_D.jsonl").read_text().splitlines() if line]
    records = list(read_records([DENSE_RECORDS]))
    assert [record.id for record in records] == [reference["id"] for reference in expected]
    return records, expected


@pytest.fixture(scope="module")
def valid(golden, dense_encoder):
    records, expected = golden
    pairs = [(dense_encoder.encode(r), e) for r, e in zip(records, expected, strict=True) if "error" not in e]
    assert len(pairs) == 10
    return pairs


def assert_logits_match(result, reference) -> None:
    assert result.record_id == reference["id"]
    assert len(result.questions) == len(reference["questions"])
    for got, want in zip(result.questions, reference["questions"], strict=True):
        assert list(got.option_ids) == want["option_ids"]
        assert np.abs(np.subtract(got.logits, want["logits"])).max() <= LOGIT_TOLERANCE, result.record_id
        assert np.abs(np.subtract(got.probabilities, want["probabilities"])).max() <= PROBABILITY_TOLERANCE


def test_release_is_detected_as_the_dense_family(dense_release):
    from clef_cli.families import family_of

    family = family_of(dense_release)
    assert (dense_release.family, family.default_max_length, family.lexical_key) == ("dense", 16384, "lm_head.weight")
    assert dense_release.hidden_size == 64


def test_every_golden_record_encodes_to_the_reference_ids_spans_and_media(valid):
    for encoded, reference in valid:
        assert encoded.input_ids == reference["input_ids"], reference["id"]
        for question, want in zip(encoded.questions, reference["questions"], strict=True):
            assert (question.question_id, question.question_type) == (want["question_id"], want["question_type"])
            assert list(question.question_span) == want["question_span"]
            assert [list(span) for span in question.option_spans] == want["option_spans"]
        media = reference.get("media")
        if media is None:
            assert encoded.media == {}
            continue
        pixels = encoded.media["pixel_values"].double()
        assert list(pixels.shape) == media["pixel_values"]["shape"]
        assert abs(pixels.sum().item() - media["pixel_values"]["sum"]) <= 1e-5 * pixels.abs().sum().item()
        assert encoded.media["image_grid_thw"].sum().item() == media["image_grid_thw"]["sum"]
        assert int(encoded.media["mm_token_type_ids"].sum()) == media["mm_token_type_ids"]
        assert encoded.media_span[0] == media["token_offset"]


def test_invalid_golden_records_are_refused(golden, dense_encoder):
    records, _ = golden
    by_id = {record.id: record for record in records}
    assert isinstance(by_id["d91-bad-type"], InvalidRecord)
    with pytest.raises(Exception, match="schema requires 4252 tokens before state; maximum is 2048"):
        dense_encoder.encode(by_id["d92-schema-too-long"])


def test_each_record_alone_matches_the_reference(valid, dense_scorer):
    for encoded, reference in valid:
        assert_logits_match(dense_scorer.score_batch([encoded])[0], reference)


@pytest.mark.slow  # 27 s on 2 cores; the random batches below check batching in the quick loop
def test_padded_batches_with_and_without_images_match_the_reference(valid, dense_scorer):
    encoded = [pair[0] for pair in valid]
    by_id = {pair[1]["id"]: pair[1] for pair in valid}
    everything = dense_scorer.score_batch(encoded)
    text_only = dense_scorer.score_batch([e for e in encoded if not e.media])
    mixed = dense_scorer.score(encoded, max_batch_tokens=1500, max_batch_size=3)
    for results in (everything, text_only, mixed):
        for result in results:
            assert_logits_match(result, by_id[result.record_id])
    assert len(mixed) == len(everything) == 10


@pytest.fixture(scope="module")
def image_variants(tmp_path_factory, golden, dense_encoder):
    folder = tmp_path_factory.mktemp("dense-variants")
    records = []
    for number, size in enumerate([(32, 32), (120, 40), (50, 90), (200, 150)]):
        pixels = np.random.default_rng(number).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"v{number}.png")
        records.append(
            {
                "id": f"img{number}",
                "state": "look " * (1 + 7 * number),
                "images": [f"v{number}.png"] * (1 + number % 2),
                "questions": {"q": {"type": "choice", "criteria": {"a": None, "b": "bee", "c": None}}},
            }
        )
    path = write_jsonl(folder / "variants.jsonl", records)
    return [dense_encoder.encode(record) for record in read_records([path])]


@pytest.mark.parametrize(
    "seed", [seed if seed < 4 else pytest.param(seed, marks=pytest.mark.slow) for seed in range(12)]
)
def test_logits_in_a_random_batch_equal_logits_alone(valid, image_variants, dense_scorer, seed):
    pool = [pair[0] for pair in valid] + image_variants
    chooser = random.Random(seed)
    picked = chooser.sample(pool, chooser.randint(2, 6))
    for result in dense_scorer.score_batch(picked):
        encoded = next(e for e in picked if e.record.id == result.record_id)
        alone = dense_scorer.score_batch([encoded])[0]
        difference = max(
            abs(a - b)
            for q, r in zip(result.questions, alone.questions, strict=True)
            for a, b in zip(q.logits, r.logits, strict=True)
        )
        assert difference <= LOGIT_TOLERANCE, (result.record_id, difference)


@pytest.mark.parametrize(
    ("media", "field", "message"),
    [
        ({"audio": [str(MEDIA / "tone_16k_mono.wav")]}, "audio", "this model does not read audio; use Clef-Omni"),
        ({"videos": [str(MEDIA / "clip_silent.mp4")]}, "videos", "videos are not scored with the dense Clef family"),
    ],
)
def test_media_the_dense_family_does_not_read_are_refused(tmp_path, dense_encoder, media, field, message):
    from clef_cli.errors import RecordError

    path = write_jsonl(tmp_path / "r.jsonl", [{"id": "m", "state": "s", "questions": {"q": {"type": "noul"}}, **media}])
    (record,) = read_records([path])
    with pytest.raises(RecordError) as caught:
        dense_encoder.encode(record)
    assert caught.value.field == field and caught.value.message.startswith(message)


def _release_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "dense"
    shutil.copytree(TINY_DENSE, folder)
    for path in folder.iterdir():
        path.chmod(0o644)
    return folder


def test_a_dense_release_with_a_missing_key_is_one_error(tmp_path):
    from clef_cli.model.scoring import load_scorer

    folder = _release_copy(tmp_path)
    weights = load_file(folder / "model.safetensors")
    del weights["model.language_model.layers.3.self_attn.q_norm.weight"]
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"missing keys: model\.language_model\.layers\.3\.self_attn\.q_norm"):
        load_scorer(str(folder), device="cpu", dtype="float32")


def test_a_head_for_another_hidden_size_is_refused(tmp_path):
    from clef_cli.model.head import HeadConfig, JointSchemaHead
    from clef_cli.model.scoring import load_scorer

    folder = _release_copy(tmp_path)
    config = {**json.loads((folder / "joint_head_config.json").read_text()), "hidden_size": 128}
    (folder / "joint_head_config.json").write_text(json.dumps(config))
    head = JointSchemaHead(HeadConfig(**config))
    state = {name: tensor.contiguous() for name, tensor in head.state_dict().items()}
    save_file(state, folder / "joint_head.safetensors")
    with pytest.raises(ModelLoadError, match="expects hidden size 128, the backbone has 64"):
        load_scorer(str(folder), device="cpu", dtype="float32")


@pytest.mark.slow  # the quick loop's budget (issue 36.12): CI's whole run has it
def test_score_inspect_and_rehead_end_to_end(tmp_path, valid):
    out = tmp_path / "dense.parquet"
    inputs = str(DENSE_RECORDS)
    base = ["--model", str(TINY_DENSE), "--workers", "0", "--quiet"]
    scored = runner.invoke(app, ["score", inputs, "-o", str(out), "--max-length", "2048", *base])
    assert scored.exit_code == 3, scored.output  # the two invalid golden records
    table = pq.read_table(out).to_pylist()
    assert [row["id"] for row in table] == [json.loads(line)["id"] for line in DENSE_RECORDS.read_text().splitlines()]
    by_id = {pair[1]["id"]: pair[1] for pair in valid}
    for row in table:
        if row["id"] in by_id:
            logits = [[label["logit"] for label in answer["labels"]] for answer in row["answers"]]
            want = [question["logits"] for question in by_id[row["id"]]["questions"]]
            assert np.abs(np.concatenate(logits) - np.concatenate(want)).max() <= LOGIT_TOLERANCE
        else:
            assert row["error"] and row["answers"] is None
    metadata = {k.decode(): v.decode() for k, v in pq.read_schema(out).metadata.items()}
    assert (metadata["clef.model_family"], metadata["clef.max_length"]) == ("dense", "2048")

    reheaded = tmp_path / "rehead.parquet"
    again = runner.invoke(
        app,
        [
            "score",
            inputs,
            "-o",
            str(reheaded),
            "--max-length",
            "2048",
            "--hidden-dtype",
            "float32",
            "--checkpoint",
            str(tmp_path / "keep.ckpt"),
            *base,
        ],
    )
    assert again.exit_code == 3, again.output
    rehead = runner.invoke(
        app,
        [
            "score",
            inputs,
            "-o",
            str(tmp_path / "r2.parquet"),
            "--max-length",
            "2048",
            "--hidden-dtype",
            "float32",
            "--checkpoint",
            str(tmp_path / "keep.ckpt"),
            "--rehead",
            str(TINY_DENSE),
            *base,
        ],
    )
    assert rehead.exit_code == 3, rehead.output
    first = pq.read_table(reheaded).column("answers").to_pylist()
    second = pq.read_table(tmp_path / "r2.parquet").column("answers").to_pylist()
    for a, b in zip(first, second, strict=True):
        assert (a is None) == (b is None)
        for qa, qb in zip(a or [], b or [], strict=True):
            for la, lb in zip(qa["labels"], qb["labels"], strict=True):
                assert abs(la["logit"] - lb["logit"]) <= 1e-5

    gold = write_jsonl(
        tmp_path / "gold.jsonl",
        [
            {"id": "d01-text", "labels": {"team": "tech", "urgent": True}},
            {"id": "d07-unicode", "labels": {"lang": "de"}},
        ],
    )
    evaluated = runner.invoke(app, ["eval", str(out), "--gold", str(gold), "--json", str(tmp_path / "m.json")])
    assert evaluated.exit_code == 0, evaluated.output
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["records"] == 2
    for question_id, record_id, gold_option in [("team", "d01-text", "tech"), ("lang", "d07-unicode", "de")]:
        want = next(q for q in by_id[record_id]["questions"] if q["question_id"] == question_id)
        predicted = want["option_ids"][int(np.argmax(want["probabilities"]))]
        assert metrics["questions"][question_id]["n"] == 1
        assert metrics["questions"][question_id]["accuracy"] == float(predicted == gold_option)

    spans = runner.invoke(app, ["inspect-spans", inputs, "--model", str(TINY_DENSE), "--id", "d03-one-image", "--json"])
    assert spans.exit_code == 0, spans.output
    report = json.loads(spans.stdout)
    assert report["input_ids"] == by_id["d03-one-image"]["input_ids"]
    assert report["max_length"] == 16384  # the dense family's default
