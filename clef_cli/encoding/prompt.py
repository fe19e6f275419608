"""The prompt contract (DESIGN §3–4): a `Record` becomes token ids, media tensors and spans.

Every segment is tokenized on its own with `add_special_tokens=False` and the id lists are
concatenated; tokenizing the joined text would merge tokens across the joins and break parity
with the reference. The record's segments (its state, and each question's header, instruction
and options) never turn special-token strings into control tokens unless `--special-tokens parse`
says so (`record_text`). Spans are half-open ranges into the final sequence, after media expansion.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from typing import Any, TypeVar

from clef_cli.choices import OverflowPolicy, SpecialTokens
from clef_cli.encoding.encoded import EncodedQuestion, EncodedRecord
from clef_cli.encoding.media import MediaLimits
from clef_cli.encoding.record_text import SegmentTokenizer
from clef_cli.encoding.render import render, render_instructions, render_option
from clef_cli.encoding.text_cut import NoCut
from clef_cli.errors import ClefError, RecordError, unexpected_error
from clef_cli.families.base import Family, MediaSegment
from clef_cli.inputs.records import Question, Record

T = TypeVar("T")

SYSTEM_PROMPT = (
    "Read the complete state and schema. Decide every field jointly. "
    "Each answer must be exactly one of that field's allowed options."
)
PREFIX = f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nSTATE:\n"
SCHEMA_HEADER = "\n\nSCHEMA FIELDS:\n"
OPTIONS_HEADER = "\nALLOWED OPTIONS:\n"
FIELD_END = "END FIELD\n"
SUFFIX = "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:"
"""Clef-Omni's; each family has its own (`Family.default_max_length`)."""


class PromptEncoder:
    """Encodes records with one release's tokenizer and processor (no weights needed).

    The family (default Clef-Omni) decides how media enter the prompt and the default max length;
    the rest of the prompt is the same for every family. `special_tokens` says whether the
    record's text may hold control tokens (`parse`, the reference) or not (`text`, the default).
    """

    def __init__(
        self,
        processor: Any,
        max_length: int | None = None,
        overflow: OverflowPolicy | str = OverflowPolicy.truncate,
        limits: MediaLimits | None = None,
        family: Family | None = None,
        special_tokens: SpecialTokens | str = SpecialTokens.text,
    ) -> None:
        if family is None:
            from clef_cli.families import family_named

            family = family_named("omni")
        self.family = family
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.max_length = max_length or family.default_max_length
        self.overflow = OverflowPolicy(overflow)
        self.limits = limits or MediaLimits()
        self.segments = SegmentTokenizer(self.tokenizer, special_tokens)
        self.special_tokens = self.segments.mode
        self._prefix = self.segments.template(PREFIX)
        self._suffix = self.segments.template(SUFFIX)
        self._cached_tokens = lru_cache(maxsize=4096)(self.segments.template)

    # ------------------------------------------------------------------- text

    def _schema(self, questions: tuple[Question, ...]) -> tuple[list[int], list[EncodedQuestion]]:
        """Schema ids and spans counted from the schema's first token. The segments that hold the
        record's text (each field header, which names the question id, its instruction and its
        options) are tokenized in one batched call."""
        texts: list[str] = []
        for number, question in enumerate(questions, start=1):
            texts.append(f"\nFIELD {number}\nID: {question.id}\nTYPE: {question.type}\nINSTRUCTION: ")
            texts.append(render_instructions(question))
            texts.extend(render_option(option_id, description) for option_id, description in question.options)
        variable = iter(self._schema_segments(texts))

        ids = list(self._cached_tokens(SCHEMA_HEADER))
        encoded: list[EncodedQuestion] = []
        for question in questions:
            ids += next(variable)
            question_ids = next(variable)
            question_span = (len(ids), len(ids) + len(question_ids))
            ids += question_ids
            ids += self._cached_tokens(OPTIONS_HEADER)
            option_spans = []
            for option_number in range(1, len(question.options) + 1):
                ids += self._cached_tokens(f"OPTION {option_number}: ")
                option_ids = next(variable)
                option_spans.append((len(ids), len(ids) + len(option_ids)))
                ids += option_ids
                ids += self._cached_tokens("\n")
            ids += self._cached_tokens(FIELD_END)
            encoded.append(
                EncodedQuestion(
                    question_id=question.id,
                    question_type=question.type_id,
                    question_span=question_span,
                    option_spans=tuple(option_spans),
                    option_ids=question.option_ids,
                )
            )
        return ids, encoded

    def _schema_segments(self, texts: list[str]) -> list[list[int]]:
        """The ids of the schema's record segments; a segment longer than --max-length tokens is
        cut before it is tokenized (text_cut.py), and the schema then cannot fit."""
        found = self._leading(texts, self.max_length + 1)
        if not all(whole for _, whole in found):
            raise _Overflow(f"schema requires more than {self.max_length} tokens; maximum is {self.max_length}")
        return [ids for ids, _ in found]

    def _leading(self, texts: list[str], most: int) -> list[tuple[list[int], bool]]:
        try:
            return self.segments.leading(texts, most)
        except NoCut as error:
            raise _no_place_to_cut(error.limit) from None

    # ------------------------------------------------------------------- record

    def encode(self, record: Record) -> EncodedRecord:
        """The record's token ids, spans and media tensors, or a `RecordError`."""
        media = _guarded(record, "media", lambda: self.family.encode_media(self.processor, record, self.limits))
        return self._assembled(record, media)

    def plan(self, record: Record) -> EncodedRecord | None:
        """The same ids and spans as `encode` without the media tensors, from the media's headers
        alone (images); None when the record's media must be decoded to know them."""
        if not record.has_media:
            return None
        ids = _guarded(record, "media", lambda: self.family.media_ids_from_headers(self.processor, record, self.limits))
        return None if ids is None else self._assembled(record, MediaSegment(ids))

    def with_images(self, planned: EncodedRecord) -> EncodedRecord:
        """A record `plan` gave, its images decoded and processed now; its ids stay the plan's."""
        record = planned.record
        start, stop = planned.media_span
        media_ids = [int(token) for token in planned.input_ids[start:stop]]
        family, processor, limits = self.family, self.processor, self.limits
        tensors = _guarded(record, "media", lambda: family.image_tensors(processor, record, limits, media_ids))
        return replace(planned, media=tensors)

    def _assembled(self, record: Record, media: MediaSegment) -> EncodedRecord:
        # a long state is cut before it is tokenized, to a part holding every token --max-length
        # can keep (text_cut.py); `whole` says whether its ids are all of the state's
        state_ids, whole = _guarded(record, "state", lambda: self._state_ids(record))
        schema_ids, questions = _guarded(record, "questions", lambda: self._schema(record.questions))
        start = len(self._prefix) + len(media.input_ids)
        fixed = start + len(schema_ids) + len(self._suffix)
        if fixed > self.max_length:
            raise RecordError(
                record.id,
                "questions",
                f"schema requires {fixed} tokens before state; maximum is {self.max_length}",
                kind="overflow",
            )
        room = self.max_length - fixed
        cut = max(0, len(state_ids) - room)
        if cut and self.overflow is OverflowPolicy.error:
            size = f"{len(state_ids)} tokens" if whole else f"more than {len(state_ids)} tokens"
            raise RecordError(
                record.id,
                "state",
                f"state is {size} but only {room} fit in max length {self.max_length} "
                "(--on-overflow error refuses instead of truncating)",
                kind="overflow",
            )
        state_ids = state_ids[:room]
        schema_start = start + len(state_ids)
        return EncodedRecord(
            record=record,
            input_ids=self._prefix + media.input_ids + state_ids + schema_ids + self._suffix,
            questions=tuple(_shifted(question, schema_start) for question in questions),
            media=media.tensors,
            use_audio_in_video=media.use_audio_in_video,
            media_span=(len(self._prefix), start),
            state_span=(start, schema_start),
            state_tokens_cut=cut,
            max_length=self.max_length,
        )

    def _state_ids(self, record: Record) -> tuple[list[int], bool]:
        return self._leading([render(record.state)], self.max_length)[0]


class _Overflow(Exception):
    """A record text too long to take (the field's `overflow` error, made by `_guarded`)."""


def _no_place_to_cut(limit: int) -> _Overflow:
    return _Overflow(
        f"no place to cut this text in its first {limit:,} bytes that keeps its first tokens exact (a run "
        "of spaces, symbols or letters with no word or number boundary in it); refused, not tokenized whole"
    )


def _guarded(record: Record, field: str, step: Callable[[], T]) -> T:
    """One encoding step; an exception no check foresaw becomes this record's error naming the
    field (a last guard: validation in records.py is what should refuse the value). A job's
    error met on the way (an object store refusing the credentials) is not one record's: it
    ends the job."""
    try:
        return step()
    except (RecordError, ClefError):
        raise
    except _Overflow as error:
        raise RecordError(record.id, field, str(error), kind="overflow") from None
    except Exception as error:
        raise unexpected_error(record.id, field, error) from error


def _shifted(question: EncodedQuestion, offset: int) -> EncodedQuestion:
    def move(span: tuple[int, int]) -> tuple[int, int]:
        return (span[0] + offset, span[1] + offset)

    return EncodedQuestion(
        question_id=question.question_id,
        question_type=question.question_type,
        question_span=move(question.question_span),
        option_spans=tuple(move(span) for span in question.option_spans),
        option_ids=question.option_ids,
    )
