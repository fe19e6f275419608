"""The dense family's vLLM-ready tiny release (issue 38), made from tests/fixtures/tiny-clef-dense
by tests/support/vllm_release.py (`python -m tests.support.vllm_release --family dense OUT_DIR`).

What vLLM needs that the fixture lacks (the index file is written by the caller):
- a text head size its CPU attention takes (32, not 16): the full-attention layers get 2 query
  heads and 1 KV head of 32 (the gated query projection keeps its shape, 2 x 32 x 2 rows) and
  `mrope_section` doubled for the doubled rotary width;
- Gated DeltaNet head sizes its CPU kernels take (`chunk_gated_delta_rule_cpu`, bf16 only: 64 or
  128; 16 and 32 fail "Unexpected head dim size"): key and value heads of 64, the same counts.
Those layers are drawn again from a fixed seed; the MLPs, norms, embeddings, lm_head and vision
tower are copied. The Gated DeltaNet layers are drawn at scales where they matter: in the fixture
(std 0.02 weights, A = exp(A_log) ~ 9) each token's decay is ~exp(-13), so the recurrent state
forgets at once and an error in carrying it (across chunked prefill) would not show. Here A is
drawn in [exp(-4), 1], so the slowest heads still keep a quarter of their state over a 64-token
chunk. Qwen3.5's q/k norms scale by (1 + weight), so they are drawn around 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).parents[1] / "fixtures" / "tiny-clef-dense"
SEED = 35
HEAD_DIM, HEADS, KV_HEADS = 32, 2, 1
LINEAR_HEAD_DIM = 64
COPIED = (
    "generation_config.json",
    "joint_head.safetensors",
    "joint_head_config.json",
    "processor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
LAYERS = "model.language_model.layers."


def dense_config() -> dict[str, Any]:
    """The source config with the wider heads (and M-RoPE sections widened to match)."""
    config = json.loads((SOURCE / "config.json").read_text())
    text = config["text_config"]
    text.update(head_dim=HEAD_DIM, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS)
    text.update(linear_key_head_dim=LINEAR_HEAD_DIM, linear_value_head_dim=LINEAR_HEAD_DIM)
    rope = text["rope_parameters"]
    rope["mrope_section"] = [2 * size for size in rope["mrope_section"]]
    return config


def attention_draws(hidden: int, generator: Any) -> dict[str, Any]:
    """A full-attention layer's weights, by name after `.self_attn.`."""
    import torch

    draw = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    return {
        "q_proj.weight": 0.08 * draw(HEADS * HEAD_DIM * 2, hidden),  # the query and its output gate
        "k_proj.weight": 0.08 * draw(KV_HEADS * HEAD_DIM, hidden),
        "v_proj.weight": 0.08 * draw(KV_HEADS * HEAD_DIM, hidden),
        "o_proj.weight": 0.08 * draw(hidden, HEADS * HEAD_DIM),
        "q_norm.weight": 0.1 * draw(HEAD_DIM),
        "k_norm.weight": 0.1 * draw(HEAD_DIM),
    }


def linear_draws(text: dict[str, Any], generator: Any) -> dict[str, Any]:
    """A Gated DeltaNet layer's weights, by name after `.linear_attn.`."""
    import torch

    draw = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    hidden, keys, values = text["hidden_size"], text["linear_num_key_heads"], text["linear_num_value_heads"]
    conv = (2 * keys + values) * LINEAR_HEAD_DIM
    return {
        "in_proj_qkv.weight": 0.08 * draw(conv, hidden),
        "in_proj_z.weight": 0.08 * draw(values * LINEAR_HEAD_DIM, hidden),
        "in_proj_a.weight": 0.08 * draw(values, hidden),
        "in_proj_b.weight": 0.08 * draw(values, hidden),
        "conv1d.weight": 0.3 * draw(conv, 1, text["linear_conv_kernel_dim"]),
        "A_log": -4.0 + 4.0 * torch.rand(values, generator=generator),
        "dt_bias": 0.5 * draw(values),
        "norm.weight": 1.0 + 0.1 * draw(LINEAR_HEAD_DIM),
        "out_proj.weight": 0.08 * draw(hidden, values * LINEAR_HEAD_DIM),
    }


def dense_weights(text: dict[str, Any]) -> dict[str, Any]:
    """The source weights with every token mixer redrawn for the new head layout (seeded)."""
    import torch
    from safetensors.torch import load_file

    weights = load_file(SOURCE / "model.safetensors")
    generator = torch.Generator().manual_seed(SEED)
    for layer, kind in enumerate(text["layer_types"]):
        mixer, draws = (
            ("self_attn", attention_draws(text["hidden_size"], generator))
            if kind == "full_attention"
            else ("linear_attn", linear_draws(text, generator))
        )
        prefix = f"{LAYERS}{layer}.{mixer}."
        assert {name for name in weights if name.startswith(prefix)} == {prefix + name for name in draws}
        weights |= {prefix + name: value for name, value in draws.items()}
    return weights


def config_and_weights() -> tuple[dict[str, Any], dict[str, Any]]:
    config = dense_config()
    return config, dense_weights(config["text_config"])
