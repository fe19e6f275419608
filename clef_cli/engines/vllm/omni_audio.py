"""Clef-Omni's audio inside vLLM as the reference processes it. Runs in vLLM's environment, loaded
by worker.py beside it; never imports clef.

vLLM's Qwen3-Omni processor pads every clip with zeros to a whole number of mel hops (160
samples) before the feature extractor sees it, "so the cache works", and then counts each clip's
frames from the padded length. The reference hands the extractor the clip as it is. For a clip
whose length is not a multiple of 160 the two differ: the padded clip has one mel frame more, and
its last frames see zeros where the extractor's own centred STFT would reflect the clip's end.
A video's soundtrack is such a clip (48,298 samples for sample_data's delivery_clip.mp4: 302
frames in vLLM, 301 in the reference), which put audio-in-video records 1.4e-5 off the HF engine
from the first soundtrack token on (issue 38). Any clip of such a length is hit the same way.

The processor below keeps the extractor's own features, mask and lengths (the Qwen2.5-Omni
path that vLLM's Qwen3-Omni processor builds on). clef turns vLLM's processor cache off
(worker.engine_options), which is what the padding was for."""

from __future__ import annotations

from typing import Any


def with_reference_audio(model_class: type) -> type:
    """`model_class` with a multimodal processor that gives its audio the reference's features."""
    from vllm.model_executor.models.clef_omni import ClefOmniMultiModalProcessor
    from vllm.model_executor.models.qwen2_5_omni_thinker import Qwen2_5OmniThinkerMultiModalProcessor
    from vllm.model_executor.models.qwen3_omni_moe_thinker import (
        Qwen3OmniMoeThinkerDummyInputsBuilder,
        Qwen3OmniMoeThinkerProcessingInfo,
    )
    from vllm.multimodal import MULTIMODAL_REGISTRY

    unpadded = Qwen2_5OmniThinkerMultiModalProcessor

    class ClefOmniReferenceAudio(ClefOmniMultiModalProcessor):
        def _get_hf_mm_inputs(self, mm_items: Any, hf_kwargs: Any) -> Any:
            return unpadded._get_hf_mm_inputs(self, mm_items, hf_kwargs)

        def _postprocess_hf_mm_data(self, hf_data: Any, hf_kwargs: Any, processed_data: Any) -> Any:
            return unpadded._postprocess_hf_mm_data(self, hf_data, hf_kwargs, processed_data)

    register = MULTIMODAL_REGISTRY.register_processor(
        ClefOmniReferenceAudio,
        info=Qwen3OmniMoeThinkerProcessingInfo,
        dummy_inputs=Qwen3OmniMoeThinkerDummyInputsBuilder,
    )
    return register(model_class)
