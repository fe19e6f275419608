"""How many encoding workers and decoder threads a machine can feed a GPU with: from the cores
this process may use and the memory each worker needs at its peak."""

from __future__ import annotations

import math
import os
from pathlib import Path

from clef_cli.encoding.media import MAX_FRAME_PIXELS, VIDEO_FPS, MediaLimits

WORKER_BASE_BYTES = 1 << 30
"""A worker's resident memory before it decodes anything: Python, torch, the processor (measured
at about 1.0 GiB)."""
MEDIA_COPIES = 6
"""Copies of the longest allowed video's frames a worker holds at its peak: the uint8 frames, the
processor's float32 patches (4 bytes a value) and one more in flight."""


def worker_peak_bytes(limits: MediaLimits) -> int:
    """Estimated peak memory of one encoding worker: its base plus the longest allowed video."""
    frames = math.ceil(limits.max_video_seconds * VIDEO_FPS) + 1
    return WORKER_BASE_BYTES + MEDIA_COPIES * frames * MAX_FRAME_PIXELS * 3


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. a container's or taskset's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), in bytes; None when unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_workers(limits: MediaLimits, cores: int | None = None, memory: int | None = None) -> int:
    """Encoding workers beside a GPU: every usable core but one (the main process feeds the
    GPU), at most as many as half the available memory holds at each worker's estimated peak,
    and at least one."""
    cores = usable_cores() if cores is None else cores
    memory = available_memory() if memory is None else memory
    workers = cores - 1
    if memory is not None:
        workers = min(workers, memory // 2 // worker_peak_bytes(limits))
    return max(1, workers)


def decode_threads_per_worker(workers: int, cores: int | None = None) -> int:
    """FFmpeg threads per worker: the cores left once the main process has one, shared out."""
    cores = usable_cores() if cores is None else cores
    return max(1, (cores - 1) // workers) if workers > 0 else 1
