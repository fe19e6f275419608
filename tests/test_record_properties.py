"""A property: whatever wrong JSON type (or text that is not Unicode) sits at whatever field of a
record, that record alone fails, with an error naming it and the field; every other record of the
job is scored. Each example is one scoring job (the library's ScoreJob, the session's one loaded
model), with a few records changed at random among good ones; derandomized, so every run tries
the same examples."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clef_cli.engines.local.pipeline import ScoreJob
from clef_cli.errors import UNEXPECTED

from .support.helpers import settings_for

QUESTIONS = {
    "ok": {"type": "noul", "instructions": "Fine?"},
    "team": {"type": "choice", "instructions": "Who?", "criteria": {"billing": "Payments", "tech": None}},
    "level": {"type": "score", "criteria": ["low", "mid", "high"]},
}

lone = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
unencodable = st.builds(lambda a, b, c: a + b + c, st.text(max_size=3), lone, st.text(max_size=3))
scalar = st.one_of(st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.floats(), st.text(max_size=6))
KINDS = {
    "null": st.none(),
    "bool": st.booleans(),
    "int": st.integers(-(10**6), 10**6),
    "float": st.floats(allow_nan=True, allow_infinity=True),
    "text": st.text(max_size=6),
    "array": st.lists(scalar, max_size=3),
    "object": st.dictionaries(st.text(max_size=4), scalar, max_size=3),
}


def kinds(*names: str) -> st.SearchStrategy:
    return st.one_of(*(KINDS[name] for name in names))


def hidden_in(value: st.SearchStrategy) -> st.SearchStrategy:
    """`value` as is, or inside an object or an array (so the bad text sits deeper)."""
    return st.one_of(value, st.builds(lambda v: {"x": [1, v]}, value), st.builds(lambda v: [v], value))


# (field path, the field its error names, wrong values). Values that the rules accept (a falsy
# noul criteria means the defaults, `instructions` may be any JSON) are not among them.
MUTATIONS: list[tuple[tuple[Any, ...], str, st.SearchStrategy]] = [
    (("id",), "id", st.one_of(kinds("bool", "float", "array", "object"), unencodable)),
    (("state",), "state", st.one_of(st.none(), hidden_in(unencodable))),
    (("questions",), "questions", st.one_of(kinds("null", "bool", "int", "float", "text", "array"), st.just({}))),
    (("questions", "team"), "questions.team", kinds("null", "bool", "int", "float", "text", "array")),
    (
        ("questions", "team", "type"),
        "questions.team.type",
        st.one_of(kinds("bool", "int", "float", "array", "object"), unencodable, st.sampled_from(["", "rank", "Noul"])),
    ),
    (("questions", "team", "instructions"), "questions.team.instructions", hidden_in(unencodable)),
    (
        ("questions", "ok", "criteria"),
        "questions.ok.criteria",
        st.one_of(
            st.just(True),
            st.integers(1, 10**6),
            st.text(min_size=1, max_size=5),
            st.lists(st.integers(), min_size=1, max_size=3),
            st.builds(lambda text: {"true": text}, hidden_in(unencodable)),
        ),
    ),
    (
        ("questions", "team", "criteria"),
        "questions.team.criteria",
        st.one_of(
            kinds("null", "bool", "int", "float", "text", "array"),
            st.just({}),
            st.builds(lambda text: {"a": text}, hidden_in(unencodable)),
            st.builds(lambda key: {key: None}, unencodable),
        ),
    ),
    (
        ("questions", "level", "criteria"),
        "questions.level.criteria",
        st.one_of(
            kinds("null", "bool", "int", "float", "text", "object"),
            st.just([]),
            st.builds(lambda text: ["low", text], hidden_in(unencodable)),
        ),
    ),
    (("questions", "level", "criteria", 0), "questions.level.criteria[0]", hidden_in(unencodable)),
    (("images",), "images", kinds("bool", "int", "float", "text", "object")),
    (("audio",), "audio", kinds("bool", "int", "float", "text", "object")),
    (("videos",), "videos", kinds("bool", "int", "float", "text", "object")),
    (("images", 0), "images[0]", st.one_of(kinds("null", "bool", "int", "float", "array", "object"), st.just(""))),
    (("audio", 0), "audio[0]", st.one_of(kinds("null", "bool", "int", "float", "array", "object"), unencodable)),
    (("videos", 0), "videos[0]", st.one_of(kinds("null", "bool", "int", "float", "array", "object"), unencodable)),
]


@dataclass(frozen=True)
class Change:
    path: tuple[Any, ...]
    field: str
    value: Any


@st.composite
def changes(draw: st.DrawFn) -> Change | None:
    if draw(st.booleans()):
        return None
    path, field, values = draw(st.sampled_from(MUTATIONS))
    return Change(path, field, draw(values))


def record(index: int, change: Change | None) -> dict[str, Any]:
    base: dict[str, Any] = {"id": f"r{index}", "state": {"n": index, "text": "ticket " * index}}
    base["questions"] = json.loads(json.dumps(QUESTIONS))
    if change is None:
        return base
    path = change.path
    if path[0] in ("images", "audio", "videos") and len(path) == 2:
        base[path[0]] = [None]
    target = base
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = change.value
    return base


@settings(
    max_examples=6,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(changes(), min_size=2, max_size=9))
def test_a_wrong_value_anywhere_fails_only_its_record(scorer, drawn):
    items = [None, *drawn]  # the first record is always good
    records = [record(index, change) for index, change in enumerate(items)]
    with tempfile.TemporaryDirectory() as folder:
        inputs = Path(folder) / "in.jsonl"
        inputs.write_text("".join(json.dumps(item) + "\n" for item in records), encoding="ascii")
        job_settings = settings_for(Path(folder), inputs=[inputs], hidden_states="drop", max_length=4096)
        summary = ScoreJob(job_settings, scorer=scorer).run()
        rows = pq.read_table(job_settings.output).to_pylist()
    bad = [change is not None for change in items]
    assert (summary.scored, summary.failed) == (bad.count(False), bad.count(True))
    assert [row["record_index"] for row in rows] == list(range(len(items)))
    for index, (row, change) in enumerate(zip(rows, items, strict=True)):
        if change is None:
            assert row["error"] is None and row["answers"], row["error"]
            continue
        row_id = None if change.field == "id" else f"r{index}"  # an id that cannot be read: null
        assert row["id"] == row_id
        assert row["answers"] is None
        named = f"record at index {index}" if row_id is None else f"record {row_id!r}"
        assert row["error"].startswith(f"{named}, field '{change.field}"), (change, row["error"])
        assert UNEXPECTED not in row["error"]
