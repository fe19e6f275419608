"""What `clef inspect-spans` shows: one encoded record's prompt, spans and token totals.

The report is plain data (JSON-ready); the CLI renders it with rich. Media placeholders are
collapsed to counts, because an image alone can expand to thousands of pad tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from clef_cli.choices import SpecialTokens
from clef_cli.encoding.encoded import EncodedRecord
from clef_cli.inputs.records import QUESTION_TYPE_NAMES

MEDIA_TOKENS = {"image": "<|image_pad|>", "audio": "<|audio_pad|>", "video": "<|video_pad|>"}


@dataclass(frozen=True)
class PromptPiece:
    """A run of the prompt: plain text, a question or option span, or collapsed media pads."""

    kind: str  # "text", "question", "option", "media"
    text: str
    question: int | None = None
    option: int | None = None


def _media_token_ids(tokenizer: Any) -> dict[str, int]:
    return {kind: int(tokenizer.convert_tokens_to_ids(token)) for kind, token in MEDIA_TOKENS.items()}


def media_token_counts(encoded: EncodedRecord, tokenizer: Any) -> dict[str, int]:
    ids = _media_token_ids(tokenizer)
    return {kind: sum(1 for token in encoded.input_ids if token == token_id) for kind, token_id in ids.items()}


def span_report(encoded: EncodedRecord, tokenizer: Any, special_tokens: SpecialTokens | str) -> dict[str, Any]:
    """Everything inspect-spans prints, as JSON-ready data (input ids included); `special_tokens`
    is the mode the record was encoded under."""
    decode = lambda start, end: tokenizer.decode(encoded.input_ids[start:end])  # noqa: E731
    questions = []
    for question, source in zip(encoded.questions, encoded.record.questions, strict=True):
        start, end = question.question_span
        questions.append(
            {
                "question_id": question.question_id,
                "type": QUESTION_TYPE_NAMES[question.question_type],
                "question_span": [start, end],
                "tokens": end - start,
                "text": decode(start, end),
                "ignored_criteria": list(source.ignored_criteria),
                "options": [
                    {
                        "option_id": option_id,
                        "span": [option_start, option_end],
                        "tokens": option_end - option_start,
                        "text": decode(option_start, option_end),
                    }
                    for option_id, (option_start, option_end) in zip(
                        question.option_ids, question.option_spans, strict=True
                    )
                ],
            }
        )
    record = encoded.record
    return {
        "id": record.id,
        "index": record.index,
        "prompt_tokens": encoded.length,
        "max_length": encoded.max_length,
        "media_tokens": media_token_counts(encoded, tokenizer),
        "media_span": list(encoded.media_span),
        "state_span": list(encoded.state_span),
        "state_tokens": encoded.state_tokens,
        "state_tokens_cut": encoded.state_tokens_cut,
        "use_audio_in_video": encoded.use_audio_in_video,
        "special_tokens": SpecialTokens(special_tokens).value,
        "option_order": {question.question_id: list(question.option_ids) for question in encoded.questions},
        "questions": questions,
        "input_ids": list(encoded.input_ids),
    }


def _boundaries(encoded: EncodedRecord) -> list[tuple[int, int, str, int | None, int | None]]:
    spans = []
    for q, question in enumerate(encoded.questions):
        spans.append((*question.question_span, "question", q, None))
        spans.extend((start, end, "option", q, o) for o, (start, end) in enumerate(question.option_spans))
    return sorted(spans)


def prompt_pieces(encoded: EncodedRecord, tokenizer: Any) -> Iterator[PromptPiece]:
    """The prompt in order, spans marked and runs of media pad tokens collapsed."""
    ids = encoded.input_ids
    pad_kinds = {token_id: kind for kind, token_id in _media_token_ids(tokenizer).items()}

    def plain(start: int, end: int) -> Iterator[PromptPiece]:
        run_start = start
        position = start
        while position < end:
            kind = pad_kinds.get(ids[position])
            if kind is None:
                position += 1
                continue
            if run_start < position:
                yield PromptPiece("text", tokenizer.decode(ids[run_start:position]))
            run_end = position
            while run_end < end and ids[run_end] == ids[position]:
                run_end += 1
            yield PromptPiece("media", f"[{run_end - position} {kind} tokens]")
            position = run_start = run_end
        if run_start < end:
            yield PromptPiece("text", tokenizer.decode(ids[run_start:end]))

    cursor = 0
    for start, end, kind, question, option in _boundaries(encoded):
        yield from plain(cursor, start)
        yield PromptPiece(kind, tokenizer.decode(ids[start:end]), question, option)
        cursor = end
    yield from plain(cursor, len(ids))
