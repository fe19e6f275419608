"""Paths the float32 golden tests do not reach: half-precision scoring on the CPU, re-scoring from
the default bf16 hidden states, and one record with a standalone clip and a video with sound."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.inputs.readers import read_records
from clef_cli.model.scoring import load_scorer

from .support.helpers import MEDIA, SAMPLE_DATA, TINY_MODEL, write_jsonl
from .test_checkpoint import records as checkpoint_records
from .test_checkpoint import second_head_release

runner = CliRunner()

# Measured on the golden records (torch 2.14.1, CPU): bf16 differs from the float32 reference by
# up to 5.8e-3 in probabilities and 7.0e-2 in logits; fp16 by 4.5e-4 and 4.0e-3 on one CPU but by
# 4.8e-3 in probabilities on an AMD EPYC without AVX-512 (its fp16 kernels round differently). fp16
# keeps three more mantissa bits than bf16, so bf16's bounds (about 2.5x its measured error) bound
# both; they are loose because half precision is, not to hide anything.
HALF_PRECISION_BOUNDS = {"bfloat16": (1.5e-2, 0.2), "float16": (1.5e-2, 0.2)}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_on_the_cpu_stays_near_the_golden_values(release, golden_encoded, expected, dtype):
    probability_bound, logit_bound = HALF_PRECISION_BOUNDS[dtype]
    scorer = load_scorer(release, device="cpu", dtype=dtype)
    results = scorer.score(golden_encoded, max_batch_tokens=5000, max_batch_size=8)
    assert [result.record_id for result in results] == [reference["id"] for reference in expected]
    worst_probability = worst_logit = 0.0
    for result, reference in zip(results, expected, strict=True):
        for got, golden in zip(result.questions, reference["questions"], strict=True):
            assert list(got.option_ids) == golden["option_ids"]
            assert abs(sum(got.probabilities) - 1) < 1e-5  # probabilities are computed in float32
            worst_logit = max(worst_logit, *(abs(a - b) for a, b in zip(got.logits, golden["logits"], strict=True)))
            worst_probability = max(
                worst_probability,
                *(abs(a - b) for a, b in zip(got.probabilities, golden["probabilities"], strict=True)),
            )
    assert worst_probability <= probability_bound and worst_logit <= logit_bound
    assert worst_logit > 1e-5  # the run was in half precision, not silently in float32


NUMERICS = Path(__file__).resolve().parent.parent / "docs" / "numerics.md"


def documented_rehead_tolerance() -> float:
    """The tolerance docs/numerics.md gives a rehead from a bf16 store: the tests hold the page
    to what they measure (bf16 keeps 8 bits of mantissa: a relative error of 2^-9 per value)."""
    found = re.search(r"\*\*Rehead tolerance: ([0-9.e-]+)\.\*\*", NUMERICS.read_text(encoding="utf-8"))
    assert found, "docs/numerics.md no longer states the rehead tolerance"
    return float(found.group(1))


def largest_difference(got: list[dict], want: list[dict]) -> float:
    """The largest |probability difference| over every label of two outputs of the same records."""
    worst = 0.0
    for a, b in zip(got, want, strict=True):
        assert a["id"] == b["id"] and a["prompt_tokens"] == b["prompt_tokens"]
        for x, y in zip(a["answers"], b["answers"], strict=True):
            assert [label["label"] for label in x["labels"]] == [label["label"] for label in y["labels"]]
            pairs = zip(x["labels"], y["labels"], strict=True)
            worst = max(worst, *(abs(p["probability"] - q["probability"]) for p, q in pairs))
    return worst


def test_a_same_head_rehead_of_the_sample_posts_stays_within_the_documented_tolerance(tmp_path):
    """The page's own measurement (docs/numerics.md): the posts, the release's head, a bf16 store;
    the tolerance leaves room over the drift measured there (1.25e-3)."""
    base = [str(SAMPLE_DATA / "posts.jsonl"), "--questions", str(SAMPLE_DATA / "questions.json")]
    base += ["--model", str(TINY_MODEL)]
    direct, reheaded = tmp_path / "a.parquet", tmp_path / "b.parquet"
    first = runner.invoke(app, ["score", *base, "-o", str(direct), "--workers", "0", "--quiet"])
    assert first.exit_code == 0, first.output
    again = ["--checkpoint", f"{direct}.ckpt", "--rehead", str(TINY_MODEL), "--quiet"]
    second = runner.invoke(app, ["score", *base, "-o", str(reheaded), *again])
    assert second.exit_code == 0, second.output
    worst = largest_difference(pq.read_table(reheaded).to_pylist(), pq.read_table(direct).to_pylist())
    assert 0 < worst <= documented_rehead_tolerance()  # not zero: the states really went through bf16


def test_rehead_from_the_default_bf16_hidden_states(tmp_path):
    inputs = write_jsonl(tmp_path / "in.jsonl", checkpoint_records(9))
    base = ["--workers", "0", "--quiet", "--max-batch-size", "3"]
    out = tmp_path / "out.parquet"
    first = runner.invoke(app, ["score", str(inputs), "-o", str(out), "--model", str(TINY_MODEL), *base])
    assert first.exit_code == 0, first.output
    shard = next((tmp_path / "out.parquet.ckpt" / "shards").glob("*.hidden.safetensors"))
    with safe_open(str(shard), framework="pt") as handle:
        stored = [handle.get_tensor(key) for key in handle.keys() if key.startswith("hidden.")]  # noqa: SIM118
    assert stored and all(tensor.dtype == torch.bfloat16 for tensor in stored)  # the default --hidden-dtype
    release_b = second_head_release(tmp_path)
    full = tmp_path / "full.parquet"
    assert runner.invoke(app, ["score", str(inputs), "-o", str(full), "--model", str(release_b), *base]).exit_code == 0
    reheaded = tmp_path / "rehead.parquet"
    result = runner.invoke(
        app,
        [
            *("score", str(inputs), "-o", str(reheaded), "--model", str(TINY_MODEL), *base),
            *("--checkpoint", str(tmp_path / "out.parquet.ckpt"), "--rehead", str(tmp_path / "head-b")),
        ],
    )
    assert result.exit_code == 0, result.output
    got, want = pq.read_table(reheaded).to_pylist(), pq.read_table(full).to_pylist()
    assert len(got) == len(want) == 9
    worst = largest_difference(got, want)
    assert 0 < worst <= documented_rehead_tolerance()  # not zero: the states really went through bf16


def test_a_standalone_clip_and_a_video_with_sound_in_one_record(tmp_path, encoder, processor, scorer):
    """The clip comes first, then the video's soundtrack (`audio_from_video_indices` [None, 0]):
    each part equals that medium encoded in a record of its own."""
    media = str(MEDIA)
    rows = [
        {
            "id": "both",
            "state": "s",
            "questions": {"q": {"type": "noul"}},
            "audio": [f"{media}/tone_16k_mono.wav"],
            "videos": [f"{media}/clip_av.mp4"],
        },
        {"id": "clip", "state": "s", "questions": {"q": {"type": "noul"}}, "audio": [f"{media}/tone_16k_mono.wav"]},
        {"id": "video", "state": "s", "questions": {"q": {"type": "noul"}}, "videos": [f"{media}/clip_av.mp4"]},
    ]
    both, clip, video = (encoder.encode(record) for record in read_records([write_jsonl(tmp_path / "r.jsonl", rows)]))
    assert both.use_audio_in_video and video.use_audio_in_video and not clip.use_audio_in_video
    clip_length = clip.media["feature_attention_mask"].sum().item()
    track_length = video.media["feature_attention_mask"].sum().item()
    assert both.media["feature_attention_mask"].sum(-1).tolist() == [clip_length, track_length]
    # one processor call for both clips, as the reference makes: each clip's features are its own,
    # except the last mel frame of the shorter one, which the shared padding changes (DESIGN §6)
    for row, alone, length in ((0, clip, clip_length), (1, video, track_length)):
        got, want = both.media["input_features"][row], alone.media["input_features"][0]
        assert torch.equal(got[:, : length - 1], want[:, : length - 1]), row
    assert torch.equal(both.media["pixel_values_videos"], video.media["pixel_values_videos"])
    audio_pad = processor.tokenizer.convert_tokens_to_ids("<|audio_pad|>")
    count = lambda encoded: encoded.input_ids.count(audio_pad)  # noqa: E731
    assert count(both) == count(clip) + count(video)
    (result,) = scorer.score_batch([both])
    assert abs(sum(result.questions[0].probabilities) - 1) < 1e-6
