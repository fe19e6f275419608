"""The feeder thread: the stream in order, batches prepared at most `depth` ahead of the main
thread, the stream's errors raised on the main thread, leftovers handed back on close."""

from __future__ import annotations

import threading
import time

import pytest

from clef_cli.encoding.batching import PlanEntry, PlannedBatch
from clef_cli.engines.local.batch_feed import BatchFeed


def _batch(index: int) -> PlannedBatch:
    return PlannedBatch((PlanEntry(index, 10),))


def _until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_items_arrive_in_order_and_batches_are_prepared_at_most_depth_ahead():
    stream = ["window 1", _batch(0), _batch(1), _batch(2), "window 2", _batch(3), _batch(4)]
    prepared: list[int] = []
    feed = BatchFeed(stream, lambda batch: prepared.append(batch.indices[0]) or f"made {batch.indices[0]}", depth=2)
    _until(lambda: len(prepared) == 2)
    time.sleep(0.2)
    assert prepared == [0, 1]  # the third waits for room
    got = [feed.next()]
    assert got == ["window 1"]
    got.append(feed.next())  # taking batch 0 makes room for batch 2
    _until(lambda: len(prepared) == 3)
    while (item := feed.next()) is not None:
        got.append(item)
    assert got == [
        "window 1",
        (_batch(0), "made 0"),
        (_batch(1), "made 1"),
        (_batch(2), "made 2"),
        "window 2",
        (_batch(3), "made 3"),
        (_batch(4), "made 4"),
    ]
    assert feed.next() is None  # the end stays the end
    assert feed.close() == []


def test_an_error_in_the_stream_is_raised_on_the_main_thread_after_what_came_before():
    def stream():
        yield _batch(0)
        raise OSError("the input file vanished")

    feed = BatchFeed(stream(), lambda batch: threading.current_thread().name, depth=3)
    assert feed.next() == (_batch(0), "clef-feed")  # prepared on the feeder thread
    with pytest.raises(OSError, match="vanished"):
        feed.next()


def test_close_stops_the_feeder_and_hands_back_what_was_made_but_not_taken():
    endless = (_batch(index) for index in range(10**9))
    feed = BatchFeed(endless, lambda batch: batch.indices[0], depth=2)
    _until(lambda: feed._queue.qsize() == 2)
    left = feed.close()
    assert [made for _, made in left] == [0, 1]
    feed._thread.join(timeout=10)
    assert not feed._thread.is_alive()
