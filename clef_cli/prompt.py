"""The prompt contract (DESIGN §3–4): a `Record` becomes token ids, media tensors and spans.

Every segment is tokenized on its own with `add_special_tokens=False` and the id lists are
concatenated; tokenizing the joined text would merge tokens across the joins and break parity
with the reference. Spans are half-open ranges into the final sequence, after media expansion.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache
from typing import Any

import torch

from clef_cli.errors import RecordError
from clef_cli.media import (
    DecodedVideo,
    MediaError,
    MediaLimits,
    decode_audio,
    decode_image,
    decode_video,
    open_source,
)
from clef_cli.records import Question, Record

SYSTEM_PROMPT = (
    "Read the complete state and schema. Decide every field jointly. "
    "Each answer must be exactly one of that field's allowed options."
)
PREFIX = f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nSTATE:\n"
SCHEMA_HEADER = "\n\nSCHEMA FIELDS:\n"
OPTIONS_HEADER = "\nALLOWED OPTIONS:\n"
FIELD_END = "END FIELD\n"
SUFFIX = "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:"
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>\n"
AUDIO_PLACEHOLDER = "<|audio_start|><|audio_pad|><|audio_end|>\n"
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>\n"
IMAGE_SIZE = {"shortest_edge": 65536, "longest_edge": 1048576}
DEFAULT_MAX_LENGTH = 64000


class OverflowPolicy(str, Enum):
    """What to do when the state does not fit: cut it (the reference) or refuse the record."""

    truncate = "truncate"
    error = "error"


def render(value: Any) -> str:
    """A string as is; anything else compact JSON with sorted keys, non-ASCII kept."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def render_option(option_id: str, description: Any) -> str:
    body: dict[str, Any] = {"option_id": option_id}
    if description is not None:
        body["description"] = description
    return render(body)


def render_instructions(question: Question) -> str:
    instructions = question.instructions
    if instructions is None or instructions == "":
        return question.id
    return render(instructions)


def _uncapped_video_kwargs(processor: Any) -> dict[str, Any]:
    """Frames arrive already capped (as the reference caps them); newer video processors can cap
    again and warn when not told. Pinning their current behaviour keeps parity and silences it."""
    video_processor = getattr(processor, "video_processor", None)
    preprocess = getattr(video_processor, "_preprocess", None)
    if preprocess is not None and "cap_pixels_per_frame" in inspect.signature(preprocess).parameters:
        return {"cap_pixels_per_frame": False}
    return {}


@dataclass(frozen=True)
class EncodedQuestion:
    """Where one question and its options sit in the token sequence (end exclusive)."""

    question_id: str
    question_type: int
    question_span: tuple[int, int]
    option_spans: tuple[tuple[int, int], ...]
    option_ids: tuple[str, ...]


@dataclass
class EncodedRecord:
    """Everything the backbone and the head need for one record."""

    record: Record
    input_ids: list[int]
    questions: tuple[EncodedQuestion, ...]
    media: dict[str, torch.Tensor] = field(default_factory=dict)
    """The processor's tensors: pixel_values, image_grid_thw, pixel_values_videos,
    video_grid_thw, video_second_per_grid, input_features, feature_attention_mask."""
    use_audio_in_video: bool = False
    media_span: tuple[int, int] = (0, 0)
    state_span: tuple[int, int] = (0, 0)
    state_tokens_cut: int = 0
    max_length: int = DEFAULT_MAX_LENGTH

    @property
    def length(self) -> int:
        return len(self.input_ids)

    @property
    def state_tokens(self) -> int:
        return self.state_span[1] - self.state_span[0]


@dataclass
class _MediaEncoding:
    input_ids: list[int]
    tensors: dict[str, torch.Tensor]
    use_audio_in_video: bool


class PromptEncoder:
    """Encodes records with one release's tokenizer and processor (no weights needed)."""

    def __init__(
        self,
        processor: Any,
        max_length: int = DEFAULT_MAX_LENGTH,
        overflow: OverflowPolicy | str = OverflowPolicy.truncate,
        limits: MediaLimits | None = None,
    ) -> None:
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.max_length = max_length
        self.overflow = OverflowPolicy(overflow)
        self.limits = limits or MediaLimits()
        self._prefix = self._tokens(PREFIX)
        self._suffix = self._tokens(SUFFIX)
        self._cached_tokens = lru_cache(maxsize=4096)(self._tokens)
        self._video_cap_kwargs = _uncapped_video_kwargs(processor)

    def _tokens(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _many_tokens(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    # ------------------------------------------------------------------- text

    def _schema(self, questions: tuple[Question, ...]) -> tuple[list[int], list[EncodedQuestion]]:
        """Schema ids and spans counted from the schema's first token."""
        texts: list[str] = []
        for question in questions:
            texts.append(render_instructions(question))
            texts.extend(render_option(option_id, description) for option_id, description in question.options)
        variable = iter(self._many_tokens(texts))

        ids = list(self._cached_tokens(SCHEMA_HEADER))
        encoded: list[EncodedQuestion] = []
        for number, question in enumerate(questions, start=1):
            header = f"\nFIELD {number}\nID: {question.id}\nTYPE: {question.type}\nINSTRUCTION: "
            ids += self._tokens(header)
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

    # ------------------------------------------------------------------- media

    def _decode(self, record: Record, name: str, position: int, decoder: Any) -> Any:
        entry = getattr(record, name)[position]
        try:
            return decoder(open_source(entry, record.base_dir, self.limits), self.limits)
        except MediaError as error:
            raise RecordError(record.id, f"{name}[{position}]", str(error)) from None

    def _media(self, record: Record) -> _MediaEncoding:
        if not record.has_media:
            return _MediaEncoding([], {}, False)
        images = [self._decode(record, "images", i, decode_image) for i in range(len(record.images))]
        clips = [self._decode(record, "audio", i, decode_audio) for i in range(len(record.audio))]
        videos: list[DecodedVideo] = [
            self._decode(record, "videos", i, decode_video) for i in range(len(record.videos))
        ]
        use_audio_in_video = bool(videos) and all(video.soundtrack is not None for video in videos)
        text = IMAGE_PLACEHOLDER * len(images) + AUDIO_PLACEHOLDER * len(clips) + VIDEO_PLACEHOLDER * len(videos)
        kwargs: dict[str, Any] = {"images_kwargs": {"size": IMAGE_SIZE}, "return_tensors": "pt"}
        audio = list(clips)
        if videos:
            kwargs["videos_kwargs"] = {"fps": 2.0, "do_sample_frames": False, **self._video_cap_kwargs}
            kwargs["load_audio_from_video"] = use_audio_in_video
            if use_audio_in_video:
                audio += [video.soundtrack for video in videos]
                kwargs["audio_from_video_indices"] = [None] * len(clips) + list(range(len(videos)))
        try:
            output = self.processor(
                text=[text],
                images=images or None,
                audio=audio or None,
                videos=[video.frames for video in videos] or None,
                **kwargs,
            )
        except (ValueError, RuntimeError, TypeError, IndexError) as error:
            raise RecordError(record.id, "media", f"the processor refused the media: {error}") from None
        tensors = {
            key: value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
            for key, value in output.items()
            if key not in ("input_ids", "attention_mask")
        }
        return _MediaEncoding(output["input_ids"][0].tolist(), tensors, use_audio_in_video)

    # ------------------------------------------------------------------- record

    def encode(self, record: Record) -> EncodedRecord:
        """The record's token ids, spans and media tensors, or a `RecordError`."""
        media = self._media(record)
        state_ids = self._tokens(render(record.state))
        schema_ids, questions = self._schema(record.questions)
        start = len(self._prefix) + len(media.input_ids)
        fixed = start + len(schema_ids) + len(self._suffix)
        if fixed > self.max_length:
            raise RecordError(
                record.id,
                "questions",
                f"schema requires {fixed} tokens before state; maximum is {self.max_length}",
            )
        room = self.max_length - fixed
        cut = max(0, len(state_ids) - room)
        if cut and self.overflow is OverflowPolicy.error:
            raise RecordError(
                record.id,
                "state",
                f"state is {len(state_ids)} tokens but only {room} fit in max length {self.max_length} "
                "(--on-overflow error refuses instead of truncating)",
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
