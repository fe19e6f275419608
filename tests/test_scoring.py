"""Scoring parity with the reference: alone, in padded batches, and whatever the neighbours."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from clef_cli.encoding.batching import collate
from clef_cli.errors import ModelLoadError
from clef_cli.model.answers import systemone_answer
from clef_cli.model.scoring import load_scorer
from clef_cli.release import resolve_release

from .support.helpers import LOGIT_TOLERANCE, PROBABILITY_TOLERANCE, TINY_MODEL


def assert_matches_golden(results, records, expected):
    assert len(results) == len(records) == len(expected)
    for result, record, reference in zip(results, records, expected, strict=True):
        assert result.record_id == reference["id"]
        for got, question, golden in zip(result.questions, record.questions, reference["questions"], strict=True):
            assert list(got.option_ids) == golden["option_ids"]
            logit_error = max(abs(a - b) for a, b in zip(got.logits, golden["logits"], strict=True))
            assert logit_error <= LOGIT_TOLERANCE, result.record_id
            probability_error = max(abs(a - b) for a, b in zip(got.probabilities, golden["probabilities"], strict=True))
            assert probability_error <= PROBABILITY_TOLERANCE, result.record_id
            assert_answer_matches(systemone_answer(question, got), golden["answer"])


def assert_answer_matches(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, float):
            assert abs(got[key] - value) <= 1e-4, key
        elif isinstance(value, dict):
            assert list(got[key]) == list(value), key  # the record's criteria order
            for option, probability in value.items():
                assert (
                    got[key][option] == probability
                    if isinstance(probability, str)
                    else abs(got[key][option] - probability) <= 1e-4
                )
        else:
            assert got[key] == value, key


def test_each_record_scored_alone_matches_the_reference(scorer, golden_encoded, golden_records, expected):
    results = [scorer.score_batch([encoded])[0] for encoded in golden_encoded]
    assert_matches_golden(results, golden_records, expected)


def test_padded_batches_of_mixed_lengths_and_modalities_match(scorer, golden_encoded, golden_records, expected):
    results = scorer.score(golden_encoded, max_batch_tokens=5000, max_batch_size=8)
    assert [r.record_id for r in results] == [e["id"] for e in expected]
    assert_matches_golden(results, golden_records, expected)


def test_one_batch_of_all_records_without_audio_in_video(scorer, golden_encoded, golden_records, expected):
    chosen = [i for i, e in enumerate(golden_encoded) if not e.use_audio_in_video]
    assert len({golden_encoded[i].length for i in chosen}) > 5
    results = scorer.score_batch([golden_encoded[i] for i in chosen])
    assert_matches_golden(results, [golden_records[i] for i in chosen], [expected[i] for i in chosen])


def test_same_record_in_three_different_batches(scorer, golden_encoded):
    by_id = {e.record.id: e for e in golden_encoded}
    target = by_id["a06-two-images"]
    batches = [
        [target],
        [by_id["a11-truncated-state"], target, by_id["a01-text-noul"]],
        [by_id["a07-one-audio"], by_id["a15-large-frames-and-image"], by_id["a13-scalar-state"], target],
    ]
    runs = []
    for batch in batches:
        result = next(r for r in scorer.score_batch(batch) if r.record_id == target.record.id)
        runs.append(torch.tensor([p for q in result.questions for p in q.probabilities]))
    assert torch.allclose(runs[0], runs[1], atol=1e-5, rtol=0)
    assert torch.allclose(runs[0], runs[2], atol=1e-5, rtol=0)


def test_audio_in_video_records_never_share_a_forward_with_others(golden_encoded):
    with_sound = next(e for e in golden_encoded if e.use_audio_in_video)
    without = next(e for e in golden_encoded if not e.use_audio_in_video)
    with pytest.raises(ValueError, match="cannot share one forward"):
        collate([with_sound, without], pad_token_id=0)


def test_collate_concatenates_media_in_row_order(golden_encoded):
    by_id = {e.record.id: e for e in golden_encoded}
    rows = [by_id["a05-one-image"], by_id["a08-audio-and-image"], by_id["a07-one-audio"]]
    batch = collate(rows, pad_token_id=0)
    assert batch.media["image_grid_thw"].tolist() == [[1, 14, 20], [1, 22, 12]]
    assert batch.media["feature_attention_mask"].sum(-1).tolist() == [130, 200]
    assert batch.attention_mask.sum(-1).tolist() == [r.length for r in rows]
    assert (batch.input_ids[0, rows[0].length :] == 0).all()


def test_results_carry_prompt_tokens_and_state_cut(scorer, golden_encoded):
    by_id = {e.record.id: e for e in golden_encoded}
    result = scorer.score_batch([by_id["a11-truncated-state"]])[0]
    assert result.prompt_tokens == 1024
    assert result.state_tokens_cut == by_id["a11-truncated-state"].state_tokens_cut > 0
    score = result.questions[1]
    assert score.type == "score" and score.noul is None
    assert score.score == pytest.approx(sum(i * p for i, p in enumerate(score.probabilities)))
    assert score.answer == str(max(range(3), key=lambda i: score.probabilities[i]))


# ----------------------------------------------------------------------------- loading failures


def release_copy(tmp_path, skip=()):
    folder = tmp_path / "release"
    shutil.copytree(TINY_MODEL, folder, ignore=shutil.ignore_patterns(*skip))
    for path in folder.iterdir():
        path.chmod(0o644)
    return folder


@pytest.mark.parametrize("missing", ["joint_head_config.json", "joint_head.safetensors"])
def test_release_without_head_files(tmp_path, missing):
    folder = release_copy(tmp_path, skip=[missing])
    with pytest.raises(ModelLoadError, match=f"lacks {missing}: not a Clef release"):
        resolve_release(str(folder))


def test_config_that_is_not_qwen3_omni_moe(tmp_path):
    folder = release_copy(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "qwen2_vl"
    (folder / "config.json").write_text(json.dumps(config))
    message = "model_type 'qwen2_vl'; a Clef release has one of 'qwen3_omni_moe', 'qwen3_5', 'qwen3_5_moe'"
    with pytest.raises(ModelLoadError, match=message):
        resolve_release(str(folder))


def test_unavailable_hub_model_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(ModelLoadError, match="'Cloudflare/clef-omni' is not in the local HF cache"):
        resolve_release("Cloudflare/clef-omni")


def test_hub_model_from_the_hf_cache(tmp_path, monkeypatch):
    snapshot = tmp_path / "hub" / "models--acme--tiny-clef" / "snapshots" / ("a" * 40)
    shutil.copytree(TINY_MODEL, snapshot)
    refs = tmp_path / "hub" / "models--acme--tiny-clef" / "refs"
    refs.mkdir()
    (refs / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"), raising=False)
    release = resolve_release("acme/tiny-clef")
    assert release.path == snapshot
    assert release.revision == "a" * 40


def rewrite_weights(folder, change):
    state = load_file(str(folder / "model.safetensors"))
    change(state)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_thinker_weights_with_a_missing_key(tmp_path):
    folder = release_copy(tmp_path)
    rewrite_weights(folder, lambda state: state.pop("thinker.model.norm.weight"))
    with pytest.raises(ModelLoadError, match=r"missing keys: .*norm\.weight"):
        load_scorer(str(folder), device="cpu")


def test_thinker_weights_with_an_unexpected_key(tmp_path):
    folder = release_copy(tmp_path)
    rewrite_weights(folder, lambda state: state.update({"thinker.model.extra_gate.weight": torch.zeros(2)}))
    with pytest.raises(ModelLoadError, match=r"unexpected keys: .*extra_gate\.weight"):
        load_scorer(str(folder), device="cpu")


def test_speech_output_weights_are_skipped(tmp_path, scorer, golden_encoded):
    """Talker and code2wav weights in the shard are ignored: the scores are the normal scorer's."""
    folder = release_copy(tmp_path)
    extra = {"talker.model.norm.weight": torch.full((64,), 3.0), "code2wav.decoder.weight": torch.ones(4, 4)}
    rewrite_weights(folder, lambda state: state.update(extra))
    with_speech = load_scorer(str(folder), device="cpu", dtype="float32")
    for encoded in golden_encoded[:4]:
        got, want = with_speech.score_batch([encoded])[0], scorer.score_batch([encoded])[0]
        assert len(got.questions) == len(want.questions) > 0
        for a, b in zip(got.questions, want.questions, strict=True):
            assert a.option_ids == b.option_ids and a.logits == b.logits


def test_thinker_weights_with_a_mismatched_shape(tmp_path):
    folder = release_copy(tmp_path)
    rewrite_weights(folder, lambda state: state.update({"thinker.model.norm.weight": torch.ones(65)}))
    expected = r"mismatched keys: model\.language_model\.norm\.weight \(checkpoint \(65,\), model \(64,\)\)"
    with pytest.raises(ModelLoadError, match=expected):
        load_scorer(str(folder), device="cpu")


def test_lm_head_kept_as_lexical_table_only(scorer):
    weights = load_file(str(TINY_MODEL / "model.safetensors"))
    assert torch.equal(scorer.backbone.lexical_rows, weights["thinker.lm_head.weight"])
    assert isinstance(scorer.backbone.thinker.lm_head, torch.nn.Identity)


def test_cpu_defaults_to_fp32_and_bad_device_or_dtype_are_clear(release):
    from clef_cli.model.backbone import resolve_device, resolve_dtype

    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert resolve_dtype(None, torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ModelLoadError, match="unknown dtype 'float8'"):
        resolve_dtype("float8", torch.device("cpu"))
    with pytest.raises(ModelLoadError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA GPU is available"):
            resolve_device("cuda:0")
