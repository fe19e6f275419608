"""A keys object read back (store/remote/segments.py `read_parts`, `read_keys`) and the hidden
states' places a segment packs (`pack`): a file that is no keys object is damage naming the object
(or the file, when no object is given), never a raw Arrow error; the parts' hidden states lie one
after another in the segment's hidden object. The in-memory bucket where a writer is needed."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from clef_cli.store.remote.segments import DamagedObject, read_keys, read_parts

from .support.remote_stores import commit, fresh_machine, open_machine

STORE = "s3://clef-memory/keys/"


def arrow_file(path, table: pa.Table):
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return path


def test_a_file_that_is_no_keys_object_is_damage_named_by_the_object_or_the_file(tmp_path):
    other = arrow_file(tmp_path / "other.keys", pa.table({"name": ["a"]}))
    with pytest.raises(DamagedObject) as found:
        read_parts(other, "s3://b/store/segments/x.keys")
    said = "s3://b/store/segments/x.keys is no keys object of a clef store (not a keys object's columns)"
    assert str(found.value) == said
    assert found.value.obj == "s3://b/store/segments/x.keys"
    (tmp_path / "text.keys").write_text("not arrow at all")
    for read in (read_parts, lambda path: list(read_keys(path))):
        with pytest.raises(DamagedObject) as found:
            read(tmp_path / "text.keys")
        assert str(found.value).startswith("text.keys is no keys object of a clef store (") and found.value.obj == ""


def test_the_parts_hidden_states_lie_one_after_another_in_the_segments_object(memory, tmp_path):
    writer = open_machine(STORE, tmp_path / "w")
    commit(writer, range(0, 12), per_shard=4, with_hidden=True)
    writer.sync()
    writer.syncer.stop.set()
    writer.syncer.thread.join()
    writer.syncer = None
    writer.close()
    with fresh_machine(STORE, tmp_path / "r") as reader:
        places = sorted((entry.remote["hidden"] for entry in reader.entries), key=lambda place: place[1])
    assert len(places) == 3 and len({place[0] for place in places}) == 1
    offsets, sizes = [place[1] for place in places], [place[2] for place in places]
    assert offsets == [0, sizes[0], sizes[0] + sizes[1]] and all(size > 0 for size in sizes)
