"""Encoding that scales: the default worker count's rule, and threaded video decoding that gives
the same frames and soundtrack as one thread."""

from __future__ import annotations

import numpy as np
import pytest

from clef_cli.encoding import media
from clef_cli.encoding.media import MediaLimits
from clef_cli.engines.local.pool_size import decode_threads_per_worker, default_workers, worker_peak_bytes

from .support.helpers import FIXTURES

GIB = 1 << 30


def test_worker_peak_estimate_follows_the_video_limit():
    frame_bytes = 256 * 32 * 32 * 3  # the reference's per-frame pixel cap, RGB
    assert worker_peak_bytes(MediaLimits()) == GIB + 6 * (300 * 2 + 1) * frame_bytes
    assert worker_peak_bytes(MediaLimits(max_video_seconds=10)) == GIB + 6 * 21 * frame_bytes


@pytest.mark.parametrize(
    ("cores", "memory_gib", "expected"),
    [(16, 128, 15), (16, 16, 2), (2, 23, 1), (1, 64, 1), (64, 1024, 63), (8, 0, 1)],
)
def test_default_workers_rule(cores, memory_gib, expected):
    limits = MediaLimits()
    by_memory = memory_gib * GIB // 2 // worker_peak_bytes(limits)
    assert expected == max(1, min(cores - 1, by_memory))
    assert default_workers(limits, cores=cores, memory=memory_gib * GIB) == expected


def test_decode_threads_share_the_spare_cores():
    assert decode_threads_per_worker(0, cores=16) == 1
    assert decode_threads_per_worker(15, cores=16) == 1
    assert decode_threads_per_worker(4, cores=16) == 3
    assert decode_threads_per_worker(1, cores=2) == 1


@pytest.mark.parametrize("name", ["clip_av.mp4", "clip_av_odd.webm", "clip_large_silent.mp4"])
def test_threaded_decoding_gives_identical_frames(name, monkeypatch):
    path = str(FIXTURES / "media" / name)
    monkeypatch.setattr(media, "DECODE_THREADS", 1)
    single = media.decode_video(path, MediaLimits())
    monkeypatch.setattr(media, "DECODE_THREADS", 3)
    threaded = media.decode_video(path, MediaLimits())
    assert np.array_equal(single.frames, threaded.frames)
    if single.soundtrack is None:
        assert threaded.soundtrack is None
    else:
        assert np.array_equal(single.soundtrack, threaded.soundtrack)
