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
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clef_cli import faults
from clef_cli.choices import OverflowPolicy
from clef_cli.encoding.batching import casts_with_model
from clef_cli.encoding.encoded import EncodedRecord
from clef_cli.encoding.media import MediaLimits, set_decode_threads
from clef_cli.encoding.prompt import PromptEncoder
from clef_cli.errors import RecordError
from clef_cli.inputs.records import Record
from clef_cli.model.dtypes import torch_dtype

URGENT, BACKGROUND = 0, 1


@dataclass(frozen=True)
class EncoderSpec:
    """Everything a worker process needs to build its own `PromptEncoder` (picklable)."""

    release_path: Path
    max_length: int
    overflow: OverflowPolicy
    limits: MediaLimits
    spool: Path | None = None
    """Where planning leaves each record's media tensors, so the batch that runs it later need
    not decode its media again; None drops them (a dry run)."""
    family: str = "omni"
    decode_threads: int = 1
    """FFmpeg threads per video decoder in each worker (more than one when cores are left over)."""
    media_dtype: str | None = None
    """The model's compute dtype when it is not float32: floating media are cast to it in the
    worker (the same rounding as the model's own cast), so half the bytes travel and spool."""
    images_from_headers: bool = False
    """Plan image records from their headers (their token count depends only on their size) and
    decode them once, when their batch is made; a dry run decodes them to check them."""

    def build(self) -> PromptEncoder:
        from clef_cli.families import family_named
        from clef_cli.release import Release, load_processor

        release = Release(path=self.release_path, model_id=str(self.release_path), revision=None, config={})
        family = family_named(self.family)
        return PromptEncoder(load_processor(release), self.max_length, self.overflow, self.limits, family)


@dataclass(frozen=True)
class Planned:
    """A planned record: its length, or why it cannot be scored, and its encoding (ids as int32).
    Media tensors never travel with it: they wait in a spool file (within a disk budget) until
    the record's batch runs, or, without one, the record is encoded again then."""

    record: Record
    length: int | None = None
    audio_in_video: bool = False
    error: str | None = None
    error_kind: str = "media"
    encoded: EncodedRecord | None = None
    spooled: Path | None = None
    spooled_bytes: int = 0
    seconds: float = 0.0
    """Time spent encoding it (for the job's encode rates)."""

    def ready(self) -> EncodedRecord | None:
        """The full encoding, media read back from the spool; None when it must be encoded again."""
        if self.encoded is None or not self.record.has_media:
            return self.encoded
        if self.spooled is None:
            return None
        from safetensors.torch import load_file

        return replace(self.encoded, media=load_file(str(self.spooled)))

    def discard(self) -> None:
        if self.spooled is not None:
            self.spooled.unlink(missing_ok=True)


_worker_encoder: PromptEncoder | None = None
_worker_spool: Path | None = None
_worker_media_dtype: torch.dtype | None = None
_worker_images_from_headers = False
_in_pool_worker = False


def _init_encoder(spec: EncoderSpec) -> None:
    global _worker_encoder, _worker_spool, _worker_media_dtype, _worker_images_from_headers
    set_decode_threads(spec.decode_threads)
    _worker_encoder = spec.build()
    _worker_spool = spec.spool
    _worker_images_from_headers = spec.images_from_headers
    _worker_media_dtype = torch_dtype(spec.media_dtype) if spec.media_dtype else None


def _exit_with_parent(parent: int, interval: float = 1.0) -> None:
    """A job killed outright (SIGKILL, the OOM killer) cannot stop its pool; its workers notice
    they were orphaned and exit instead of lingering with a model's worth of memory."""
    while os.getppid() == parent:
        time.sleep(interval)
    os._exit(1)


def _init_pool_worker(spec: EncoderSpec) -> None:
    """A background worker: one CPU thread for torch, and Ctrl-C left to the main process (which
    finishes its batch and stops the pool) instead of killing the worker mid-task."""
    import signal

    import torch

    global _in_pool_worker
    _in_pool_worker = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    torch.set_num_threads(1)
    _init_encoder(spec)


def _encoder() -> PromptEncoder:
    assert _worker_encoder is not None, "worker not initialised"
    return _worker_encoder


def worker_media_dtype() -> torch.dtype | None:
    """The dtype this worker casts floating media to (None: as the processor made them)."""
    return _worker_media_dtype


def in_pool_worker() -> bool:
    """True in a background encoding process (its results travel to the main process)."""
    return _in_pool_worker


def pad_token_id() -> int:
    return int(_encoder().processor.tokenizer.pad_token_id)


def compact(encoded: EncodedRecord) -> EncodedRecord:
    return replace(encoded, input_ids=np.asarray(encoded.input_ids, dtype=np.int32))


def plan_record(record: Record) -> Planned:
    """Measure the prompt: from the images' headers where they tell it (the batch decodes them),
    else by encoding it, its media tensors then going to the spool (when there is one)."""
    faults.maybe_crash(record.id)
    started = time.perf_counter()
    try:
        sketch = _encoder().plan(record) if _worker_images_from_headers else None
        encoded = sketch or _encoder().encode(record)
    except RecordError as error:
        return Planned(record, error=str(error), error_kind=error.kind or "media")
    faults.slow_encode()
    seconds = time.perf_counter() - started
    planned = Planned(record, encoded.length, encoded.use_audio_in_video, encoded=compact(encoded), seconds=seconds)
    if sketch is not None:
        return replace(planned, encoded=None)
    if not encoded.media:
        return planned
    if _worker_spool is None:
        return replace(planned, encoded=None)
    from safetensors.torch import save_file

    path = _worker_spool / f"{record.index}.safetensors"
    save_file({name: _cast(name, tensor).contiguous() for name, tensor in encoded.media.items()}, str(path))
    media_free = replace(planned.encoded, media={}) if planned.encoded is not None else None
    return replace(planned, encoded=media_free, spooled=path, spooled_bytes=path.stat().st_size)


def _cast(name: str, tensor: torch.Tensor) -> torch.Tensor:
    dtype = _worker_media_dtype
    return tensor.to(dtype) if dtype is not None and casts_with_model(name, tensor) else tensor


def within_budget(planned: Planned, budget: list[int]) -> Planned:
    """Keep a planned record's spooled media while `budget[0]` bytes remain; else drop them (the
    record is then encoded again when its batch runs)."""
    if planned.spooled is None:
        return planned
    if planned.spooled_bytes <= budget[0]:
        budget[0] -= planned.spooled_bytes
        return planned
    planned.discard()
    return replace(planned, encoded=None, spooled=None, spooled_bytes=0)


def encode_record(record: Record) -> EncodedRecord | tuple[str, str]:
    """The encoding, or (the error, its kind)."""
    faults.maybe_crash(record.id)
    try:
        encoded = compact(_encoder().encode(record))
    except RecordError as error:
        return str(error), error.kind or "media"
    faults.slow_encode()
    return encoded


CRASHED = "the encoding process crashed on this record (a media decoder failed hard)"


def planning_crashed(record: Record) -> Planned:
    return Planned(record, error=str(RecordError(record.id, "media", CRASHED)), error_kind="transient")


def encoding_crashed(record: Record) -> tuple[str, str]:
    return str(RecordError(record.id, "media", CRASHED)), "transient"


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


@dataclass(order=True)
class _Task:
    priority: int
    order: int
    function: Callable[[Any], Any] = field(compare=False)
    argument: Any = field(compare=False)
    """A record, or a batch's planned records."""
    crashed: Callable[[Any], Any] = field(compare=False)
    result: Future = field(compare=False)
    suspect: bool = field(default=False, compare=False)
    """It was in the pool when a worker died: it runs again alone, to tell culprit from bystander."""


class EncodePool:
    """Runs plan/encode tasks with priorities; at most `in_flight` tasks sit in the pool.

    A worker that dies (a media decoder crashing on a hostile file) breaks the process pool. The
    pool is then rebuilt and every task that was in it runs again alone: the one that crashes
    again is that record's error, the others are unaffected.
    """

    def __init__(self, spec: EncoderSpec, workers: int) -> None:
        self.spec = spec
        self.workers = workers
        self._in_flight = max(2, 2 * workers)
        self._queue: list[_Task] = []
        self._suspects: list[_Task] = []
        self._running: dict[int, _Task] = {}
        self._order = itertools.count()
        self._condition = threading.Condition()
        self._closed = False
        if workers > 0:
            self._executor: Any = self._new_executor()
            self._generation = 0
            threading.Thread(target=self._dispatch, name="clef-encode-dispatch", daemon=True).start()
        else:
            _init_encoder(spec)
            self._executor = _InlineExecutor()

    def _new_executor(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_pool_worker,
            initargs=(self.spec,),
        )

    def _submit(self, priority: int, function: Callable[[Any], Any], argument: Any, crashed: Any) -> Future:
        if self.workers == 0:
            return self._executor.submit(function, argument)
        task = _Task(priority, next(self._order), function, argument, crashed, Future())
        with self._condition:
            heapq.heappush(self._queue, task)
            self._condition.notify()
        return task.result

    def plan(self, record: Record) -> Future:
        return self._submit(BACKGROUND, plan_record, record, planning_crashed)

    def encode(self, record: Record) -> Future:
        return self._submit(URGENT, encode_record, record, encoding_crashed)

    def urgent(self, function: Callable[[Any], Any], argument: Any, crashed: Callable[[Any], Any]) -> Future:
        """Any work a batch about to run waits on (a module-level function, for pickling)."""
        return self._submit(URGENT, function, argument, crashed)

    def _next_task(self) -> _Task | None:
        """Under the lock: a suspect runs only when the pool is empty, and nothing runs beside it."""
        if self._suspects:
            return self._suspects.pop(0) if not self._running else None
        if self._queue and len(self._running) < self._in_flight:
            return heapq.heappop(self._queue)
        return None

    def _dispatch(self) -> None:
        while True:
            with self._condition:
                task = self._next_task()
                while not self._closed and task is None:
                    self._condition.wait()
                    task = self._next_task()
                if self._closed:
                    return
                assert task is not None
                if not task.suspect and not task.result.set_running_or_notify_cancel():
                    continue
                self._running[task.order] = task
                generation = self._generation
                executor = self._executor
            try:
                inner = executor.submit(task.function, task.argument)
            except (BrokenProcessPool, RuntimeError):  # broken, or replaced after a breakage
                inner = Future()
                inner.set_exception(BrokenProcessPool("the encoding pool was rebuilt"))
            inner.add_done_callback(lambda done, task=task, generation=generation: self._done(task, generation, done))

    def _done(self, task: _Task, generation: int, done: Future) -> None:
        with self._condition:
            self._running.pop(task.order, None)
            error = done.exception()
            if isinstance(error, BrokenProcessPool):
                if task.suspect:  # it crashed the pool again, alone: it is the culprit
                    task.result.set_result(task.crashed(task.argument))
                else:
                    task.suspect = True
                    self._suspects.append(task)
                if generation == self._generation:  # the first task to see this breakage rebuilds
                    self._generation += 1
                    self._executor.shutdown(wait=False, cancel_futures=True)
                    self._executor = self._new_executor()
            elif error is not None:
                task.result.set_exception(error)
            else:
                task.result.set_result(done.result())
            self._condition.notify_all()

    def close(self) -> None:
        with self._condition:
            self._closed = True
            for task in self._queue + self._suspects:
                task.result.cancel()
            self._queue.clear()
            self._suspects.clear()
            self._condition.notify_all()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> EncodePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
