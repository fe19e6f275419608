"""Clef-Omni: the Qwen3-Omni-30B-A3B thinker (text, images, audio, videos).

The talker and code2wav (speech output) are never built: the thinker class is constructed from
`thinker_config` alone and checkpoint keys under `talker.` / `code2wav.` are skipped.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from clef_cli.encoding.batching import ModelBatch
from clef_cli.encoding.media import MediaLimits, decode_audio, decode_image, decode_video
from clef_cli.errors import ModelLoadError
from clef_cli.families.base import (
    AUDIO_PLACEHOLDER,
    IMAGE_PLACEHOLDER,
    VIDEO_PLACEHOLDER,
    Family,
    MediaSegment,
    decode_entries,
    processor_tensors,
)
from clef_cli.inputs.records import Record
from clef_cli.model.backbone import Backbone, load_strictly, quiet_transformers, without_lm_head
from clef_cli.release import Release

IMAGE_SIZE = {"shortest_edge": 65536, "longest_edge": 1048576}
EXPERTS_IMPLEMENTATION = "grouped_mm"
ATTENTION_IMPLEMENTATION = "sdpa"


def _uncapped_video_kwargs(processor: Any) -> dict[str, Any]:
    """Frames arrive already capped (as the reference caps them); newer video processors can cap
    again and warn when not told. Pinning their current behaviour keeps parity and silences it."""
    video_processor = getattr(processor, "video_processor", None)
    preprocess = getattr(video_processor, "_preprocess", None)
    if preprocess is not None and "cap_pixels_per_frame" in inspect.signature(preprocess).parameters:
        return {"cap_pixels_per_frame": False}
    return {}


class OmniFamily(Family):
    name = "omni"
    title = "Clef-Omni"
    model_types = ("qwen3_omni_moe",)
    default_max_length = 64000
    lexical_key = "thinker.lm_head.weight"
    media_kinds = ("images", "audio", "videos")
    image_kwargs: ClassVar[dict[str, Any]] = {"size": IMAGE_SIZE}

    def image_text(self, count: int) -> str:
        return (IMAGE_PLACEHOLDER + "\n") * count

    def text_config(self, config: dict[str, Any]) -> dict[str, Any]:
        return config["thinker_config"]["text_config"]

    def encode_media(self, processor: Any, record: Record, limits: MediaLimits) -> MediaSegment:
        """One processor call over `IMAGE\\n * n + AUDIO\\n * m + VIDEO\\n * k` (DESIGN §3-4)."""
        if not record.has_media:
            return MediaSegment()
        images = decode_entries(record, "images", decode_image, limits)
        clips = decode_entries(record, "audio", decode_audio, limits)
        videos = decode_entries(record, "videos", decode_video, limits)
        use_audio_in_video = bool(videos) and all(video.soundtrack is not None for video in videos)
        text = "".join(
            [self.image_text(len(images))]
            + [AUDIO_PLACEHOLDER + "\n"] * len(clips)
            + [VIDEO_PLACEHOLDER + "\n"] * len(videos)
        )
        kwargs: dict[str, Any] = {"images_kwargs": dict(self.image_kwargs), "return_tensors": "pt"}
        audio = list(clips)
        if videos:
            kwargs["videos_kwargs"] = {"fps": 2.0, "do_sample_frames": False, **_uncapped_video_kwargs(processor)}
            kwargs["load_audio_from_video"] = use_audio_in_video
            if use_audio_in_video:
                audio += [video.soundtrack for video in videos]
                kwargs["audio_from_video_indices"] = [None] * len(clips) + list(range(len(videos)))
        ids, tensors = processor_tensors(
            record,
            lambda: processor(
                text=[text],
                images=images or None,
                audio=audio or None,
                videos=[video.frames for video in videos] or None,
                **kwargs,
            ),
        )
        return MediaSegment(ids, tensors, use_audio_in_video)

    def load_backbone(self, release: Release, device: torch.device, dtype: torch.dtype) -> OmniBackbone:
        from transformers.models.qwen3_omni_moe import (
            Qwen3OmniMoeConfig,
            Qwen3OmniMoeThinkerForConditionalGeneration,
        )

        with quiet_transformers():
            try:
                config = Qwen3OmniMoeConfig.from_pretrained(str(release.path))
            except (OSError, ValueError, KeyError) as error:
                raise ModelLoadError(f"cannot load the thinker's config from {release.path}: {error}") from None
        thinker = load_strictly(
            Qwen3OmniMoeThinkerForConditionalGeneration,
            release,
            device,
            dtype,
            config=config.thinker_config,
            key_mapping={r"^thinker\.": ""},
            # asked for by name: transformers then refuses, instead of silently replacing the
            # grouped expert kernels with a per-expert loop
            experts_implementation=EXPERTS_IMPLEMENTATION,
            attn_implementation=ATTENTION_IMPLEMENTATION,
        )
        check_backends(thinker)
        thinker, lexical_rows = without_lm_head(thinker, device)
        return OmniBackbone(thinker, lexical_rows, device, dtype, self.hidden_size(release.config))


def check_backends(model: Any) -> None:
    """The kernels a fast forward depends on, as loaded (not as asked for)."""
    experts = model.config.text_config._experts_implementation
    attention = model.config._attn_implementation
    if experts != EXPERTS_IMPLEMENTATION or attention != ATTENTION_IMPLEMENTATION:
        raise ModelLoadError(
            f"the thinker loaded with experts {experts!r} and attention {attention!r}; "
            f"clef needs {EXPERTS_IMPLEMENTATION!r} and {ATTENTION_IMPLEMENTATION!r}"
        )


@dataclass
class OmniBackbone(Backbone):
    @property
    def thinker(self) -> torch.nn.Module:
        return self.model

    @torch.inference_mode()
    def hidden_states(self, batch: ModelBatch) -> torch.Tensor:
        """The multimodal rope positions are computed with the padding mask, on the CPU tensors
        (the function walks the batch in Python; on a GPU each step would be a sync), then
        attention runs causally without the mask: with right padding no real token can see a
        pad, and causal attention skips the masked half of the score matrix."""
        media = batch.media
        feature_mask = media.get("feature_attention_mask")
        position_ids, _ = self.model.model.get_rope_index(
            batch.input_ids,
            media.get("image_grid_thw"),
            media.get("video_grid_thw"),
            batch.attention_mask,
            batch.use_audio_in_video,
            feature_mask.sum(-1) if feature_mask is not None else None,
            media.get("video_second_per_grid"),
        )
        inputs = batch.model_inputs(self.device, self.dtype)
        inputs.pop("attention_mask")
        if "input_features" in inputs:
            inputs["inputs_embeds"] = self._embeddings_with_audio(
                inputs["input_ids"], inputs.pop("input_features"), inputs.pop("feature_attention_mask"), batch
            )
        outputs = self.model.model(
            **inputs,
            use_audio_in_video=batch.use_audio_in_video,
            position_ids=position_ids.to(self.device, non_blocking=True),
            attention_mask=None,
            use_cache=False,
        )
        return outputs.last_hidden_state

    def _embeddings_with_audio(
        self, input_ids: torch.Tensor, features: torch.Tensor, feature_mask: torch.Tensor, batch: ModelBatch
    ) -> torch.Tensor:
        """Token embeddings with every audio placeholder filled, each record's clips encoded with
        exactly the padding they get when the record is scored alone.

        The audio encoder cuts clips into chunks of `2 * n_window` mel frames and pads every chunk
        of one call to the longest. Padded frames are not neutral: the first convolution's bias
        makes them non-zero, the next two convolutions (kernel 3) carry them into the last real
        frames of a shorter chunk, and the attention window size follows the longest chunk too.
        So a record whose longest chunk is shorter than its neighbours' would change with them.
        Records are therefore grouped by their own longest chunk, and each group is encoded alone.
        """
        model = self.model.model
        embeds = model.get_input_embeddings()(input_ids)
        audio_token = int(self.model.config.audio_token_id)
        window = int(self.model.config.audio_config.n_window)
        clip_rows: list[range] = []
        groups: dict[int, list[int]] = {}
        for position, record in enumerate(batch.records):
            start = clip_rows[-1].stop if clip_rows else 0
            clips = int(record.media["feature_attention_mask"].shape[0]) if "input_features" in record.media else 0
            clip_rows.append(range(start, start + clips))
            if clips:
                longest = longest_audio_chunk(record.media["feature_attention_mask"].sum(-1), window)
                groups.setdefault(longest, []).append(position)
        per_record: dict[int, torch.Tensor] = {}
        for positions in groups.values():
            rows = [row for position in positions for row in clip_rows[position]]
            encoded = model.get_audio_features(features[rows], feature_mask[rows], return_dict=True).last_hidden_state
            counts = [int((batch.input_ids[position] == audio_token).sum()) for position in positions]
            if sum(counts) != encoded.shape[0]:
                raise ValueError(f"audio placeholders ({sum(counts)}) and audio features ({encoded.shape[0]}) differ")
            per_record.update(zip(positions, torch.split(encoded, counts), strict=True))
        audio = torch.cat([per_record[position] for position in sorted(per_record)]).to(embeds.dtype)
        placeholders = (input_ids == audio_token).unsqueeze(-1).expand_as(embeds)
        return embeds.masked_scatter(placeholders, audio)


def longest_audio_chunk(frame_lengths: torch.Tensor, n_window: int) -> int:
    """The longest of the chunks the audio encoder cuts these clips into (`2 * n_window` frames
    each, the rest in a last, shorter chunk): the length every chunk of their call is padded to."""
    return int(torch.clamp(frame_lengths, max=2 * n_window).max())
