"""A record's text cut short before it is tokenized, at a place that keeps its first tokens exact.

DESIGN §3 cuts the state to its first `max_length - fixed` tokens. Tokenizing a 40 MiB state whole
to keep 64,000 of its tokens cost about 200 bytes of memory a byte of text, so a long text is cut
first, at a certified boundary `b`: a place where, whatever the text holds after it,

    tokens(text) == tokens(text[:b]) + tokens(text[b:])

so the tokens of `text[:b]` are exactly the whole text's first ones. The Qwen tokenizers of both
families normalise with NFC, split pre-tokens with one regular expression (`QWEN_SPLITS`; a
"word" there is `\\p{L}+`, or `[\\p{L}\\p{M}]+` in Qwen3.5's), map bytes (ByteLevel, no expression
of its own) and run BPE inside each pre-token; `b` is certified when

1. NFC does not act across `b`: the characters on both sides are NFC-safe (`nfc_safe`: assigned,
   combining class 0, no canonical decomposition, never the second of a composed pair). NFC
   reorders only runs of non-starters and composes a character only into the last starter before
   it, so a starter that composes with nothing before it splits it: NFC(t) == NFC(t[:b]) +
   NFC(t[b:]), and both characters stay as they are.
2. The expression splits at `b` whatever follows: the character before `b` is a number (only the
   one-character `\\p{N}` alternative consumes one, so no match started before `b` reads past
   it), or it is a word character and the one at `b` is not (every test a match started before
   `b` can make at `b` is then the word class or a contraction's letter, which fails for that
   character exactly as it fails at the end of the text; the one test that succeeds at the end,
   `(?!\\S)`, comes only after whitespace). Every character is matched by some alternative, so no
   gap between matches spans `b`, and the expression looks neither behind nor at anchors, so the
   matches from `b` on are those of `text[b:]`. The classes are asked of the tokenizer's own
   pre-tokenizer (`_kind`), never of Python's Unicode tables.
3. No added token (`<|im_end|>`...) spans `b`: they are found in the raw text before all else.
4. BPE never merges across pre-tokens, so the ids of the pieces before `b` are unchanged.

A long text is cut at the last certified boundary of a window that doubles until the part holds
`most` tokens. docs/numerics.md gives the argument in full; tests/test_text_cut.py checks it over
hostile texts for both fixture tokenizers. A tokenizer whose pipeline differs from the one argued
about (`analysed`) has its texts tokenized whole, as before.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable
from functools import cache
from typing import Any

QWEN_SPLITS = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",
)
"""The pre-tokenizer expressions of the Qwen2/Qwen3 tokenizers (Clef-Omni) and of Qwen3.5's (the
dense family), where a word is letters (`\\p{L}`) or letters and marks (`[\\p{L}\\p{M}]`): the
expressions the argument above is about."""
WHOLE_CHARS = 4096
"""Texts up to `most` plus this many characters are tokenized whole, as always (nearly every state)."""
WINDOW_BYTES = 512 << 10
"""The least UTF-8 size the window may grow to before a text with no certified boundary in it is
refused (`NoCut`); at least 8 bytes a token kept, so 64,000 tokens of any real text fit."""
KINDS_CACHED = 1 << 16


class NoCut(Exception):
    """The text's first `limit` bytes hold no certified boundary to cut at after `most` tokens."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(limit)


@cache
def _second_of_pair() -> frozenset[str]:
    """Characters that may compose with the character before them under NFC (the second of a
    canonical pair; Hangul medial vowels and final consonants). A superset: excluded pairs too."""
    found = {chr(code) for code in range(0x1161, 0x1176)} | {chr(code) for code in range(0x11A8, 0x11C3)}
    for code in range(0x110000):
        mapping = unicodedata.decomposition(chr(code))
        if mapping and not mapping.startswith("<"):
            parts = mapping.split()
            if len(parts) == 2:
                found.add(chr(int(parts[1], 16)))
    return frozenset(found)


def nfc_safe(char: str) -> bool:
    """Whether NFC leaves `char` as it is and never composes it with the character before it.
    Combining class and canonical decompositions never change once a character is assigned, and
    no new composed pair can appear, so Python's Unicode tables answer this for every version a
    tokenizer may have (a character they do not know is not safe)."""
    if char.isascii():
        return True
    if unicodedata.category(char) in ("Cn", "Cs") or unicodedata.combining(char):
        return False
    mapping = unicodedata.decomposition(char)
    return (not mapping or mapping.startswith("<")) and char not in _second_of_pair()


def analysed(spec: dict[str, Any]) -> bool:
    """Whether a tokenizer's pipeline (its `tokenizer.json`) is the one the argument covers."""
    normalizer = spec.get("normalizer")
    if normalizer not in (None, {"type": "NFC"}):
        return False
    steps = (spec.get("pre_tokenizer") or {}).get("pretokenizers") or []
    if len(steps) != 2:
        return False
    split, byte_level = steps
    if split.get("type") != "Split" or (split.get("pattern") or {}).get("Regex") not in QWEN_SPLITS:
        return False
    if split.get("behavior") != "Isolated" or split.get("invert"):
        return False
    if byte_level.get("type") != "ByteLevel" or byte_level.get("add_prefix_space") or byte_level.get("use_regex"):
        return False
    added = spec.get("added_tokens") or []
    return not any(token.get(flag) for token in added for flag in ("normalized", "lstrip", "rstrip", "single_word"))


class TextCutter:
    """Cuts texts for one tokenizer (its fast backend); `supported` is False for a pipeline the
    argument does not cover, whose texts are then always tokenized whole."""

    def __init__(self, backend: Any | None) -> None:
        spec = json.loads(backend.to_str()) if backend is not None else {}
        self.supported = backend is not None and analysed(spec)
        self._pre_tokenizer = backend.pre_tokenizer if backend is not None else None
        self._added = tuple(token["content"] for token in spec.get("added_tokens") or [])
        self._added_chars = frozenset("".join(self._added))
        self._kinds: dict[str, str] = {}

    def leading(
        self, text: str, most: int, encode: Callable[[str], list[int]], whole_chars: int = WHOLE_CHARS
    ) -> tuple[list[int], bool]:
        """(ids, whole): the ids of the whole text (whole True), or of a part of it that holds at
        least `most` tokens, each one the whole text's own (whole False). A text of up to `most`
        + `whole_chars` characters is tokenized whole; a longer one in a window that doubles from
        twice that, cut at its last certified boundary, until the part holds `most` tokens.
        `NoCut` when the window passes `window_bytes(most)` first."""
        size = most + whole_chars
        if not self.supported or len(text) <= size:
            return encode(text), True
        limit = window_bytes(most)
        while True:
            size = min(2 * size, len(text))
            bytes_in_window = _utf8_size(text, size)
            if size == len(text) and bytes_in_window <= limit:
                return encode(text), True
            cut = self.boundary(text, size, size // 2)
            if cut is not None:
                ids = encode(text[:cut])
                if len(ids) >= most:
                    return ids, False
            if bytes_in_window > limit or size == len(text):
                raise NoCut(limit)

    def boundary(self, text: str, end: int, start: int) -> int | None:
        """The last certified boundary b with start < b <= end (and b < len(text)), or None."""
        for cut in range(min(end, len(text) - 1), max(start, 0), -1):
            if self.certified(text, cut):
                return cut
        return None

    def certified(self, text: str, cut: int) -> bool:
        """Whether tokenizing `text[:cut]` gives exactly the first tokens of `text` (0 < cut < len)."""
        before, after = text[cut - 1], text[cut]
        if not (nfc_safe(before) and nfc_safe(after)):
            return False
        kind = self._kind(before)
        if kind != "number" and not (kind == "word" and self._kind(after) != "word"):
            return False
        return not self._added_across(text, cut)

    def _kind(self, char: str) -> str:
        """`word`, `number` (\\p{N}) or `other`, as the pre-tokenizer's expression sees the
        character: a word character joins the `a` before it in one piece; a number stands alone,
        even beside itself."""
        kind = self._kinds.get(char)
        if kind is None:
            if len(self._pre_tokenizer.pre_tokenize_str("a" + char)) == 1:
                kind = "word"
            elif len(self._pre_tokenizer.pre_tokenize_str(char + char)) == 2:
                kind = "number"
            else:
                kind = "other"
            if len(self._kinds) < KINDS_CACHED:
                self._kinds[char] = kind
        return kind

    def _added_across(self, text: str, cut: int) -> bool:
        """Whether an added token's spelling in the text starts before `cut` and ends after it."""
        if text[cut - 1] not in self._added_chars or text[cut] not in self._added_chars:
            return False
        for token in self._added:
            start = text.find(token, max(0, cut - len(token) + 1), cut + len(token) - 1)
            while start != -1 and start < cut:
                if start + len(token) > cut:
                    return True
                start = text.find(token, start + 1, cut + len(token) - 1)
        return False


def window_bytes(most: int) -> int:
    """How far a window may grow (UTF-8 bytes) to find `most` tokens: tokenizing it costs about
    200 bytes of memory a byte, so this bounds what one text costs."""
    return max(WINDOW_BYTES, 8 * most)


def _utf8_size(text: str, size: int) -> int:
    part = text[:size]
    return size if part.isascii() else len(part.encode("utf-8", "surrogatepass"))
