"""Planning: records stream in windows (in input order), each window's records are encoded in
background workers to learn their exact prompt lengths, and the next window is planned while the
current one runs. Shared by the scoring run and the dry run.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_cli.encoding.object_prefetch import PrefetchStopped
from clef_cli.engines.local.encode_pool import EncodePool
from clef_cli.engines.local.pool_size import decode_threads_per_worker, default_workers
from clef_cli.engines.local.workers import EncoderSpec, Planned, within_budget
from clef_cli.inputs.first_window import FIRST_WINDOW
from clef_cli.inputs.record_chunks import record_chunks
from clef_cli.inputs.records import InvalidRecord, Record
from clef_cli.job.lifecycle import job_records
from clef_cli.job.settings import ScoreSettings
from clef_cli.model.dtypes import ITEM_SIZES
from clef_cli.release import Release
from clef_cli.results import FailedRecord

__all__ = ["Window", "encode_pool", "hidden_bytes_per_token", "job_records", "planned_windows", "worker_count"]


def worker_count(settings: ScoreSettings) -> int:
    """Encoding processes: as asked; else none on the CPU (the model uses every core), and beside
    a GPU every usable core but one, bounded by memory."""
    if settings.workers is not None:
        return settings.workers
    from clef_cli.model.backbone import resolve_device

    if resolve_device(settings.device).type == "cpu":
        return 0
    return default_workers(settings.limits)


def encode_pool(
    settings: ScoreSettings,
    release: Release,
    workers: int,
    spool: Path | None = None,
    media_dtype: str | None = None,
    images_from_headers: bool = False,
    stop: threading.Event | None = None,
) -> EncodePool:
    """`media_dtype`: the model's compute dtype, when the workers should cast media to it;
    `images_from_headers`: plan image records without decoding them (a run, not a dry run);
    `stop`: the job's stop requests, which end the reads of objects ahead of planning."""
    threads = decode_threads_per_worker(workers)
    spec = EncoderSpec(
        release.path,
        settings.max_length,
        settings.overflow,
        settings.limits,
        spool,
        release.family,
        threads,
        media_dtype,
        images_from_headers,
        settings.special_tokens,
    )
    return EncodePool(spec, workers, stop)


def hidden_bytes_per_token(settings: ScoreSettings, hidden_size: int) -> int:
    """Disk per prompt token with `--hidden-states keep`: the state plus its int32 input id."""
    return hidden_size * ITEM_SIZES[settings.hidden_dtype] + 4


@dataclass
class Window:
    """A slice of the input in order: planned records and records that failed before planning."""

    planned: list[Planned]
    failures: list[FailedRecord]


# The first window (FIRST_WINDOW records, also the records the job checks before it starts): the
# model starts after it is planned, so it is kept small (a window of 8192 videos would keep a GPU
# idle for most of an hour); each next window doubles, up to `--window`. Results do not depend on
# it: a record's scores never depend on its batch.


def window_sizes(window: int) -> Iterator[int]:
    size = min(FIRST_WINDOW, window)
    while True:
        yield size
        size = min(window, size * 2)


def planned_windows(
    pool: EncodePool,
    records: Iterable[Record | InvalidRecord],
    window: int,
    skip: Any = (),
    media_budget: int = 0,
) -> Iterator[Window]:
    """Windows in input order; the next one is planned in the background while the caller runs
    the current one. Each window keeps at most `media_budget` bytes of spooled media tensors
    from planning; the rest are decoded again when their batch runs."""

    def submit(chunk: list[Record | InvalidRecord]) -> tuple[list[FailedRecord], list[Future]]:
        failures = [FailedRecord(item.id, item.index, item.error) for item in chunk if isinstance(item, InvalidRecord)]
        futures = pool.plan_window([item for item in chunk if isinstance(item, Record)])
        return failures, futures

    pending = (record for record in records if record.index not in skip)
    chunks = record_chunks(pending, window_sizes(window))  # also ended by inline media bytes
    current = next((submit(chunk) for chunk in chunks), None)
    while current is not None:
        upcoming = next((submit(chunk) for chunk in chunks), None)
        failures, futures = current
        planned: list[Planned] = []
        budget = [media_budget]
        for future in futures:
            try:
                result: Planned = future.result()
            except PrefetchStopped:  # a stop request: the window is left for the next run
                return
            if result.error is not None:
                failures.append(
                    FailedRecord(result.record.id, result.record.index, result.error, kind=result.error_kind)
                )
            else:
                planned.append(within_budget(result, budget))
        yield Window(planned, failures)
        current = upcoming
