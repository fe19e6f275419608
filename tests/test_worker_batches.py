"""Batches with media are collated in an encoding worker and reach the main process in shared
memory, exactly as the main process would have collated them (issue 24).

The reference for every check is `collate` run here on records encoded here, followed by the
model's own cast (`ModelBatch.model_inputs`), so a worker that rounded differently, dropped a
clip, misplaced a row or copied through a pipe would fail.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from clef_cli.choices import OverflowPolicy
from clef_cli.encoding.batching import collate
from clef_cli.encoding.media import MediaLimits
from clef_cli.engines.local.batch_prep import BatchOrder, prepare_batch, preparing_crashed
from clef_cli.engines.local.batch_slots import ALIGNMENT, BatchSlots, allocator_for
from clef_cli.engines.local.encode_pool import EncodePool
from clef_cli.engines.local.workers import EncoderSpec, within_budget

from .support.helpers import GOLDEN_MAX_LENGTH, GOLDEN_RECORDS, PROBABILITY_TOLERANCE, settings_for

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


def _prepared(release, groups, tmp_path, media_dtype, workers, spooled=True):
    """Plan the records (their media spooled), then collate each group, in one worker or inline
    (`workers=0`: the same functions, in this process). `spooled=False` drops the spool first, as
    a spent disk budget does: the batch then encodes its records again, their media not yet cast."""
    spec = EncoderSpec(
        release.path, GOLDEN_MAX_LENGTH, OverflowPolicy.truncate, MediaLimits(), tmp_path, "omni", 1, media_dtype
    )
    batches = []
    with EncodePool(spec, workers) as pool:
        for records in groups:
            planned = [future.result() for future in [pool.plan(record) for record in records]]
            assert all(item.spooled is not None for item in planned)
            if not spooled:
                planned = [within_budget(item, [0]) for item in planned]
                assert all(item.ready() is None for item in planned)
            ready = pool.urgent(prepare_batch, BatchOrder(planned), preparing_crashed).result()
            assert ready is not None and not ready.failures
            batches.append(ready.received())
    return batches


@pytest.mark.parametrize(("dtype", "spooled"), [(torch.bfloat16, True), (torch.float16, True), (torch.bfloat16, False)])
def test_media_cast_in_the_worker_equal_the_models_own_cast_bit_for_bit(
    release, encoder, groups, tmp_path, dtype, spooled
):
    """Spooled media were cast when they were spooled; media encoded again when the batch is
    made (spool dropped) are cast by the batch's own collate, which this case would miss."""
    pad = encoder.processor.tokenizer.pad_token_id
    batches = _prepared(release, groups, tmp_path, str(dtype).removeprefix("torch."), workers=0, spooled=spooled)
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


def _ptr(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def test_a_batch_is_laid_out_in_its_slot_and_a_batch_too_large_spills_and_grows_it(encoder, groups):
    """In-process: the allocator a worker uses writes every tensor of the batch into the slot,
    each aligned, with the values `collate` gives; what does not fit goes to fresh shared memory,
    and the slot given back is remade large enough for the next such batch."""
    records = [encoder.encode(record) for record in groups[0]]
    pad = encoder.processor.tokenizer.pad_token_id
    want = collate(records, pad)
    slots = BatchSlots()
    small = slots.take()
    spilling = allocator_for(small)
    first = collate(records, pad, spilling)
    assert spilling.spilled > 0 and spilling.needed > small.nbytes
    slots.give_back(small, spilling.needed)
    grown = slots.take()
    assert grown.number == small.number and grown.nbytes >= spilling.needed
    fitting = allocator_for(grown)
    second = collate(records, pad, fitting)
    assert fitting.spilled == 0 and fitting.needed == spilling.needed
    for batch in (first, second):
        assert torch.equal(batch.input_ids, want.input_ids) and torch.equal(batch.attention_mask, want.attention_mask)
        assert batch.media.keys() == want.media.keys()
        for key, value in want.media.items():
            assert torch.equal(batch.media[key], value), key
    tensors = [second.input_ids, second.attention_mask, *second.media.values()]
    assert all(_ptr(tensor) == grown.storage.data_ptr() for tensor in tensors)
    offsets = sorted(tensor.data_ptr() - grown.storage.data_ptr() for tensor in tensors)
    assert all(offset % ALIGNMENT == 0 for offset in offsets)
    sizes = {tensor.data_ptr() - grown.storage.data_ptr(): tensor.nbytes for tensor in tensors}
    assert all(start + sizes[start] <= end for start, end in itertools.pairwise(offsets))  # no overlap


@pytest.mark.slow
def test_a_worker_reuses_its_slot_and_the_main_process_maps_the_same_pages(release, encoder, groups, tmp_path):
    spec = EncoderSpec(release.path, GOLDEN_MAX_LENGTH, OverflowPolicy.truncate, MediaLimits(), tmp_path, "omni", 1)
    slots = BatchSlots()
    pad = encoder.processor.tokenizer.pad_token_id
    placed = []
    with EncodePool(spec, 1) as pool:
        for records in groups:
            planned = [future.result() for future in [pool.plan(record) for record in records]]
            want = collate([encoder.encode(record) for record in records], pad)
            for _ in range(3):  # the first batch spills and grows the slot; the next ones fit
                slot = slots.take()
                ready = pool.urgent(prepare_batch, BatchOrder(planned, slot), preparing_crashed).result()
                batch = ready.received()
                in_slot = all(_ptr(value) == slot.storage.data_ptr() for value in batch.media.values())
                assert in_slot is (ready.slot_bytes <= slot.nbytes)
                placed.append(in_slot)
                for key, value in want.media.items():
                    assert torch.equal(batch.media[key], value), key
                slots.give_back(slot, ready.slot_bytes)
                del batch, ready
    assert placed[0] is False and placed[1:3] == [True, True] and sum(placed) >= 4


@pytest.mark.slow
def test_a_job_with_a_worker_scores_the_golden_records_as_the_reference(tmp_path, scorer, expected):
    """Images planned from headers, decoded once in the worker, batches through reused slots:
    every record's probabilities are the reference's."""
    import pyarrow.parquet as pq

    from clef_cli.engines.local.pipeline import ScoreJob

    settings = settings_for(
        tmp_path, [GOLDEN_RECORDS], workers=1, max_batch_size=2, max_length=GOLDEN_MAX_LENGTH, limit=None
    )
    summary = ScoreJob(settings, scorer=scorer).run()
    assert summary.scored == len(expected) and summary.failed == 0
    rows = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [row["id"] for row in rows] == [reference["id"] for reference in expected]
    for row, reference in zip(rows, expected, strict=True):
        assert row["prompt_tokens"] == reference["num_tokens"], row["id"]
        for answer, question in zip(row["answers"], reference["questions"], strict=True):
            assert [label["label"] for label in answer["labels"]] == question["option_ids"]
            got = [label["probability"] for label in answer["labels"]]
            assert got == pytest.approx(question["probabilities"], abs=PROBABILITY_TOLERANCE), row["id"]


def test_every_slot_grows_to_the_largest_batch_yet_so_batches_of_any_size_fit_any_slot():
    slots = BatchSlots()
    large, small = slots.take(), slots.take()
    slots.give_back(large, 10_000)
    slots.give_back(small, 100)  # its own batch was small, but the next one may be large
    again = [slots.take(), slots.take()]
    assert {slot.number for slot in again} == {large.number, small.number}
    assert all(slot.nbytes >= 10_000 for slot in again)
    for slot in again:  # shared memory, mapped here as in a worker
        assert slot.storage.is_shared()
        view = torch.empty(0, dtype=torch.uint8).set_(slot.storage, 0, (10_000,)).fill_(7)
        assert int(view.sum()) == 70_000
