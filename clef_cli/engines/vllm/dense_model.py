"""The dense family (Qwen3.5: Gated DeltaNet + attention) as a vLLM model that returns hidden
states (issue 38). Like worker.py it runs in vLLM's own environment and never imports clef; the
worker loads it from its path (its folder is not on sys.path there).

vLLM's `Qwen3_5ForConditionalGeneration` is a generation model; the subclass makes it a pooling
model whose pooler hands back every token's final hidden state (the worker's all-tokens pooler),
so clef's joint head scores them as it does the HF engine's (cut (b), docs/engines.md). Its
multimodal processor (Qwen3-VL's) and weight loading are inherited unchanged.

On the CPU in fp32 the Gated DeltaNet layers run `exact_forward` below: vLLM's CPU kernels for
them (`chunk_gated_delta_rule_cpu`, `fused_gdn_gating_cpu`) take bf16 only ("CPU GDN attention
requires BF16."; in fp32 every request fails). It is the PyTorch path transformers runs on the
CPU (the HF engine's): the causal convolution, then the chunked gated delta rule, per request,
reading and writing vLLM's conv and recurrent state slots so chunked prefill carries on."""

from __future__ import annotations

import json
import os
from functools import partial
from typing import Any

ARCHITECTURE = "ClefDenseHiddenStates"
MODEL_TYPES = ("qwen3_5",)
"""The dense model types proven exact against the HF engine (Clef, Clef-Flash; not Qwen3.5-MoE)."""


def architecture(model: str) -> str | None:
    """The architecture clef registers for the release at `model`, or None if not a dense one."""
    with open(os.path.join(model, "config.json")) as file:
        model_type = json.load(file).get("model_type")
    return ARCHITECTURE if model_type in MODEL_TYPES else None


def register(pooler_class: Any) -> None:
    """Register the hidden-states subclass; `pooler_class(head)` is the worker's all-tokens pooler."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.interfaces_base import default_pooling_type
    from vllm.model_executor.models.qwen3_5 import Qwen3_5ForConditionalGeneration

    @default_pooling_type(tok_pooling_type="ALL")
    class ClefDenseHiddenStates(Qwen3_5ForConditionalGeneration):
        is_pooling_model = True

        def __init__(self, *, vllm_config: Any, prefix: str = "model") -> None:
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            self.pooler = pooler_class(None)  # no head inside vLLM: clef's head scores the states
            if needs_exact_gdn(vllm_config.model_config.dtype):
                use_exact_gdn(self)

    ModelRegistry.register_model(ARCHITECTURE, ClefDenseHiddenStates)


def needs_exact_gdn(dtype: Any) -> bool:
    """On the CPU vLLM's Gated DeltaNet kernels take bf16 alone; any other dtype runs ours."""
    import torch
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu()) and dtype != torch.bfloat16


def use_exact_gdn(model: Any) -> None:
    """Every Gated DeltaNet layer of `model` runs `exact_forward`."""
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

    for module in model.modules():
        if isinstance(module, QwenGatedDeltaNetAttention):
            if module.gqa_interleaved_layout:  # Qwen3-Next's packing: not a Qwen3.5 layer
                raise ValueError("an interleaved Gated DeltaNet layout has no exact CPU path here")
            module._forward_method = partial(exact_forward, module)


def exact_forward(layer: Any, hidden_states: Any) -> Any:
    """vLLM's `forward_cpu` for Qwen3.5's flat [q, k, v, z] / [b, a] packing, with `exact_core`."""
    import torch

    mixed_qkvz, _ = layer.in_proj_qkvz(hidden_states)
    ba, _ = layer.in_proj_ba(hidden_states)
    qkv_size = (layer.key_dim * 2 + layer.value_dim) // layer.tp_size
    mixed_qkv, z = mixed_qkvz.split([qkv_size, layer.value_dim // layer.tp_size], dim=-1)
    z = z.reshape(z.size(0), -1, layer.head_v_dim)
    b, a = ba.chunk(2, dim=-1)
    heads = layer.num_v_heads // layer.tp_size
    out = torch.zeros((hidden_states.size(0), heads, layer.head_v_dim), dtype=hidden_states.dtype)
    exact_core(layer, mixed_qkv, b, a, out)
    return layer._output_projection(out, z)


def exact_core(layer: Any, mixed_qkv: Any, b: Any, a: Any, out: Any) -> None:
    """The convolution and the delta rule for each request of the step, into `out`, from and into
    its state slot (zeros where the request has no earlier chunk)."""
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    metadata = get_forward_context().attn_metadata
    if metadata is None:  # the profiling run
        return
    step = metadata[layer.prefix]
    if step.num_actual_tokens == 0:
        return
    if step.spec_sequence_masks is not None or step.num_accepted_tokens is not None:
        raise ValueError("speculative decoding has no exact CPU Gated DeltaNet path here")
    conv_states = layer.kv_cache[0] if is_conv_state_dim_first() else layer.kv_cache[0].transpose(-1, -2)
    slots, heads, v_dim, k_dim = layer.kv_cache[1].shape
    recurrent_states = layer.kv_cache[1].view(slots, heads, k_dim, v_dim)
    starts = step.non_spec_query_start_loc.tolist()
    indices = step.non_spec_state_indices_tensor.tolist()
    earlier = step.has_initial_state.tolist() if step.has_initial_state is not None else [True] * len(indices)
    for n, slot in enumerate(indices):
        begin, end = starts[n], starts[n + 1]
        if not earlier[n]:
            conv_states[slot].zero_()
            recurrent_states[slot].zero_()
        mixed = convolve(layer, mixed_qkv[begin:end], conv_states[slot])
        out[begin:end] = delta_rule(layer, mixed, b[begin:end], a[begin:end], recurrent_states[slot])


def convolve(layer: Any, mixed_qkv: Any, conv_state: Any) -> Any:
    """transformers' `causal_conv1d_update` on one request: [L, dim] after the state's
    `kernel - 1` earlier inputs (zeros at a prompt's start: its padded convolution), then SiLU;
    the state keeps the last `kernel - 1` inputs."""
    import torch
    import torch.nn.functional as F

    state_len = conv_state.shape[-1]
    inputs = torch.cat([conv_state, mixed_qkv.transpose(0, 1)], dim=-1)
    conv_state.copy_(inputs[:, -state_len:])
    weight = layer.conv1d.weight.view(layer.conv1d.weight.size(0), 1, -1)
    convolved = F.conv1d(inputs[None], weight, layer.conv1d.bias, groups=inputs.shape[0])[0]
    return F.silu(convolved[:, -mixed_qkv.shape[0] :]).transpose(0, 1)


def delta_rule(layer: Any, mixed_qkv: Any, b: Any, a: Any, state: Any) -> Any:
    """The gated delta rule on one request's [L, dim] from `state` [H, K, V] (updated in place),
    gated as transformers' Qwen3.5 layer gates it; returns [L, H, V]."""
    import torch.nn.functional as F

    length = mixed_qkv.shape[0]
    query, key, value = mixed_qkv.split([layer.key_dim // layer.tp_size] * 2 + [layer.value_dim // layer.tp_size], -1)
    query = query.reshape(1, length, -1, layer.head_k_dim)
    key = key.reshape(1, length, -1, layer.head_k_dim)
    value = value.reshape(1, length, -1, layer.head_v_dim)
    groups = value.shape[2] // key.shape[2]  # each q/k head serves this many consecutive v heads
    query, key = query.repeat_interleave(groups, dim=2), key.repeat_interleave(groups, dim=2)
    beta = b.sigmoid()[None]
    g = (-layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias))[None]
    out, final = chunk_gated_delta_rule(query, key, value, g, beta, state[None])
    state.copy_(final[0])
    return out[0]


def chunk_gated_delta_rule(query: Any, key: Any, value: Any, g: Any, beta: Any, state: Any, chunk: int = 64) -> Any:
    """transformers' `torch_chunk_gated_delta_rule` (5.19 to 5.24, q/k L2-normalised in the kernel,
    heads already grouped): [B, L, H, D] inputs; returns the output and the final state."""
    import torch
    import torch.nn.functional as F

    dtype, length = query.dtype, query.shape[1]
    query, key, value, beta, g = (
        x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format) for x in (query, key, value, beta, g)
    )
    query, key = (x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6) for x in (query, key))
    query = query * query.shape[-1] ** -0.5
    pad = (chunk - length % chunk) % chunk
    query, key, value = (F.pad(x, (0, 0, 0, pad)) for x in (query, key, value))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    v_beta, k_beta = value * beta.unsqueeze(-1), key * beta.unsqueeze(-1)
    query, key, k_beta, v_beta = (
        x.reshape(x.shape[0], x.shape[1], -1, chunk, x.shape[-1]) for x in (query, key, k_beta, v_beta)
    )
    cum = g.reshape(g.shape[0], g.shape[1], -1, chunk).cumsum(dim=3)
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=query.device).triu(1)
    pairwise = (cum.unsqueeze(4) - cum.unsqueeze(3)).masked_fill(upper, float("-inf")).exp()
    system = (k_beta @ key.transpose(-1, -2)) * pairwise
    intra = (query @ key.transpose(-1, -2)) * pairwise
    new_values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    decayed = torch.linalg.solve_triangular(system, k_beta * cum.exp().unsqueeze(-1), upper=False, unitriangular=True)
    state = state.to(new_values)
    out = torch.zeros_like(new_values)
    query = query * cum.exp().unsqueeze(-1)
    key = key * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    chunk_decay = cum[..., -1].exp()[..., None, None]
    for i in range(query.shape[2]):
        v_new = new_values[:, :, i] - decayed[:, :, i] @ state
        out[:, :, i] = query[:, :, i] @ state + intra[:, :, i] @ v_new
        state = state * chunk_decay[:, :, i] + key[:, :, i].transpose(-1, -2) @ v_new
    out = out.reshape(out.shape[0], out.shape[1], -1, out.shape[-1])[:, :, :length]
    return out.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format), state
