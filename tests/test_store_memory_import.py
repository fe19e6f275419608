"""A fresh machine imports another machine's segments (store/remote/cache.py `Cache._import`), in
process against the in-memory bucket: only the keys objects are downloaded (counted, byte for
byte), the writer's run is the one the imported keys belong to, and a keys object that is gone or
holds other bytes than its name was made of sets its segment aside with the reason written out."""

from __future__ import annotations

import json

import obstore
import pytest

from clef_cli.store.remote.cache import MARK
from clef_cli.store.remote.layout import manifest_name

from .support.remote_stores import fresh_machine, key_of
from .test_store_memory_cache import PREFIX, SIZE, STORE, stored_keys, three_segments


def set_aside(checkpoint) -> dict:
    return json.loads((checkpoint.path / MARK).read_text(encoding="utf-8")).get("set_aside", {})


def test_a_fresh_machine_downloads_the_keys_objects_alone_and_keeps_the_writers_run(memory, tmp_path):
    segments = three_segments(tmp_path)
    sizes = [len(bytes(obstore.get(memory, PREFIX + segment.keys).bytes())) for segment in segments]
    assert sizes == [segment.keys_bytes for segment in segments]
    with fresh_machine(STORE, tmp_path / "writer-again") as writer_side:
        written_runs = [run["run_id"] for run in writer_side.index.runs(count_keys=False)]
    with fresh_machine(STORE, tmp_path / "fresh") as reader:
        assert reader.cache.downloaded == sum(sizes)
        assert [run["run_id"] for run in reader.index.runs(count_keys=False)] == written_runs
        assert len(written_runs) == 1
        assert stored_keys(reader) == {key_of(n) for n in range(3 * SIZE)}


@pytest.mark.parametrize("how", ["deleted", "other bytes"])
def test_a_keys_object_gone_or_not_its_name_sets_its_segment_aside(memory, tmp_path, how):
    segments = three_segments(tmp_path)
    lost = segments[1]
    if how == "deleted":
        obstore.delete(memory, PREFIX + lost.keys)
        cause = "is missing"
    else:
        obstore.put(memory, PREFIX + lost.keys, bytes(obstore.get(memory, PREFIX + segments[0].keys).bytes()))
        cause = "is damaged (its bytes are not those its name was made of)"
    with fresh_machine(STORE, tmp_path / "fresh") as reader:
        assert set_aside(reader) == {lost.id: f"{STORE}{lost.keys} (named by {STORE}{manifest_name(3)}) {cause}"}
        assert stored_keys(reader) == {key_of(n) for n in (*range(0, SIZE), *range(2 * SIZE, 3 * SIZE))}
