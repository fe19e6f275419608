"""Batches with media are collated in an encoding worker and reach the main process in shared
memory, exactly as the main process would have collated them (issue 24).

The reference for every check is `collate` run here on records encoded here, followed by the
model's own cast (`ModelBatch.model_inputs`), so a worker that rounded differently, dropped a
clip, misplaced a row or copied through a pipe would fail.
"""

from __future__ import annotations

import pytest
import torch

from clef_cli.choices import OverflowPolicy
from clef_cli.encoding.batching import collate
from clef_cli.encoding.media import MediaLimits
from clef_cli.engines.local.batch_prep import prepare_batch, preparing_crashed
from clef_cli.engines.local.workers import EncodePool, EncoderSpec

from .helpers import GOLDEN_MAX_LENGTH

LARGE = {"a14-webm-odd-frames", "a15-large-frames-and-image"}
"""Left out to keep these quick: the other records already cover every media tensor."""


@pytest.fixture(scope="module")
def groups(encoder, golden_records):
    """The golden records with media, as the batches they may form (one per audio-in-video flag)."""
    by_flag: dict[bool, list] = {}
    for record in golden_records:
        if record.has_media and record.id not in LARGE:
            by_flag.setdefault(encoder.encode(record).use_audio_in_video, []).append(record)
    assert set(by_flag) == {False, True}
    return list(by_flag.values())


def _prepared(release, groups, tmp_path, media_dtype, workers):
    """Plan the records (their media spooled), then collate each group, in one worker or inline
    (`workers=0`: the same functions, in this process)."""
    spec = EncoderSpec(
        release.path, GOLDEN_MAX_LENGTH, OverflowPolicy.truncate, MediaLimits(), tmp_path, "omni", 1, media_dtype
    )
    batches = []
    with EncodePool(spec, workers) as pool:
        for records in groups:
            planned = [future.result() for future in [pool.plan(record) for record in records]]
            assert all(item.spooled is not None for item in planned)
            ready = pool.urgent(prepare_batch, planned, preparing_crashed).result()
            assert ready is not None and not ready.failures
            batches.append(ready.received())
    return batches


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_media_cast_in_the_worker_equal_the_models_own_cast_bit_for_bit(release, encoder, groups, tmp_path, dtype):
    pad = encoder.processor.tokenizer.pad_token_id
    batches = _prepared(release, groups, tmp_path, str(dtype).removeprefix("torch."), workers=0)
    for records, batch in zip(groups, batches, strict=True):
        want = collate([encoder.encode(record) for record in records], pad).model_inputs("cpu", dtype)
        got = batch.model_inputs("cpu", dtype)
        assert set(got) == set(want)
        for key, value in want.items():
            assert got[key].dtype == value.dtype, key
            assert torch.equal(got[key], value), key  # bit for bit: the same values in the same dtype
        for key, value in batch.media.items():  # cast in the worker, not here
            floating = value.is_floating_point() and key != "video_second_per_grid"
            assert (value.dtype == dtype) is floating, key
    assert {"pixel_values", "pixel_values_videos", "input_features", "video_second_per_grid"} <= {
        key for batch in batches for key in batch.media
    }


@pytest.mark.slow
def test_a_worker_batch_arrives_in_shared_memory_and_scores_like_one_collated_here(
    release, encoder, scorer, groups, tmp_path
):
    for records, batch in zip(groups, _prepared(release, groups, tmp_path, None, workers=1), strict=True):
        for key, value in {"input_ids": batch.input_ids, **batch.media}.items():
            assert value.is_shared(), key  # mapped from the worker: the main process copied nothing
        here = collate([encoder.encode(record) for record in records], scorer.pad_token_id)
        assert batch.media.keys() == here.media.keys()
        for key, value in here.media.items():
            assert torch.equal(batch.media[key], value), key
        assert torch.equal(scorer.hidden_states(batch.records, batch), scorer.hidden_states(here.records))
        # split again (out of memory): each record's media are views of the batch, equal to its own
        for record, alone in zip(batch.records, here.records, strict=True):
            assert record.media.keys() == alone.media.keys()
            for key, value in alone.media.items():
                assert torch.equal(record.media[key], value), (record.record.id, key)
