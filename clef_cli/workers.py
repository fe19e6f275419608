"""Encoding in background processes while the model runs, through a bounded priority queue.

Two kinds of work share the pool: encoding the records of the batches about to run (urgent:
the GPU waits on them) and planning the next window (measuring prompt lengths). A dispatcher
keeps only a few tasks in the pool at once and always hands it the most urgent one, so planning
never delays a batch. With `workers=0` everything runs inline, in order.
"""

from __future__ import annotations

import heapq
import itertools
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from clef_cli.errors import RecordError
from clef_cli.media import MediaLimits
from clef_cli.prompt import EncodedRecord, OverflowPolicy, PromptEncoder
from clef_cli.records import Record

URGENT, BACKGROUND = 0, 1


@dataclass(frozen=True)
class EncoderSpec:
    """Everything a worker process needs to build its own `PromptEncoder` (picklable)."""

    release_path: Path
    max_length: int
    overflow: OverflowPolicy
    limits: MediaLimits

    def build(self) -> PromptEncoder:
        from clef_cli.release import Release, load_processor

        release = Release(path=self.release_path, model_id=str(self.release_path), revision=None, config={})
        return PromptEncoder(load_processor(release), self.max_length, self.overflow, self.limits)


@dataclass(frozen=True)
class Planned:
    """A planned record: its length, or why it cannot be scored, and its encoding (ids as int32).
    The planner keeps media tensors only up to a byte budget; a record whose tensors were dropped
    is encoded again when its batch comes, so media never pile up in memory."""

    record: Record
    length: int | None = None
    audio_in_video: bool = False
    error: str | None = None
    encoded: EncodedRecord | None = None


_worker_encoder: PromptEncoder | None = None


def _init_worker(spec: EncoderSpec) -> None:
    import torch

    global _worker_encoder
    torch.set_num_threads(1)
    _worker_encoder = spec.build()


def _encoder() -> PromptEncoder:
    assert _worker_encoder is not None, "worker not initialised"
    return _worker_encoder


def compact(encoded: EncodedRecord) -> EncodedRecord:
    return replace(encoded, input_ids=np.asarray(encoded.input_ids, dtype=np.int32))


def plan_record(record: Record) -> Planned:
    """Encode to measure the prompt; the caller decides whether to keep the media tensors."""
    try:
        encoded = _encoder().encode(record)
    except RecordError as error:
        return Planned(record, error=str(error))
    return Planned(record, encoded.length, encoded.use_audio_in_video, encoded=compact(encoded))


def media_bytes(encoded: EncodedRecord) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in encoded.media.values())


def within_budget(planned: Planned, budget: list[int]) -> Planned:
    """Keep a planned record's media tensors while `budget[0]` bytes remain; else drop them."""
    if planned.encoded is None or not planned.encoded.media:
        return planned
    size = media_bytes(planned.encoded)
    if size <= budget[0]:
        budget[0] -= size
        return planned
    return replace(planned, encoded=None)


def encode_record(record: Record) -> EncodedRecord | str:
    try:
        return compact(_encoder().encode(record))
    except RecordError as error:
        return str(error)


class _InlineExecutor:
    """The pool's interface, run in this process (workers=0)."""

    def submit(self, function: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(function(*args))
        except BaseException as error:
            future.set_exception(error)
        return future

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


class EncodePool:
    """Runs plan/encode tasks with priorities; at most `in_flight` tasks sit in the pool."""

    def __init__(self, spec: EncoderSpec, workers: int) -> None:
        self.workers = workers
        if workers > 0:
            self._executor: Any = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(spec,),
            )
        else:
            _init_worker(spec)
            self._executor = _InlineExecutor()
        self._in_flight = max(2, 2 * workers)
        self._queue: list[tuple[int, int, Callable[..., Any], tuple[Any, ...], Future]] = []
        self._order = itertools.count()
        self._condition = threading.Condition()
        self._running = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        if workers > 0:
            self._thread = threading.Thread(target=self._dispatch, name="clef-encode-dispatch", daemon=True)
            self._thread.start()

    def submit(self, priority: int, function: Callable[..., Any], *args: Any) -> Future:
        if self.workers == 0:
            return self._executor.submit(function, *args)
        result: Future = Future()
        with self._condition:
            heapq.heappush(self._queue, (priority, next(self._order), function, args, result))
            self._condition.notify()
        return result

    def plan(self, record: Record) -> Future:
        return self.submit(BACKGROUND, plan_record, record)

    def encode(self, record: Record) -> Future:
        return self.submit(URGENT, encode_record, record)

    def _dispatch(self) -> None:
        while True:
            with self._condition:
                while not self._closed and (not self._queue or self._running >= self._in_flight):
                    self._condition.wait()
                if self._closed:
                    return
                _, _, function, args, result = heapq.heappop(self._queue)
                self._running += 1
            if not result.set_running_or_notify_cancel():
                self._finished()
                continue
            try:
                inner = self._executor.submit(function, *args)
            except RuntimeError as error:  # the pool broke (a worker died)
                result.set_exception(error)
                self._finished()
                continue
            inner.add_done_callback(lambda done, result=result: self._relay(done, result))

    def _relay(self, done: Future, result: Future) -> None:
        error = done.exception()
        if error is not None:
            result.set_exception(error)
        else:
            result.set_result(done.result())
        self._finished()

    def _finished(self) -> None:
        with self._condition:
            self._running -= 1
            self._condition.notify()

    def close(self) -> None:
        with self._condition:
            self._closed = True
            for *_, pending in self._queue:
                pending.cancel()
            self._queue.clear()
            self._condition.notify_all()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> EncodePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
