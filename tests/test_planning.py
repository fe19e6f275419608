"""Windows start small so the model starts early, then grow to --window."""

from __future__ import annotations

import itertools

from clef_cli.engines.local.planning import FIRST_WINDOW, window_sizes
from clef_cli.inputs.record_chunks import record_chunks as _chunks


def test_window_sizes_start_small_and_double_up_to_the_window():
    assert FIRST_WINDOW == 64
    assert list(itertools.islice(window_sizes(8192), 9)) == [64, 128, 256, 512, 1024, 2048, 4096, 8192, 8192]
    assert list(itertools.islice(window_sizes(100), 3)) == [64, 100, 100]
    assert list(itertools.islice(window_sizes(4), 2)) == [4, 4]


def test_chunks_follow_the_sizes_and_keep_every_item_in_order():
    chunks = list(_chunks(range(1000), window_sizes(300)))
    assert [len(chunk) for chunk in chunks] == [64, 128, 256, 300, 252]
    assert [item for chunk in chunks for item in chunk] == list(range(1000))
