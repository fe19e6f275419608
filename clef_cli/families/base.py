"""What a model family is: how its media enter the prompt and how its backbone loads and runs.

Everything else (records, the prompt text, batching, the head, checkpoints, output, rehead and the
quality loop) is family-blind. A family answers three questions: which media segment a record's
images/audio/videos become, how its weights load, and how a padded batch becomes hidden states.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from clef_cli.encoding.media import (
    MediaError,
    MediaLimits,
    as_written,
    close_source,
    decode_image,
    image_size,
    open_source,
)
from clef_cli.errors import RecordError
from clef_cli.inputs.records import Record

if TYPE_CHECKING:
    from clef_cli.model.backbone import Backbone
    from clef_cli.release import Release

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"
AUDIO_PLACEHOLDER = "<|audio_start|><|audio_pad|><|audio_end|>"


@dataclass
class MediaSegment:
    """The token ids the processor expanded the record's placeholders to, and its tensors."""

    input_ids: list[int] = field(default_factory=list)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    use_audio_in_video: bool = False


def decode_entries(record: Record, name: str, decoder: Callable[[Any, MediaLimits], Any], limits: MediaLimits) -> list:
    """Every entry of one media field, decoded; a failure is that record's error naming the entry."""
    decoded = []
    for position, entry in enumerate(getattr(record, name)):
        try:
            source = open_source(entry, record.base_dir, limits, name)
            try:
                decoded.append(decoder(source, limits))
            except MediaError as error:
                raise as_written(error, source, entry) from None
            finally:
                close_source(source)
        except MediaError as error:
            kind = "transient" if error.transient else "media"
            raise RecordError(record.id, f"{name}[{position}]", str(error), kind) from None
    return decoded


PIXEL_TENSORS = ("pixel_values", "pixel_values_videos")
"""Normalised 8-bit frames (Pillow and PyAV decode to RGB24): finite by construction, and large
(22 MB per 720p image), so checking them would double an image's encoding time. Audio features
and the small grid tensors are checked; the commit guard checks every result anyway."""


def processor_tensors(record: Record, call: Callable[[], Any]) -> tuple[list[int], dict[str, torch.Tensor]]:
    """Run one processor call; its ids and every tensor but the ids and the mask."""
    try:
        output = call()
    except (ValueError, RuntimeError, TypeError, IndexError) as error:
        raise RecordError(record.id, "media", f"the processor refused the media: {error}") from None
    tensors = {
        key: value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
        for key, value in output.items()
        if key not in ("input_ids", "attention_mask")
    }
    for key, tensor in tensors.items():
        if key in PIXEL_TENSORS or not tensor.is_floating_point():
            continue
        if not bool(torch.isfinite(tensor).all()):
            raise RecordError(record.id, "media", f"the processor's {key} hold non-finite values (NaN or infinity)")
    return output["input_ids"][0].tolist(), tensors


def image_ids_from_headers(
    processor: Any, record: Record, limits: MediaLimits, text: str, image_kwargs: dict[str, Any]
) -> list[int]:
    """The ids `processor(text=[text], images=...)` gives the record's images, from their headers.

    The processor expands each image placeholder to one token per merged patch, a count that
    depends only on the image's size (its `smart_resize`), and tokenizes the expanded text. The
    placeholder is a special token, which tokenizers split out before anything else, so here the
    text is tokenized as written and each placeholder id repeated instead (tokenizing 1,700
    placeholders costs more than the rest of planning). A run thus plans an image record without
    decoding or normalising its pixels (tests/test_header_planning.py checks the ids against
    full encodes).
    """
    sizes = decode_entries(record, "images", image_size, limits)
    pad = processor.image_token_id
    ids = list(processor.tokenizer(text, add_special_tokens=False)["input_ids"])
    if ids.count(pad) != len(sizes):
        raise ValueError(f"{ids.count(pad)} image placeholders for {len(sizes)} images")
    try:
        counts = [image_token_count(processor.image_processor, width, height, image_kwargs) for width, height in sizes]
    except ValueError as error:  # the same smart_resize refusal a full encode would meet
        raise RecordError(record.id, "media", f"the processor refused the media: {error}") from None
    expanded: list[int] = []
    repeats = iter(counts)
    for token in ids:
        expanded.extend([token] * next(repeats) if token == pad else [token])
    return expanded


def image_token_count(image_processor: Any, width: int, height: int, image_kwargs: dict[str, Any]) -> int:
    """The tokens one image of this size expands to: one per merged patch of the image as the
    processor's `smart_resize` scales it between the size bounds (`image_kwargs["size"]`, else the
    processor's own). Counted here, not by `get_number_of_image_patches`, because that reads the
    bounds from `min_pixels`/`max_pixels` up to transformers 5.24 and from `size` from 5.25 on
    (warning that the old keys go): each spelling is ignored in silence by one of those releases."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    bounds = image_kwargs.get("size") or image_processor.size
    patch, merge = image_processor.patch_size, image_processor.merge_size
    resized_height, resized_width = smart_resize(
        height, width, patch * merge, min_pixels=bounds["shortest_edge"], max_pixels=bounds["longest_edge"]
    )
    return (resized_height // patch) * (resized_width // patch) // merge**2


def image_tensors(
    processor: Any, record: Record, limits: MediaLimits, media_ids: list[int], image_kwargs: dict[str, Any]
) -> dict[str, torch.Tensor]:
    """The tensors a full processor call gives the record's images, from the image processor
    alone: the ids are the plan's, so the processor's text expansion and tokenization (a fifth
    of an image's encoding time) are not done twice (tests/test_header_planning.py checks every
    tensor bit for bit). An image whose size changed since it was planned is refused."""
    images = decode_entries(record, "images", decode_image, limits)
    image_processor = processor.image_processor
    try:
        output = image_processor(images=images, return_tensors="pt", **image_kwargs)
    except (ValueError, RuntimeError, TypeError, IndexError) as error:
        raise RecordError(record.id, "media", f"the processor refused the media: {error}") from None
    grid = output["image_grid_thw"]
    if int(grid.prod(-1).sum()) // image_processor.merge_size**2 != media_ids.count(processor.image_token_id):
        message = "an image changed size while the job ran (it was planned from an earlier version)"
        raise RecordError(record.id, "images", message, kind="transient")
    return {"pixel_values": output["pixel_values"], "image_grid_thw": grid}


class Family(ABC):
    """One model family of the Clef release line."""

    name: str
    title: str
    model_types: tuple[str, ...]
    default_max_length: int
    lexical_key: str
    """The safetensors key of the lm_head rows the joint head reads."""
    media_kinds: tuple[str, ...]

    @abstractmethod
    def text_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The text model's config inside a release's config.json."""

    def hidden_size(self, config: dict[str, Any]) -> int:
        return int(self.text_config(config)["hidden_size"])

    @abstractmethod
    def encode_media(self, processor: Any, record: Record, limits: MediaLimits) -> MediaSegment:
        """The record's media segment (empty for a record without media)."""

    image_kwargs: ClassVar[dict[str, Any]] = {}
    """The image processor's options for this family (none: the release's own)."""

    @abstractmethod
    def image_text(self, count: int) -> str:
        """The media segment's text for `count` images alone (what `encode_media` passes)."""

    def media_ids_from_headers(self, processor: Any, record: Record, limits: MediaLimits) -> list[int] | None:
        """The media segment's ids without decoding any pixels, where headers tell them (images
        alone); None where only a full encode can (audio and video lengths; what `encode_media`
        refuses, it refuses with its reason)."""
        if record.audio or record.videos or not record.images:
            return None
        text = self.image_text(len(record.images))
        return image_ids_from_headers(processor, record, limits, text, self.image_kwargs)

    def image_tensors(
        self, processor: Any, record: Record, limits: MediaLimits, media_ids: list[int]
    ) -> dict[str, torch.Tensor]:
        """The media tensors of a record `media_ids_from_headers` planned, its images decoded now."""
        return image_tensors(processor, record, limits, media_ids, self.image_kwargs)

    def lexical_rows(self, release: Release) -> torch.Tensor:
        """The lm_head rows alone (for re-scoring stored hidden states without the backbone)."""
        from clef_cli.model.backbone import load_lexical_rows

        return load_lexical_rows(release, self.lexical_key)

    @abstractmethod
    def load_backbone(self, release: Release, device: torch.device, dtype: torch.dtype) -> Backbone:
        """The strictly loaded backbone, its lm_head kept only as the lexical lookup table."""
