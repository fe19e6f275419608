"""What encoding produces: one record's token ids, media tensors and spans. Kept apart from the
prompt builder so that batching, the families, the head and the hidden-state store can name these
types without importing the encoder (and, through it, the families)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from clef_cli.inputs.records import Record

if TYPE_CHECKING:
    import torch

DEFAULT_MAX_LENGTH = 64000


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
