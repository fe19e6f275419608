"""The kernels the thinker runs with are pinned at load, and the grouped expert kernel computes
what the per-expert loop computes."""

from __future__ import annotations

import pytest
import torch

from clef_cli.errors import ModelLoadError


def test_the_thinker_is_pinned_to_grouped_experts_and_sdpa(scorer):
    thinker = scorer.backbone.thinker
    assert thinker.get_experts_implementation()["text_config"] == "grouped_mm"
    assert thinker.config._attn_implementation == "sdpa"


def test_a_thinker_that_fell_back_to_another_kernel_is_refused(scorer):
    from clef_cli.families.omni import check_backends

    thinker = scorer.backbone.thinker
    thinker.set_experts_implementation("eager")
    try:
        with pytest.raises(ModelLoadError, match="loaded with experts 'eager'"):
            check_backends(thinker)
    finally:
        thinker.set_experts_implementation("grouped_mm")
    check_backends(thinker)


def test_grouped_mm_and_eager_experts_give_the_same_logits(scorer, golden_encoded):
    thinker = scorer.backbone.thinker
    records = [encoded for encoded in golden_encoded if not encoded.use_audio_in_video][:6]
    grouped = scorer.score_batch(records)
    thinker.set_experts_implementation("eager")
    try:
        assert thinker.get_experts_implementation()["text_config"] == "eager"
        eager = scorer.score_batch(records)
    finally:
        thinker.set_experts_implementation("grouped_mm")
    got = torch.tensor([p for r in grouped for q in r.questions for p in q.logits])
    want = torch.tensor([p for r in eager for q in r.questions for p in q.logits])
    assert got.shape == want.shape and got.numel() > 20
    assert (got - want).abs().max().item() <= 1e-5
