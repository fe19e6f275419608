"""A long record text is cut before it is tokenized (issue 50, Deliver 4), and its ids are exactly
the first ids of the whole text (encoding/text_cut.py, docs/numerics.md): checked over hostile
texts (runs of whitespace, digits, combining marks, Hangul jamo, CJK, emoji, special-token
strings, newlines) for both fixture tokenizers, under both `--special-tokens` modes."""

from __future__ import annotations

import json
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from clef_cli.choices import SpecialTokens
from clef_cli.encoding.prompt import PromptEncoder, render
from clef_cli.encoding.record_text import SegmentTokenizer
from clef_cli.encoding.text_cut import WHOLE_CHARS, NoCut, TextCutter, analysed, nfc_safe, window_bytes
from clef_cli.errors import RecordError
from clef_cli.inputs.records import RecordBuilder

from .support.helpers import FIXTURES, TINY_MODEL

TOKENIZERS = (TINY_MODEL, FIXTURES / "tiny-clef-dense")
HOSTILE = (
    " ", "  ", "\n", "\r\n", "\r", "\t", "\u00a0", "\u3000", "\u2028", "1", "23", "\u0663", "\u00b2", "\u2163",
    "x", "word", "Hello", "\u00e9", "e\u0301", "=\u0338", "A\u030a", "\u0345", "\u0301", "\u093e", "\u0915\u094d",
    "'s", "'LL", "'", "\u017f", "\u212a", "\ufb05", "\u4e2d\u6587", "\uff0c", "\u3002", "\U0001f642",
    "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\ufe0f", "<|im_end|>", "<think>", "<|im",
    "end|>", "<", "|>", "\uac00", "\u1100\u1161\u11a8", "\u1161", "\u11a8", "!", "?!", "...", "#", "\u0378",
    "\U000e0001",
)  # fmt: skip
"""Pieces the cut must not be fooled by: whitespace and newlines of every kind, digits of other
scripts, precomposed and decomposed letters, marks that compose (`=` + U+0338 is `≠`), a mark
that case-folds to a letter (U+0345), contractions and their case-folded letters, CJK and its
punctuation, emoji with modifiers and joiners, added-token spellings whole and in halves, Hangul
syllables and jamo that compose, an unassigned code point."""
pieces = st.one_of(st.sampled_from(HOSTILE), st.text(min_size=1, max_size=3))
runs = st.tuples(pieces, st.sampled_from((1, 1, 1, 2, 3, 8, 40))).map(lambda run: run[0] * run[1])
texts = st.lists(runs, min_size=1, max_size=40).map("".join)


@cache
def segments(path: str, mode: str) -> SegmentTokenizer:
    return SegmentTokenizer(AutoTokenizer.from_pretrained(path), SpecialTokens(mode))


def whole_ids(segment: SegmentTokenizer, text: str) -> list[int]:
    return segment.record([text])[0]


@pytest.mark.parametrize("mode", ["text", "parse"])
@pytest.mark.parametrize("path", TOKENIZERS, ids=["omni", "dense"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts, most=st.integers(1, 60), whole_chars=st.integers(0, 12))
def test_the_ids_of_a_cut_text_are_the_whole_texts_first_ids(path, mode, text, most, whole_chars):
    segment = segments(str(path), mode)
    cutter = segment.cutter()
    assert cutter.supported
    try:
        ids, whole = cutter.leading(text, most, lambda part: whole_ids(segment, part), whole_chars=whole_chars)
    except NoCut:
        return  # refused, never a wrong id (checked on its own below)
    full = whole_ids(segment, text)
    if whole:
        assert ids == full
    else:
        assert len(ids) >= most and ids == full[: len(ids)]


@pytest.mark.parametrize("path", TOKENIZERS, ids=["omni", "dense"])
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts)
def test_every_certified_boundary_splits_the_ids(path, text):
    """The property itself, at every place the cutter would take: tokens(t) == tokens(t[:b]) +
    tokens(t[b:])."""
    segment = segments(str(path), "parse")
    cutter = segment.cutter()
    full = whole_ids(segment, text)
    for cut in range(1, len(text)):
        if cutter.certified(text, cut):
            assert whole_ids(segment, text[:cut]) + whole_ids(segment, text[cut:]) == full, (text[:cut], text[cut:])


@pytest.mark.parametrize("path", TOKENIZERS, ids=["omni", "dense"])
def test_every_certified_boundary_between_two_hostile_pieces_splits_the_ids(path):
    """Every ordered pair of hostile pieces, each once and repeated, between ordinary words."""
    segment = segments(str(path), "parse")
    cutter = segment.cutter()
    for first in HOSTILE:
        for second in HOSTILE:
            for text in (f"ab{first}{second}cd", f"{first * 2}{second * 2}"):
                cuts = [cut for cut in range(1, len(text)) if cutter.certified(text, cut)]
                if not cuts:
                    continue
                full = whole_ids(segment, text)
                pieces = segment.record([text[:cut] for cut in cuts] + [text[cut:] for cut in cuts])
                for number, cut in enumerate(cuts):
                    assert pieces[number] + pieces[len(cuts) + number] == full, (text[:cut], text[cut:])


def test_a_long_state_is_cut_before_it_is_tokenized_and_keeps_its_ids(processor):
    encoder = PromptEncoder(processor, max_length=300)
    state = {"post": " ".join(f"word{n} and more, line {n}\n" for n in range(6_000))}
    record = RecordBuilder().build({"id": "long", "state": state, "questions": {"q": {"type": "noul"}}}, 0, None)
    text = render(state)
    assert len(text) > 300 + WHOLE_CHARS  # the cut path
    seen: list[int] = []
    original = encoder.segments.record
    encoder.segments.record = lambda texts: seen.extend(len(t) for t in texts) or original(texts)
    encoded = encoder.encode(record)
    encoder.segments.record = original
    assert max(seen) < len(text) // 10  # the state was never tokenized whole
    start, stop = encoded.state_span
    full = encoder.segments.record([text])[0]
    assert encoded.input_ids[start:stop] == full[: stop - start]
    assert 0 < encoded.state_tokens_cut < len(full)  # counted over the part read: at least this many
    strict = PromptEncoder(processor, max_length=300, overflow="error")
    with pytest.raises(RecordError, match=r"state is more than \d+ tokens but only \d+ fit"):
        strict.encode(record)


def test_a_text_with_no_place_to_cut_is_the_records_overflow_not_tokenized_whole(processor):
    encoder = PromptEncoder(processor, max_length=300)
    state = "x" * (window_bytes(300) + 10)  # one word: no certified boundary
    record = RecordBuilder().build({"id": "run", "state": state, "questions": {"q": {"type": "noul"}}}, 0, None)
    with pytest.raises(Exception) as raised:
        encoder.encode(record)
    error = raised.value
    assert (error.record_id, error.field, error.kind) == ("run", "state", "overflow")
    assert "no place to cut" in error.message
    long_question = {"q": {"type": "noul", "instructions": "why " * 40_000}}
    record = RecordBuilder().build({"id": "schema", "state": "hi", "questions": long_question}, 0, None)
    with pytest.raises(Exception) as raised:
        encoder.encode(record)
    assert (raised.value.field, raised.value.kind) == ("questions", "overflow")
    assert "more than 300 tokens" in raised.value.message


def test_only_the_analysed_pipeline_is_cut():
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL)
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    assert analysed(spec)
    for change in ("normalizer", "pattern", "byte_level", "added"):
        other = json.loads(json.dumps(spec))
        if change == "normalizer":
            other["normalizer"] = {"type": "NFKC"}
        elif change == "pattern":
            other["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S+"
        elif change == "byte_level":
            other["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True
        else:
            other["added_tokens"][0]["lstrip"] = True
        assert not analysed(other), change
    assert not TextCutter(None).supported


def test_nfc_safety_of_characters():
    assert nfc_safe("a") and nfc_safe("\u4e2d") and nfc_safe("\uac00") and nfc_safe("\U0001f642")
    for char in ("\u0301", "\u0338", "\u1161", "\u11a8", "\u00e9", "\u212b", "\u0378", "\u0f73"):
        assert not nfc_safe(char), hex(ord(char))
