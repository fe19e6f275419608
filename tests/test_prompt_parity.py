"""Token-for-token parity of the prompt encoder with the reference implementation's outputs."""

from __future__ import annotations

import warnings

import pytest
import torch

from clef_cli.encoding.prompt import render

from .support.helpers import GOLDEN_MAX_LENGTH


def test_every_golden_record_encodes_to_the_reference_ids(golden_encoded, expected):
    assert len(golden_encoded) == len(expected) == 15
    for encoded, reference in zip(golden_encoded, expected, strict=True):
        assert encoded.record.id == reference["id"]
        assert encoded.input_ids == reference["input_ids"], encoded.record.id
        assert encoded.length == reference["num_tokens"]


def test_image_token_counts_are_the_references_with_warnings_as_errors(encoder, golden_records, expected, processor):
    """The family's image bounds reach the processor through an API it supports: a deprecated
    spelling warns first (transformers 5.25 warns on min_pixels/max_pixels, which a later release
    drops; the release's own, smaller bounds would then change the counts in silence)."""
    pad = processor.image_token_id
    planned_records = 0
    for record, reference in zip(golden_records, expected, strict=True):
        if not record.images:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            encoded = encoder.encode(record)
            planned = encoder.plan(record)
        assert encoded.input_ids.count(pad) == reference["input_ids"].count(pad) > 0, record.id
        if planned is not None:  # images alone: planned from their headers, without decoding them
            assert planned.input_ids == reference["input_ids"], record.id
            planned_records += 1
    assert planned_records == 2


def test_spans_and_option_ids_match_the_reference(golden_encoded, expected):
    for encoded, reference in zip(golden_encoded, expected, strict=True):
        assert len(encoded.questions) == len(reference["questions"])
        for question, golden in zip(encoded.questions, reference["questions"], strict=True):
            assert question.question_id == golden["question_id"]
            assert question.question_type == golden["question_type"]
            assert list(question.question_span) == golden["question_span"]
            assert [list(span) for span in question.option_spans] == golden["option_spans"]
            assert list(question.option_ids) == golden["option_ids"]


def test_decoded_prompt_matches(golden_encoded, expected, processor):
    for encoded, reference in zip(golden_encoded, expected, strict=True):
        assert processor.tokenizer.decode(encoded.input_ids) == reference["prompt"]


@pytest.mark.parametrize("name", ["pixel_values", "pixel_values_videos", "input_features"])
def test_media_tensors_match_the_reference_decoding(golden_encoded, expected, name):
    checked = 0
    for encoded, reference in zip(golden_encoded, expected, strict=True):
        golden = reference["media"].get(name)
        if golden is None:
            assert name not in encoded.media
            continue
        tensor = encoded.media[name].double()
        assert list(tensor.shape) == golden["shape"], encoded.record.id
        tolerance = 1e-5 * golden["abs_sum"]
        assert abs(tensor.sum().item() - golden["sum"]) <= tolerance, encoded.record.id
        assert abs(tensor.abs().sum().item() - golden["abs_sum"]) <= tolerance, encoded.record.id
        checked += 1
    assert checked >= 3


def test_grids_audio_lengths_and_audio_in_video_flag(golden_encoded, expected):
    grids = ("image_grid_thw", "video_grid_thw")
    for encoded, reference in zip(golden_encoded, expected, strict=True):
        media = reference["media"]
        assert encoded.use_audio_in_video == media["use_audio_in_video"], encoded.record.id
        # exactly the reference's media tensors: no extra grid, feature or timing key
        names = {"audio_feature_lengths": "feature_attention_mask"}
        assert set(encoded.media) == {names.get(key, key) for key in media if key != "use_audio_in_video"}
        for name in grids:
            if name in media:
                assert encoded.media[name].tolist() == media[name]
        if "audio_feature_lengths" in media:
            assert encoded.media["feature_attention_mask"].sum(-1).tolist() == media["audio_feature_lengths"]
        if "video_second_per_grid" in media:
            assert torch.as_tensor(encoded.media["video_second_per_grid"]).tolist() == media["video_second_per_grid"]


def test_truncated_state_records_the_cut(golden_encoded):
    by_id = {encoded.record.id: encoded for encoded in golden_encoded}
    truncated = by_id["a11-truncated-state"]
    assert truncated.length == GOLDEN_MAX_LENGTH
    assert truncated.state_tokens_cut > 0
    assert all(encoded.state_tokens_cut == 0 for key, encoded in by_id.items() if key != "a11-truncated-state")


def test_render_spells_values_like_the_reference():
    assert render("as is {x}") == "as is {x}"
    assert render({"b": 1, "a": [1.0, None, True]}) == '{"a":[1.0,null,true],"b":1}'
    assert render({"ü": "東京"}) == '{"ü":"東京"}'
    assert render(1e-05) == "1e-05"
    assert render(12.5) == "12.5"


def test_overflow_error_policy_refuses_instead_of_cutting(processor, golden_records):
    from clef_cli.encoding.prompt import PromptEncoder
    from clef_cli.errors import RecordError

    strict = PromptEncoder(processor, max_length=GOLDEN_MAX_LENGTH, overflow="error")
    record = next(r for r in golden_records if r.id == "a11-truncated-state")
    with pytest.raises(RecordError, match=r"only \d+ fit in max length 1024") as caught:
        strict.encode(record)
    assert caught.value.field == "state"
    assert caught.value.record_id == "a11-truncated-state"


def test_schema_longer_than_max_length_is_that_records_error(processor, golden_encoded, expected):
    from clef_cli.encoding.prompt import PromptEncoder
    from clef_cli.errors import RecordError

    tight = PromptEncoder(processor, max_length=200)
    fixed = expected[0]["num_tokens"] - golden_encoded[0].state_tokens
    with pytest.raises(RecordError, match=rf"schema requires {fixed} tokens before state; maximum is 200"):
        tight.encode(golden_encoded[0].record)


def _golden(expected, record_id):
    return next(reference for reference in expected if reference["id"] == record_id)


@pytest.mark.parametrize(
    ("record_id", "question_id", "criteria"),
    [
        # extra keys are accepted and ignored, as the reference's defaults.update(criteria) does
        ("a04-four-questions-overrides", "has_link", {"false": None, "maybe": "Perhaps.", "True": "x"}),
        ("a13-scalar-state", "above_ten", {"true": "Yes, above ten.", "unsure": None}),
        # falsy criteria mean the defaults
        ("a01-text-noul", "refund_allowed", None),
        ("a01-text-noul", "refund_allowed", {}),
        ("a01-text-noul", "refund_allowed", []),
        ("a01-text-noul", "refund_allowed", ""),
        ("a01-text-noul", "refund_allowed", {"neither": "ignored"}),
    ],
)
def test_noul_criteria_follow_the_reference_update_rule(
    encoder, golden_records, expected, record_id, question_id, criteria
):
    import dataclasses

    from clef_cli.inputs.records import RecordBuilder

    record = next(record for record in golden_records if record.id == record_id)
    raw = {
        "id": record.id,
        "state": record.state,
        "questions": {
            question.id: {
                "type": question.type,
                **({"instructions": question.instructions} if question.instructions is not None else {}),
                "criteria": criteria if question.id == question_id else _raw_criteria(question),
            }
            for question in record.questions
        },
    }
    rebuilt = RecordBuilder().build(raw, record.index, record.base_dir)
    assert not hasattr(rebuilt, "error"), getattr(rebuilt, "error", None)
    rebuilt = dataclasses.replace(rebuilt, images=record.images, audio=record.audio, videos=record.videos)
    encoded = encoder.encode(rebuilt)
    reference = _golden(expected, record_id)
    assert encoded.input_ids == reference["input_ids"]
    ignored = next(question for question in rebuilt.questions if question.id == question_id).ignored_criteria
    extra = [str(key) for key in (criteria or {}) if key not in ("true", "false")] if isinstance(criteria, dict) else []
    assert list(ignored) == extra


def _raw_criteria(question):
    if question.type == "noul":
        return dict(question.options)
    if question.type == "score":
        return [description for _, description in question.options]
    return {option_id: description for option_id, description in question.options}
