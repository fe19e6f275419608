"""Batches handed to the encoding workers by a feeder thread, so they never wait for the main one.

The main thread spends its time in forwards (on a GPU, launching them and waiting for them). Had
it also to hand the next batches to the workers, a worker that finished early would sit idle
until the forward ended, and at each planning window's start the model would wait for a whole
batch to be encoded (issue 24). A feeder thread walks the job's stream instead: it waits for each
window's planning, hands each batch to the workers as soon as fewer than `depth` batches are
waiting to run, and queues everything, in order, for the main thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from clef_cli.encoding.batching import PlannedBatch

Made = TypeVar("Made")
_END = object()


class _Raised:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class BatchFeed(Generic[Made]):
    """The stream's items in order, each `PlannedBatch` as `(batch, prepare(batch))`."""

    def __init__(self, stream: Iterable[Any], prepare: Callable[[PlannedBatch], Made], depth: int) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._room = threading.Semaphore(depth)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._feed, args=(stream, prepare), name="clef-feed", daemon=True)
        self._thread.start()

    def _feed(self, stream: Iterable[Any], prepare: Callable[[PlannedBatch], Made]) -> None:
        try:
            for item in stream:
                if isinstance(item, PlannedBatch):
                    self._room.acquire()
                    if self._closed.is_set():
                        return
                    item = (item, prepare(item))
                self._queue.put(item)
                if self._closed.is_set():
                    return
        except BaseException as error:  # raised again on the main thread, by next()
            self._queue.put(_Raised(error))
        finally:
            self._queue.put(_END)

    def next(self) -> Any:
        """The next item (waiting for it), or None at the end; a batch taken frees room for another."""
        item = self._queue.get()
        if item is _END:
            self._queue.put(_END)
            return None
        if isinstance(item, _Raised):
            raise item.error
        if isinstance(item, tuple):
            self._room.release()
        return item

    def close(self) -> list[Any]:
        """Stop feeding; the items made but never taken (to cancel)."""
        self._closed.set()
        self._room.release()
        left = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return left
            if isinstance(item, tuple):
                left.append(item)
