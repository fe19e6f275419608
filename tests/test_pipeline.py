"""The scoring job as a library: batching plan, out-of-memory recovery, row groups."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch

from clef_cli.encoding.batching import PlanEntry, plan_batches
from clef_cli.engines.local.pipeline import ScoreJob

from .support import background
from .support.helpers import assert_same_rows, settings_for


def test_plan_is_longest_first_within_budget_and_never_mixes_audio_in_video():
    entries = [PlanEntry(i, length) for i, length in enumerate([100, 900, 300, 310, 95, 880, 50])]
    entries += [PlanEntry(7, 400, True), PlanEntry(8, 390, True)]
    batches = plan_batches(entries, max_batch_tokens=1000, max_batch_size=3)
    assert [b.padded_length for b in batches] == sorted((b.padded_length for b in batches), reverse=True)
    assert batches[0].indices == [1]
    for batch in batches:
        assert batch.padded_tokens <= 1000 or len(batch.entries) == 1
        assert len(batch.entries) <= 3
        assert len({entry.audio_in_video for entry in batch.entries}) == 1
    assert sorted(i for b in batches for i in b.indices) == list(range(9))


def test_a_record_longer_than_the_budget_gets_its_own_batch():
    batches = plan_batches([PlanEntry(0, 5000), PlanEntry(1, 10)], max_batch_tokens=1000, max_batch_size=8)
    assert [b.indices for b in batches] == [[0], [1]]


@pytest.mark.slow  # the quick loop's budget (issue 36.12): CI's whole run has it
def test_out_of_memory_halves_the_budget_and_loses_nothing(tmp_path, scorer, monkeypatch):
    reference = ScoreJob(settings_for(tmp_path / "a", output=tmp_path / "a.parquet", limit=8), scorer=scorer)
    (tmp_path / "a").mkdir()
    reference.run()
    real = scorer.backbone.hidden_states
    seen = []

    def flaky(batch):
        padded = batch.input_ids.numel()
        seen.append(padded)
        if padded > 2000:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(batch)

    monkeypatch.setattr(scorer.backbone, "hidden_states", flaky)
    job = ScoreJob(settings_for(tmp_path, max_batch_tokens=8000, limit=8), scorer=scorer)
    summary = job.run()
    assert summary.failed == 0 and summary.scored == 8
    assert job.batch_tokens < 8000
    assert max(seen) > 2000 and all(size <= 2000 for size in seen[-3:])
    got = pq.read_table(tmp_path / "out.parquet").to_pylist()
    want = pq.read_table(tmp_path / "a.parquet").to_pylist()
    assert len(got) == 8
    assert_same_rows(got, want, probability_tolerance=1e-5)


def test_a_record_that_breaks_the_forward_fails_alone(tmp_path, scorer, monkeypatch):
    real = scorer.backbone.hidden_states

    def breaks_on_images(batch):
        if "pixel_values" in batch.media:
            raise RuntimeError("kernel failure (simulated)")
        return real(batch)

    monkeypatch.setattr(scorer.backbone, "hidden_states", breaks_on_images)
    summary = ScoreJob(settings_for(tmp_path, limit=None), scorer=scorer).run()
    rows = pq.read_table(tmp_path / "out.parquet").to_pylist()
    failed = {row["id"]: row["error"] for row in rows if row["error"]}
    assert summary.failed == len(failed) > 0
    assert all("model forward failed: kernel failure (simulated)" in error for error in failed.values())
    assert summary.scored == 17 - len(failed)


def test_row_groups_are_buffered_not_one_per_batch(tmp_path, scorer):
    settings = settings_for(tmp_path, limit=None, row_group_size=5, max_batch_size=2)
    ScoreJob(settings, scorer=scorer).run()
    metadata = pq.ParquetFile(tmp_path / "out.parquet").metadata
    assert metadata.num_rows == 17
    assert [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)] == [5, 5, 5, 2]


def test_a_record_that_kills_its_encoding_process_fails_alone():
    """The job (tests/support/background_jobs.py: crash) runs in a subprocess started with the session:
    its worker process is started three times (first, after the crash, after the record alone
    crashes it again), each importing torch and transformers, so it runs beside the other tests."""
    done = background.run("crash").result()
    rows = done["rows"]
    failed = {row["id"]: row["error"] for row in rows if row["error"]}
    assert failed == {
        "ticket-004": "record 'ticket-004', field 'media': the encoding process crashed on this record "
        "(a media decoder failed hard)"
    }
    assert done["scored"] == 16
    # a dead worker is transient: not final in the store, so a rerun tries the record again
    assert {row["id"]: row["error_kind"] for row in rows if row["error"]} == {"ticket-004": "transient"}
    # the rerun, without the fault and inline
    assert tuple(done["again"]) == (1, 1, 16, 0)


def test_media_are_decoded_once_thanks_to_the_spool(tmp_path, scorer, monkeypatch):
    import clef_cli.families.omni as omni

    calls: list[str] = []
    real = omni.decode_video

    def counting(source, limits):
        calls.append(str(source))
        return real(source, limits)

    monkeypatch.setattr(omni, "decode_video", counting)
    summary = ScoreJob(settings_for(tmp_path, limit=None, max_batch_size=2), scorer=scorer).run()
    assert summary.scored == 17
    assert len(calls) == 3  # three records with a video, each decoded once
    assert not (tmp_path / "out.parquet.ckpt" / "spool").exists()


def test_image_records_are_planned_from_headers_and_decoded_once(tmp_path, scorer, monkeypatch):
    """An image-only record is planned from its headers and decoded when its batch is made; a
    record with an image beside audio is encoded (so decoded) while planning, then spooled."""
    import clef_cli.families.base as base
    import clef_cli.families.omni as omni

    decoded: list[str] = []
    measured: list[str] = []
    real_decode, real_size = omni.decode_image, base.image_size
    monkeypatch.setattr(omni, "decode_image", lambda src, limits: decoded.append(src) or real_decode(src, limits))
    monkeypatch.setattr(base, "decode_image", lambda src, limits: decoded.append(src) or real_decode(src, limits))
    monkeypatch.setattr(base, "image_size", lambda src, limits: measured.append(src) or real_size(src, limits))
    summary = ScoreJob(settings_for(tmp_path, limit=None, max_batch_size=2), scorer=scorer).run()
    assert summary.scored == 17
    assert len(measured) == 4  # ticket-003, -005 and -009 (two images), from their headers
    assert len(decoded) == 5  # those four once each, and ticket-008's image beside its audio


def test_without_spool_room_media_are_decoded_again_and_results_agree(tmp_path, scorer, monkeypatch):
    import clef_cli.families.omni as omni

    calls: list[str] = []
    real = omni.decode_video
    monkeypatch.setattr(omni, "decode_video", lambda source, limits: calls.append(str(source)) or real(source, limits))
    ScoreJob(settings_for(tmp_path, limit=None, media_spool_bytes=0), scorer=scorer).run()
    assert len(calls) == 6
    spooled = ScoreJob(settings_for(tmp_path / "b", limit=None, output=tmp_path / "b.parquet"), scorer=scorer)
    (tmp_path / "b").mkdir()
    spooled.run()
    inline, spooled_rows = (pq.read_table(tmp_path / name).to_pylist() for name in ("out.parquet", "b.parquet"))
    assert len(inline) == 17
    for a, b in zip(inline, spooled_rows, strict=True):
        assert a["answers"] == b["answers"]


def test_the_next_windows_batches_are_made_ready_while_this_windows_last_ones_run(tmp_path, scorer, monkeypatch):
    """Batches stream across planning windows: a batch of the next window is prepared before the
    forward of this window's last batch (else the model waits at every window's start)."""
    import clef_cli.engines.local.executor as executor

    events: list[tuple[str, int]] = []
    real_prepare, real_forward = executor.prepare_batch, scorer.backbone.hidden_states

    def preparing(order):
        events.extend(("prepare", item.record.index) for item in order.items)
        return real_prepare(order)

    def forwarding(batch):
        events.extend(("forward", record.record.index) for record in batch.records)
        return real_forward(batch)

    monkeypatch.setattr(executor, "prepare_batch", preparing)
    monkeypatch.setattr(scorer.backbone, "hidden_states", forwarding)
    summary = ScoreJob(settings_for(tmp_path, limit=None, window=4, max_batch_size=1), scorer=scorer).run()
    assert summary.scored == 17
    window = {index: index // 4 for _, index in events}  # windows of 4 records, in input order
    ahead = [
        (earlier, later)
        for position, (kind, later) in enumerate(events)
        if kind == "prepare"
        for other, earlier in events[position + 1 :]
        if other == "forward" and window[earlier] < window[later]
    ]
    assert ahead, events
