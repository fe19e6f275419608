"""The dense family's vLLM-ready tiny release (issue 38), made from tests/fixtures/tiny-clef-dense
by tests/vllm_release.py (`python -m tests.vllm_release --family dense OUT_DIR`).

The same surgery as Omni's: vLLM's CPU attention refuses the fixture's text head size of 16, so
the full-attention layers get 2 query heads and 1 KV head of 32 (the gated query projection
keeps its shape, 2 x 32 x 2 rows), `mrope_section` doubled for the doubled rotary width; the
attention weights are drawn again from a fixed seed, the Gated DeltaNet layers, the vision tower
and the rest are copied. The index file is written by the caller. Qwen3.5's q/k norms scale by
(1 + weight), so they are drawn around 0 (Omni's around 1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).parent / "fixtures" / "tiny-clef-dense"
SEED = 35
HEAD_DIM, HEADS, KV_HEADS = 32, 2, 1
COPIED = (
    "generation_config.json",
    "joint_head.safetensors",
    "joint_head_config.json",
    "processor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
ATTENTION = "model.language_model.layers."


def dense_config() -> dict[str, Any]:
    """The source config with the wider text heads (and M-RoPE sections widened to match)."""
    config = json.loads((SOURCE / "config.json").read_text())
    text = config["text_config"]
    text.update(head_dim=HEAD_DIM, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS)
    rope = text["rope_parameters"]
    rope["mrope_section"] = [2 * size for size in rope["mrope_section"]]
    return config


def dense_weights(hidden: int) -> dict[str, Any]:
    """The source weights with the full-attention layers redrawn for the new head layout."""
    import torch
    from safetensors.torch import load_file

    weights = load_file(SOURCE / "model.safetensors")
    generator = torch.Generator().manual_seed(SEED)
    shapes = {
        "q_proj.weight": (HEADS * HEAD_DIM * 2, hidden),  # the query and its output gate
        "k_proj.weight": (KV_HEADS * HEAD_DIM, hidden),
        "v_proj.weight": (KV_HEADS * HEAD_DIM, hidden),
        "o_proj.weight": (hidden, HEADS * HEAD_DIM),
    }
    for name in sorted(weights):
        if not name.startswith(ATTENTION) or ".self_attn." not in name:
            continue
        suffix = name.split(".self_attn.", 1)[1]
        if suffix in shapes:
            weights[name] = torch.randn(shapes[suffix], generator=generator) * 0.08
        elif suffix in ("q_norm.weight", "k_norm.weight"):
            weights[name] = 0.1 * torch.randn(HEAD_DIM, generator=generator)
    return weights


def config_and_weights() -> tuple[dict[str, Any], dict[str, Any]]:
    config = dense_config()
    return config, dense_weights(config["text_config"]["hidden_size"])
