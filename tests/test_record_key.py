"""The record key (store/record_key.py): records with equal keys encode to identical prompts and
media tensors, and every prompt-shaping change (a field, a setting, a media file's bytes at the
same path) changes the key. The id and the position never do."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clef_cli.encoding.media import MediaLimits
from clef_cli.encoding.prompt import PromptEncoder
from clef_cli.inputs.records import RecordBuilder
from clef_cli.store.record_key import MediaHasher, PromptShape, prompt_digest, record_key

from .support.helpers import MEDIA, TINY_MODEL

STATES = ["hello", {"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}, "1", 1, "ünïcode"]
"""Two of these render alike ({"a","b"} in either key order; "1" and 1): equal prompts, equal keys."""
INSTRUCTIONS = [None, "", "Is it urgent?", {"text": "Is it urgent?"}]
CRITERIA = [
    {"yes": "It is", "no": "It is not"},
    {"no": "It is not", "yes": "It is"},
    {"yes": "It is", "no": None},
    {"yes": "It is", "no": "It is not", "maybe": "Unclear"},
]


@pytest.fixture(scope="module")
def media_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("media")
    shutil.copy(MEDIA / "image_a.png", folder / "a.png")
    shutil.copy(MEDIA / "image_a.png", folder / "a-copy.png")
    shutil.copy(MEDIA / "image_b.png", folder / "b.png")
    data_url = "data:;base64," + base64.b64encode((MEDIA / "image_a.png").read_bytes()).decode()  # judged by content
    return folder, ["a.png", "a-copy.png", str(folder / "a.png"), data_url, "b.png"]


@pytest.fixture(scope="module")
def encoder(processor):
    return PromptEncoder(processor, max_length=4096)


def prompt(
    max_length: int = 4096, overflow: str = "truncate", limits: MediaLimits | None = None, special_tokens: str = "text"
) -> PromptShape:
    return prompt_digest(TINY_MODEL, "omni", max_length, overflow, limits or MediaLimits(), special_tokens)


def _injected(raw: dict, field: str, token: str) -> dict:
    question = dict(raw["questions"]["q"])
    if field == "state":
        return {**raw, "state": {"text": "late " + token}}
    if field == "instructions":
        question["instructions"] = "Is it urgent?" + token
    else:
        question["criteria"] = {**question["criteria"], "x" + token: "a hidden option"}
    return {**raw, "questions": {**raw["questions"], "q": question}}


def build(raw: dict, folder: Path, index: int = 0):
    record = RecordBuilder(check_duplicates=False).build(raw, index, folder)
    assert not hasattr(record, "error"), record
    return record


def raw_record(state, instructions, criteria, images, kind="choice", record_id="r") -> dict:
    question = {"type": kind, "instructions": instructions}
    if kind == "choice":
        question["criteria"] = criteria
    return {"id": record_id, "state": state, "questions": {"q": question, "n": {"type": "noul"}}, "images": images}


def same_encoding(a, b) -> bool:
    if list(a.input_ids) != list(b.input_ids) or a.questions != b.questions:
        return False
    if set(a.media) != set(b.media):
        return False
    return all(torch.equal(a.media[name], b.media[name]) for name in a.media)


record_parts = st.tuples(
    st.sampled_from(range(len(STATES))),
    st.sampled_from(range(len(INSTRUCTIONS))),
    st.sampled_from(range(len(CRITERIA))),
    st.lists(st.sampled_from(range(5)), max_size=1),
    st.sampled_from(["choice", "noul"]),
    st.text(max_size=5),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=record_parts, second=record_parts)
def test_equal_keys_mean_identical_prompts_and_media(encoder, media_files, first, second):
    folder, images = media_files
    digest, hasher = prompt(), MediaHasher(MediaLimits())
    records = []
    for position, (state, instructions, criteria, chosen, kind, record_id) in enumerate((first, second)):
        raw = raw_record(
            STATES[state], INSTRUCTIONS[instructions], CRITERIA[criteria], [images[i] for i in chosen], kind, record_id
        )
        records.append(build(raw, folder, index=position * 7))
    keys = [record_key(record, digest, hasher) for record in records]
    encoded = [encoder.encode(record) for record in records]
    if keys[0] == keys[1]:
        assert same_encoding(*encoded)
    if not same_encoding(*encoded):
        assert keys[0] != keys[1]


def test_every_prompt_shaping_change_changes_the_key(media_files):
    folder, images = media_files
    hasher = MediaHasher(MediaLimits())
    base = raw_record({"text": "late refund"}, "Is it urgent?", CRITERIA[0], [images[0]])
    key = record_key(build(base, folder), prompt(), hasher)
    variants = [
        {**base, "state": {"text": "late refund!"}},
        {**base, "images": [images[4]]},
        {**base, "images": []},
        {**base, "images": [images[0], images[0]]},
        {**base, "questions": {"q": {**base["questions"]["q"], "instructions": "Is it late?"}, "n": {"type": "noul"}}},
        {**base, "questions": {"n": {"type": "noul"}, "q": base["questions"]["q"]}},
        {**base, "questions": {"q": {**base["questions"]["q"], "criteria": CRITERIA[1]}, "n": {"type": "noul"}}},
        {**base, "questions": {"q": base["questions"]["q"], "n": {"type": "noul", "criteria": {"true": "Yes"}}}},
    ]
    for variant in variants:
        assert record_key(build(variant, folder), prompt(), hasher) != key, variant
    record = build(base, folder)
    others = (prompt(max_length=2048), prompt(overflow="error"), prompt(limits=MediaLimits(max_image_pixels=10)))
    for other in others:
        assert record_key(record, other, hasher) != key
    # the special-token mode shapes only a prompt whose text holds an added-token string
    assert record_key(record, prompt(special_tokens="parse"), hasher) == key
    for field in ("state", "instructions", "criteria"):
        injected = build(_injected(base, field, "<|im_end|>"), folder)
        assert record_key(injected, prompt(special_tokens="parse"), hasher) != record_key(injected, prompt(), hasher)
    unknown = PromptShape(prompt().digest, None)  # a release whose added tokens clef cannot list
    assert record_key(record, unknown, hasher) != key
    # never the id or the position
    assert record_key(build({**base, "id": "other"}, folder, index=99), prompt(), hasher) == key


def test_the_key_follows_media_bytes_not_paths(tmp_path, media_files):
    _, images = media_files
    shutil.copy(MEDIA / "image_a.png", tmp_path / "x.png")
    raw = raw_record("s", None, CRITERIA[0], ["x.png"])
    before = record_key(build(raw, tmp_path), prompt(), MediaHasher(MediaLimits()))
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(MEDIA / "image_a.png", moved / "x.png")
    assert record_key(build(raw, moved), prompt(), MediaHasher(MediaLimits())) == before
    data_url = build(raw_record("s", None, CRITERIA[0], [images[3]]), tmp_path)
    assert record_key(data_url, prompt(), MediaHasher(MediaLimits())) == before
    typed = build(
        raw_record("s", None, CRITERIA[0], ["data:image/png;base64," + images[3].partition(",")[2]]), tmp_path
    )
    assert record_key(typed, prompt(), MediaHasher(MediaLimits())) != before  # a declared type is checked, so keyed
    shutil.copy(MEDIA / "image_b.png", tmp_path / "x.png")  # same path, other bytes
    assert record_key(build(raw, tmp_path), prompt(), MediaHasher(MediaLimits())) != before


def test_processor_files_are_part_of_the_key(tmp_path):
    release = tmp_path / "release"
    shutil.copytree(TINY_MODEL, release)
    limits = MediaLimits()
    before = prompt_digest(release, "omni", 4096, "truncate", limits, "text")
    config = release / "tokenizer_config.json"
    config.write_text(config.read_text().replace("{", '{"clef_test": 1, ', 1))
    assert prompt_digest(release, "omni", 4096, "truncate", limits, "text") != before
