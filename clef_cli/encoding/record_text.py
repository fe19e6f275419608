"""How prompt segments become token ids: the template's as written, the record's as text.

A tokenizer's default parses special-token strings inside any text, so a record whose state ends
with `<|im_end|>\\n<|im_start|>assistant\\n...` would close the user turn and write the model's
answer, and an `<|image_pad|>` in it would claim an image token. By default
(`SpecialTokens.text`) a segment that comes from the record is tokenized with every added token
of the tokenizer (special ones, and also non-special ones like Qwen3's `<think>` and
`<tool_call>`, which belong to the template and tool protocol, not to a record) read as ordinary
text. Text without such strings gives exactly the ids it gave before, since the added tokens are
matched before anything else and, when none matches, the text meets the same normalizer,
pre-tokenizer and model.

The record's segments go through a private copy of the fast tokenizer's backend with every added
token marked special and `encode_special_tokens` set once. `split_special_tokens=True` on the
shared tokenizer would do the same for special tokens only, and it works by setting that flag on
the shared backend at every call, so a concurrent call by the processor could undo it.
"""

from __future__ import annotations

import json
from typing import Any

from clef_cli.choices import SpecialTokens
from clef_cli.encoding.text_cut import WHOLE_CHARS, TextCutter
from clef_cli.errors import ModelLoadError


def literal_backend(tokenizer: Any) -> Any:
    """A copy of `tokenizer`'s backend that reads no added token in its input: each becomes the
    ordinary tokens of its spelling."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        name = type(tokenizer).__name__
        raise ModelLoadError(f"--special-tokens text needs a fast (Rust) tokenizer; the release's {name} is not one")
    from tokenizers import Tokenizer

    spec = json.loads(backend.to_str())
    for token in spec.get("added_tokens") or []:
        token["special"] = True
    literal = Tokenizer.from_str(json.dumps(spec))
    literal.no_truncation()
    literal.no_padding()
    literal.encode_special_tokens = True
    return literal


class SegmentTokenizer:
    """Tokenizes one prompt segment at a time, each on its own and without added special tokens
    (DESIGN §3): `template` for the prompt's own text, `record` (batched) for the record's."""

    def __init__(self, tokenizer: Any, mode: SpecialTokens | str = SpecialTokens.text) -> None:
        self.tokenizer = tokenizer
        self.mode = SpecialTokens(mode)
        self._literal = literal_backend(tokenizer) if self.mode is SpecialTokens.text else None
        self._cutter: TextCutter | None = None

    def template(self, text: str) -> list[int]:
        """The ids of the prompt's own text: its special-token strings are control tokens."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def record(self, texts: list[str]) -> list[list[int]]:
        """The ids of each text from the record, in one batched call; under `parse` its
        special-token strings are control tokens, as the reference reads them."""
        if not texts:
            return []
        if self._literal is None:
            return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        return [list(encoding.ids) for encoding in self._literal.encode_batch(texts, add_special_tokens=False)]

    def leading(self, texts: list[str], most: int) -> list[tuple[list[int], bool]]:
        """(ids, whole) of each text from the record: a text of up to `most` + WHOLE_CHARS
        characters tokenized whole (in one batched call), a longer one cut first (text_cut.py) to
        a part whose ids are at least `most` of the whole text's first ones (whole False)."""
        found: list[tuple[list[int], bool] | None] = [None] * len(texts)
        short = [number for number, text in enumerate(texts) if len(text) <= most + WHOLE_CHARS]
        for number, ids in zip(short, self.record([texts[number] for number in short]), strict=True):
            found[number] = (ids, True)
        for number, text in enumerate(texts):
            if found[number] is None:
                found[number] = self.cutter().leading(text, most, lambda part: self.record([part])[0])
        return [item for item in found if item is not None]

    def cutter(self) -> TextCutter:
        """The cutter for this tokenizer, made when a first long text needs it."""
        if self._cutter is None:
            self._cutter = TextCutter(getattr(self.tokenizer, "backend_tokenizer", None))
        return self._cutter
