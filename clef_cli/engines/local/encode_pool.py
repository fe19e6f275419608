"""Encoding in background processes while the model runs, through a bounded priority queue.

Two kinds of work share the pool: encoding the records of the batches about to run (urgent:
the GPU waits on them) and planning the next window (measuring prompt lengths). A dispatcher
keeps only a few tasks in the pool at once and always hands it the most urgent one, so planning
never delays a batch. With `workers=0` everything runs inline, in order. A window's records are
planned once their objects in a store are in the job's spool (`ObjectPrefetch`, started for the
whole window first), so no worker waits on the network.
"""

from __future__ import annotations

import heapq
import itertools
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from clef_cli.encoding.object_prefetch import ObjectPrefetch
from clef_cli.engines.local.workers import (
    EncoderSpec,
    encode_record,
    encoding_crashed,
    init_encoder,
    init_pool_worker,
    plan_record,
    planning_crashed,
)
from clef_cli.inputs.records import Record

URGENT, BACKGROUND = 0, 1


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

    def __init__(self, spec: EncoderSpec, workers: int, stop: threading.Event | None = None) -> None:
        self.spec = spec
        self.workers = workers
        self._prefetch = ObjectPrefetch(spec.limits, stop)
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
            init_encoder(spec)
            self._executor = _InlineExecutor()

    def _new_executor(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=init_pool_worker,
            initargs=(self.spec,),
        )

    def _submit(
        self, priority: int, function: Callable[[Any], Any], argument: Any, crashed: Any, result: Future | None = None
    ) -> Future:
        if self.workers == 0:
            return self._executor.submit(function, argument)
        task = _Task(priority, next(self._order), function, argument, crashed, result or Future())
        with self._condition:
            if self._closed:  # a window's record whose objects arrived as the pool closed
                task.result.cancel()
                return task.result
            heapq.heappush(self._queue, task)
            self._condition.notify()
        return task.result

    def plan(self, record: Record) -> Future:
        return self._submit(BACKGROUND, plan_record, record, planning_crashed)

    def plan_window(self, records: list[Record]) -> list[Future]:
        """`plan` for each of a window's records once its objects are in the spool, the window's
        reads all started first; a future fails with `PrefetchStopped` after a stop request."""
        fetched = self._prefetch.records(records)
        return [self._plan_after(record, ready) for record, ready in zip(records, fetched, strict=True)]

    def _plan_after(self, record: Record, ready: Future | None) -> Future:
        if ready is None:
            return self.plan(record)
        if self.workers == 0:  # planned inline on this thread, never on a read's
            if (error := ready.exception()) is not None:
                failed: Future = Future()
                failed.set_exception(error)
                return failed
            return self.plan(record)
        planned: Future = Future()
        ready.add_done_callback(lambda done: self._plan_read(record, done, planned))
        return planned

    def _plan_read(self, record: Record, ready: Future, planned: Future) -> None:
        """On the thread that finished the record's last read: its planning queued, into `planned`."""
        if (error := ready.exception()) is not None:
            planned.set_exception(error)
        else:
            self._submit(BACKGROUND, plan_record, record, planning_crashed, planned)

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
        self._prefetch.close()  # outside the lock: its reads' callbacks queue plans here
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
