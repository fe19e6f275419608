"""Commits on a background thread, so writing shards (hidden states are large) overlaps the
next forward, while the journal still reads as if every commit had been made inline."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from clef_cli.results import FailedRecord, ScoredRecord, results_table
from clef_cli.store.checkpoint import Checkpoint


class BackgroundCommitter:
    """Commits shards on a thread, so writing hidden states to disk overlaps the next forward;
    the results' table is built there too (it costs the main thread, which launches forwards,
    tens of milliseconds a batch).

    At most `depth` commits wait; a failed commit is raised on the next `submit` or on `drain`.
    Commits land in submission order, so the journal reads as if they were made inline.
    """

    def __init__(self, checkpoint: Checkpoint, depth: int = 2) -> None:
        self.checkpoint = checkpoint
        self._queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="clef-commit", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            scored, failed, hidden, committed = item
            try:
                if self._error is None:
                    self.checkpoint.commit(results_table(scored, failed), hidden)
                    committed()
            except BaseException as error:
                self._error = error
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def submit(
        self, scored: list[ScoredRecord], failed: list[FailedRecord], hidden: Any, committed: Callable[[], None]
    ) -> None:
        self._raise()
        self._queue.put((scored, failed, hidden, committed))

    def drain(self) -> None:
        self._queue.join()
        self._raise()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
