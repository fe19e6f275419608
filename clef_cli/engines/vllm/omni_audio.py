"""Clef-Omni's audio inside vLLM as the reference processes it. Runs in vLLM's environment, loaded
by worker.py beside it; never imports clef. Two things vLLM 0.32's Qwen3-Omni does otherwise:

**Clip padding.** vLLM's processor pads every clip with zeros to a whole number of mel hops (160
samples) before the feature extractor sees it, "so the cache works", and counts each clip's
frames from the padded length. The reference hands the extractor the clip as it is. For a clip
whose length is not a multiple of 160 the two differ: the padded clip has one mel frame more, and
its last frames see zeros where the extractor's own centred STFT reflects the clip's end. A
video's soundtrack is such a clip (48,298 samples for sample_data's delivery_clip.mp4: 302 frames
in vLLM, 301 in the reference), which put audio-in-video records 1.4e-5 off the HF engine; a
0.70 s standalone clip was 5.3e-5 off (issue 38). The processor below keeps the extractor's own
features, mask and lengths (the Qwen2.5-Omni path vLLM's Qwen3-Omni processor builds on); clef
turns vLLM's processor cache off (worker.engine_options), which is what the padding was for.

**Clips beside soundtracks.** With `use_audio_in_video`, vLLM takes every audio item for a
soundtrack (it refuses a request with more clips than videos, and pairs the n-th video with the
n-th clip by position). The reference also scores a record that has clips of its own and videos
with soundtracks; clef sends the clips first, then the soundtracks, in prompt order (as the
reference's processor consumes them). Here the record's own clips expand as plain audio, the
soundtracks interleave with their videos, and each video is paired with the clip that sits at its
own place in the prompt."""

from __future__ import annotations

from typing import Any


def with_reference_audio(model_class: type) -> type:
    """`model_class` with the reference's audio features and clip-to-video pairing."""
    from vllm.model_executor.models.qwen3_omni_moe_thinker import (
        Qwen3OmniMoeThinkerDummyInputsBuilder,
        Qwen3OmniMoeThinkerProcessingInfo,
    )
    from vllm.multimodal import MULTIMODAL_REGISTRY

    class ClefOmniReferenceAudio(model_class):  # type: ignore[misc, valid-type]
        def _get_audio_for_video_mapping(self, mm_features: list[Any]) -> tuple[dict[int, int], set[int]]:
            """Each video with its soundtrack: the audio item placed at the video's own offset."""
            from vllm.model_executor.models.qwen3_omni_moe_thinker import _get_feature_tensor

            audio_at = {f.mm_position.offset: f for f in mm_features if f.modality == "audio"}
            mapping: dict[int, int] = {}
            for video in mm_features:
                offset = video.mm_position.offset
                if video.modality != "video" or offset not in audio_at or not video.data:
                    continue
                if video.data.get("use_audio_in_video") and _get_feature_tensor(video, "use_audio_in_video").item():
                    mapping[offset] = int(_get_feature_tensor(audio_at[offset], "audio_feature_lengths").item())
            return mapping, set(mapping)

    register = MULTIMODAL_REGISTRY.register_processor(
        _reference_processor(),
        info=Qwen3OmniMoeThinkerProcessingInfo,
        dummy_inputs=Qwen3OmniMoeThinkerDummyInputsBuilder,
    )
    return register(ClefOmniReferenceAudio)


def _reference_processor() -> type:
    from vllm.model_executor.models.clef_omni import ClefOmniMultiModalProcessor
    from vllm.model_executor.models.qwen2_5_omni_thinker import Qwen2_5OmniThinkerMultiModalProcessor

    unpadded = Qwen2_5OmniThinkerMultiModalProcessor

    class ClefOmniReferenceAudioProcessor(ClefOmniMultiModalProcessor):
        def _get_hf_mm_inputs(self, mm_items: Any, hf_kwargs: Any) -> Any:
            return unpadded._get_hf_mm_inputs(self, mm_items, hf_kwargs)

        def _postprocess_hf_mm_data(self, hf_data: Any, hf_kwargs: Any, processed_data: Any) -> Any:
            return unpadded._postprocess_hf_mm_data(self, hf_data, hf_kwargs, processed_data)

        def _get_prompt_updates(self, mm_items: Any, hf_processor_mm_kwargs: Any, out_mm_kwargs: Any) -> Any:
            updates = super()._get_prompt_updates(mm_items, hf_processor_mm_kwargs, out_mm_kwargs)
            data = out_mm_kwargs.get_data()
            clips = _own_clips(data, bool(hf_processor_mm_kwargs.get("use_audio_in_video")))
            if not clips:
                return updates
            tokens = _audio_tokens(data["audio_feature_lengths"])
            return [_with_own_clips(self, update, data, tokens, clips) for update in updates]

        def _maybe_apply_prompt_updates(self, mm_items: Any, mm_res: Any) -> Any:
            updates = mm_res.prompt_updates
            videos = len(updates.get("video", []))
            clips = len(updates.get("audio", [])) - videos
            if not videos or clips <= 0 or not _in_video(mm_res.kwargs):
                return super()._maybe_apply_prompt_updates(mm_items, mm_res)
            self._validate_mm_kwargs(mm_res.kwargs, mm_items.get_all_counts())
            own = {**updates, "audio": updates["audio"][:clips]}
            prompt_ids, placeholders = self._apply_prompt_updates(mm_res.prompt_ids, own)
            soundtracks = _soundtracks(self, placeholders, clips)
            placeholders = {**placeholders, "audio": [*placeholders.get("audio", []), *soundtracks]}
            self._validate_mm_placeholders(placeholders, mm_items.get_all_counts())
            return prompt_ids, placeholders

    return ClefOmniReferenceAudioProcessor


def _in_video(kwargs: Any) -> bool:
    return any(item is not None and bool(item["use_audio_in_video"].data) for item in kwargs.get("video", []))


def _own_clips(data: Any, use_audio_in_video: bool) -> int:
    """How many of the request's clips are the record's own (the rest are its videos' soundtracks)."""
    lengths = data.get("audio_feature_lengths")
    if not use_audio_in_video or lengths is None:
        return 0
    return max(0, len(lengths) - len(data.get("video_grid_thw", [])))


def _audio_tokens(frame_lengths: Any) -> list[int]:
    """Each clip's audio tokens, from its mel frames (vLLM's own formula)."""
    import torch
    from vllm.model_executor.models.qwen3_omni_moe_thinker import _get_feat_extract_output_lengths

    return _get_feat_extract_output_lengths(torch.as_tensor([int(n) for n in frame_lengths])).tolist()


def _with_own_clips(processor: Any, update: Any, data: Any, tokens: list[int], clips: int) -> Any:
    """An audio or video replacement that counts the record's own clips before the soundtracks
    (`tokens`: each clip's audio tokens, the record's own first)."""
    from vllm.multimodal.processing.processor import PromptReplacement, PromptUpdateDetails

    config = processor.info.get_hf_config()
    if update.modality == "audio":
        return PromptReplacement(
            modality="audio", target=update.target, replacement=lambda n: [config.audio_token_id] * tokens[n]
        )
    if update.modality != "video":
        return update
    seconds = data.get("second_per_grid_ts")

    def interleaved(n: int) -> Any:
        placeholder = processor.get_updates_use_audio_in_video(
            thinker_config=config,
            audio_len=tokens[clips + n],
            video_grid_thw=data["video_grid_thw"][n],
            video_second_per_grid_t=float(seconds[n]) if seconds is not None else 2.0,
        )
        return PromptUpdateDetails.select_token_id(placeholder, embed_token_id=config.video_token_id)

    return PromptReplacement(modality="video", target=update.target, replacement=interleaved)


def _soundtracks(processor: Any, placeholders: Any, clips: int) -> list[Any]:
    """One audio placeholder per video, over the video's own span (its audio tokens embedded)."""
    import torch
    from vllm.multimodal.processing.processor import PlaceholderFeaturesInfo

    audio_token = processor.info.get_hf_config().audio_token_id
    return [
        PlaceholderFeaturesInfo(
            modality="audio",
            item_idx=clips + n,
            start_idx=video.start_idx,
            tokens=video.tokens,
            is_embed=torch.tensor(video.tokens) == audio_token,
        )
        for n, video in enumerate(placeholders["video"])
    ]
