"""The models clef registers in vLLM, and what vLLM is told about a release. Runs in vLLM's
environment, loaded by worker.py beside it; never imports clef."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ARCHITECTURE = "ClefOmniHiddenStates"


def register(neighbour: Callable[[str], Any]) -> None:
    """vLLM's own Clef-Omni model with its pooler swapped for one that returns every token's
    final hidden state (the `token_embed` task, no normalisation): the head runs in clef. The
    dense family's class (dense_model.py) is registered beside it; `neighbour` loads a module of
    this folder by its path."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.clef_omni import ClefOmniForJointSchema

    from_hidden = _all_tokens_pooler()

    class ClefOmniHiddenStates(ClefOmniForJointSchema):
        def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            self.pooler = from_hidden(self.pooler.head)  # the head's weights still load; clef's head scores

    ModelRegistry.register_model(ARCHITECTURE, neighbour("omni_audio").with_reference_audio(ClefOmniHiddenStates))
    neighbour("dense_model").register(from_hidden)


def _all_tokens_pooler() -> Any:
    """A pooler class that hands back each prompt's [L, H] hidden states as they are."""
    from vllm.model_executor.layers.pooler import Pooler, PoolingParamsUpdate
    from vllm.model_executor.layers.pooler.tokwise.methods import AllPool

    class HiddenStatesPooler(Pooler):
        def __init__(self, head: Any) -> None:
            super().__init__()
            self.pooling = AllPool()
            self.head = head

        def get_supported_tasks(self) -> set[str]:
            return {"token_embed"}

        def get_pooling_updates(self, task: str) -> PoolingParamsUpdate:
            return PoolingParamsUpdate()

        def forward(self, hidden_states: Any, pooling_metadata: Any) -> Any:
            return self.pooling(hidden_states, pooling_metadata)

    return HiddenStatesPooler


def release_overrides(head_config: dict[str, Any], architecture: str = ARCHITECTURE) -> Any:
    """What vLLM must be told about a Clef release: the architecture (Omni's, or dense_model.py's
    for Qwen3.5), the head's config, and that its M-RoPE is interleaved. The reference
    (transformers' Qwen3-Omni thinker) always interleaves the T/H/W sections; vLLM does so only
    when `mrope_interleaved` is set, and otherwise gives vision tokens (whose three positions
    differ) other rotations (issue 33)."""

    def override(config: Any) -> Any:
        config.architectures = [architecture]
        config.joint_head_config = head_config
        for holder in (getattr(config, "thinker_config", None), config):
            text = getattr(holder, "text_config", None)
            for name in ("rope_parameters", "rope_scaling"):
                rope = getattr(text, name, None)
                if isinstance(rope, dict) and "mrope_section" in rope:
                    rope["mrope_interleaved"] = True
        return config

    return override
