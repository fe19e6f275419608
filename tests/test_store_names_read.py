"""What a manifest names, read back (store/remote/segments.py `Segment.read`, `_hidden_place`;
manifests.py `Manifest.read`): every field a writer writes comes back as written, an entry of an
older writer (no level, no hidden states) reads with the defaults it meant, and a name no writer
gives is refused with the entry's id cut to 80 characters. Pure functions: no bucket."""

from __future__ import annotations

import json

import pytest

from clef_cli.errors import ClefError
from clef_cli.store.checkpoint import ShardEntry
from clef_cli.store.remote.manifests import Manifest
from clef_cli.store.remote.segments import SEGMENTS, Segment, _hidden_place

ID = "0123456789abcdef" * 2
OTHER = "fedcba9876543210" * 2


def segment(**changed) -> Segment:
    hidden = (f"{SEGMENTS}{ID}.hidden", f"{SEGMENTS}{OTHER}.hidden")
    values = dict(id=ID, records=9, keys_bytes=288, results=f"{SEGMENTS}{ID}.results", results_bytes=4000,
                  hidden=hidden, hidden_bytes=123456, parts=3, level=2)  # fmt: skip
    return Segment(**(values | changed))


def test_a_segment_reads_back_as_written_and_an_older_entry_with_its_defaults():
    written = segment()
    assert Segment.read(ID, written.described()) == written
    older = {key: value for key, value in written.described().items() if key not in ("hidden", "hidden_bytes", "level")}
    assert Segment.read(ID, older) == segment(hidden=(), hidden_bytes=0, level=0)
    assert Segment.read(ID, older | {"hidden": None}).hidden == ()


@pytest.mark.parametrize("name", ["../elsewhere.hidden", f"s3://b/{SEGMENTS}{ID}.hidden", f"{SEGMENTS}{ID}.keys"])
def test_a_name_no_writer_gives_is_refused_naming_the_entry(name):
    with pytest.raises(ValueError) as refused:
        Segment.read(ID, segment().described() | {"hidden": [name]})
    assert str(refused.value) == f"segment {ID!r} names objects no clef store writes"
    long = "x" * 100
    with pytest.raises(ValueError) as refused:
        Segment.read(long, segment().described())
    assert str(refused.value) == f"segment {'x' * 80!r} names objects no clef store writes"


def test_a_manifest_reads_back_its_writer_and_an_older_one_none():
    manifest = Manifest(7, {"model": "m"}, {ID: segment()}, {"run": {"started": 1.0}}, None, writer="a1b2")
    body = manifest.body()
    assert Manifest.read(json.dumps(body).encode(), "m7") == manifest
    del body["writer"]
    assert Manifest.read(json.dumps(body).encode(), "m7").writer == ""
    with pytest.raises(ClefError, match=r"^m7 is unreadable: "):
        Manifest.read(json.dumps(body | {"segments": {ID: {"records": 1}}}).encode(), "m7")


def test_a_ray_actors_hidden_states_are_read_from_its_own_object_whole():
    def entry(files: dict) -> ShardEntry:
        return ShardEntry("00001", 4, files, "run")

    uploaded = {"hidden": {"name": "h", "object": "uploads/a.hidden", "bytes": 77, "crc32": 9}}
    assert _hidden_place(entry(uploaded), "segments/x.hidden", None) == ("uploads/a.hidden", 0, 77, 9)
    packed = {"hidden": {"name": "h", "bytes": 77, "crc32": 9}}
    assert _hidden_place(entry(packed), "segments/x.hidden", (10, 77, 9)) == ("segments/x.hidden", 10, 77, 9)
    assert _hidden_place(entry({}), "segments/x.hidden", None) is None
