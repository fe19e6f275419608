"""Clef and Clef-Flash: dense Qwen3.5 backbones (text and images), Gated DeltaNet + attention.

The dense reference (its `joint_schema_model.py`) differs from Omni's in the media segment
(`IMAGE * n + VIDEO * m + "\\n"`, one processor call with the release's own options), in passing
the processor's `mm_token_type_ids` at the media offset, in running text-only batches through the
language model alone, and in an untied `lm_head`. Right padding is exact for its linear-attention
layers as for attention: the recurrence and the causal convolution only look back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from clef_cli.encoding.batching import ModelBatch
from clef_cli.encoding.media import MediaLimits, decode_image
from clef_cli.errors import RecordError
from clef_cli.families.base import (
    IMAGE_PLACEHOLDER,
    Family,
    MediaSegment,
    decode_entries,
    processor_tensors,
)
from clef_cli.inputs.records import Record
from clef_cli.model.backbone import Backbone, load_strictly, without_lm_head
from clef_cli.release import Release

MODEL_CLASSES = {"qwen3_5": "Qwen3_5ForConditionalGeneration", "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration"}
NO_AUDIO = "this model does not read audio; use Clef-Omni, or drop the audio"
NO_VIDEO = (
    "videos are not scored with the dense Clef family yet: their parity with the reference depends on "
    "the release's video processor settings, which no golden record verifies; use Clef-Omni, or drop the videos"
)


class DenseFamily(Family):
    name = "dense"
    title = "Clef / Clef-Flash"
    model_types = tuple(MODEL_CLASSES)
    default_max_length = 16384
    lexical_key = "lm_head.weight"
    media_kinds = ("images",)

    def text_config(self, config: dict[str, Any]) -> dict[str, Any]:
        return config["text_config"]

    def image_text(self, count: int) -> str:
        return IMAGE_PLACEHOLDER * count + "\n"

    def encode_media(self, processor: Any, record: Record, limits: MediaLimits) -> MediaSegment:
        """Images only, refused rather than dropped: the reference ignores `audio` silently."""
        if record.audio:
            raise RecordError(record.id, "audio", NO_AUDIO)
        if record.videos:
            raise RecordError(record.id, "videos", NO_VIDEO)
        if not record.images:
            return MediaSegment()
        images = decode_entries(record, "images", decode_image, limits)
        text = self.image_text(len(images))
        ids, tensors = processor_tensors(record, lambda: processor(text=[text], images=images, return_tensors="pt"))
        return MediaSegment(ids, tensors)

    def image_tensors(
        self, processor: Any, record: Record, limits: MediaLimits, media_ids: list[int]
    ) -> dict[str, torch.Tensor]:
        """With the processor's `mm_token_type_ids`: 1 at each image token of the segment."""
        tensors = super().image_tensors(processor, record, limits, media_ids)
        image = processor.image_token_id
        tensors["mm_token_type_ids"] = torch.tensor([[int(token == image) for token in media_ids]])
        return tensors

    def load_backbone(self, release: Release, device: torch.device, dtype: torch.dtype) -> DenseBackbone:
        import transformers

        model_class = getattr(transformers, MODEL_CLASSES[release.config["model_type"]])
        model = load_strictly(model_class, release, device, dtype, attn_implementation="sdpa")
        if device.type == "cpu":
            _quiet_kernel_fallbacks()
        model, lexical_rows = without_lm_head(model, device)
        return DenseBackbone(model, lexical_rows, device, dtype, self.hidden_size(release.config))


def _quiet_kernel_fallbacks() -> None:
    """On the CPU the PyTorch paths of the causal convolution and the gated delta rule are the
    only ones there are (the optional kernels need CUDA), so the note that they are slower is noise
    in a batch job's log. On a GPU it stays: it says to install `clef-cli[dense-kernels]`."""
    import logging

    logging.getLogger("transformers.integrations.hub_kernels").setLevel(logging.ERROR)


@dataclass
class DenseBackbone(Backbone):
    @torch.inference_mode()
    def hidden_states(self, batch: ModelBatch) -> torch.Tensor:
        """Text-only batches run the language model alone, as the reference does; batches with
        images run the multimodal model with rope positions computed on the CPU tensors.
        Attention is causal without the padding mask (right padding: no real token sees a pad)."""
        inputs = batch.model_inputs(self.device, self.dtype)
        inputs.pop("attention_mask")
        if "pixel_values" not in inputs:
            text_model = self.model.model.language_model
            return text_model(input_ids=inputs["input_ids"], attention_mask=None, use_cache=False).last_hidden_state
        position_ids, _ = self.model.model.get_rope_index(
            batch.input_ids,
            mm_token_type_ids=batch.media["mm_token_type_ids"],
            image_grid_thw=batch.media.get("image_grid_thw"),
            attention_mask=batch.attention_mask,
        )
        outputs = self.model.model(
            **inputs,
            position_ids=position_ids.to(self.device, non_blocking=True),
            attention_mask=None,
            use_cache=False,
        )
        return outputs.last_hidden_state
