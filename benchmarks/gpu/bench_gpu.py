"""Prefill throughput of the Qwen3-Omni thinker's text stack on one GPU, with random weights.

    python benchmarks/gpu/bench_gpu.py --json gpu.json            # one H200: under 5 minutes
    python benchmarks/gpu/bench_gpu.py --layers 8 --budgets 65536
    python benchmarks/gpu/bench_gpu.py --cpu-smoke                # tiny sizes on the CPU (the tests run this)

The model is transformers' own `Qwen3OmniMoeThinkerTextModel` with the real text dimensions of
Clef-Omni (Qwen3-Omni-30B-A3B: hidden 2048, 32 query / 4 KV heads of 128, 128 experts with top-8
routing, expert width 768, vocabulary 152064, interleaved M-RoPE) but only `--layers` decoder
layers (the real thinker has 48), in bf16, with SDPA attention. No checkpoint is needed: the
weights are random, which changes nothing about the cost (routing spreads tokens over experts
roughly evenly, as a trained router does on average).

It sweeps the token budget (`--budgets`, padded tokens per forward) over records of equal
length (`--lengths`): batch size = max(1, budget // length), no padding. For each point and each
experts implementation (`grouped_mm`: one grouped GEMM over all experts; `eager`: a Python loop
over experts) it reports prefill tokens/s, MFU and peak memory.

FLOPs per forward (multiply-adds count 2), per layer and token, with L the record length:
    attention projections  2 * d * (H*h + 2*K*h) + 2 * (H*h) * d
    attention (causal)     4 * H * h * (L + 1) / 2      (QK^T and AV over the tokens before it)
    router                 2 * d * E
    experts                k * 3 * 2 * d * m             (gate, up and down of k experts)
with d=2048, H=32, K=4, h=128, E=128, k=8, m=768. Norms, rotary embeddings and the softmax are
not counted. MFU = FLOPs / seconds / peak, peak = 989 TFLOP/s (H200 dense bf16).
A 48-layer thinker runs at about tokens/s x layers / 48 on the same GPU.

`--family dense` measures Clef-Flash's stack instead (transformers' `Qwen3_5TextModel`: hidden
4096, SwiGLU width 12288, three Gated DeltaNet layers then one gated-attention layer, 16 query /
4 KV heads of 256, 16 key / 32 value linear heads of 128; Clef-Flash has 32 layers), with the
FLOP formula of `dense_flops_per_token`. Install `clef-cli[dense-kernels]` on the GPU machine:
without flash-linear-attention and causal-conv1d transformers runs the slow PyTorch fallbacks.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass

DENSE_FORMULA = (
    "per token: full-attention layers 2d(2Hh+2Kh) + 2Hhd + 4Hh(L+1)/2 + 6d*i; Gated DeltaNet layers "
    "2d(2Kk+Vv) + 2dVv + 4dV + 2Vvd + V(6kv + 3*64(k+v)) + 6d*i (K, V: key and value heads, k, v: their widths)"
)
DELTA_CHUNK = 64
"""Tokens per chunk of transformers' chunked gated delta rule."""
PEAK_TFLOPS = 989.0
"""H200 SXM dense bf16 tensor-core peak, TFLOP/s."""


@dataclass(frozen=True)
class TextDims:
    hidden: int = 2048
    heads: int = 32
    kv_heads: int = 4
    head_dim: int = 128
    experts: int = 128
    top_k: int = 8
    expert_width: int = 768
    vocab: int = 152064
    mrope_section: tuple[int, int, int] = (24, 20, 20)
    full_layers: int = 48


@dataclass(frozen=True)
class DenseDims:
    """Clef-Flash (Qwen3.5 9B dense): transformers' `Qwen3_5TextConfig` defaults."""

    hidden: int = 4096
    intermediate: int = 12288
    heads: int = 16
    kv_heads: int = 4
    head_dim: int = 256
    linear_key_heads: int = 16
    linear_value_heads: int = 32
    linear_key_dim: int = 128
    linear_value_dim: int = 128
    full_attention_every: int = 4
    vocab: int = 248320
    full_layers: int = 32


DENSE_SMOKE_DIMS = DenseDims(
    hidden=64,
    intermediate=96,
    heads=4,
    kv_heads=2,
    head_dim=16,
    linear_key_heads=2,
    linear_value_heads=4,
    linear_key_dim=16,
    linear_value_dim=16,
    vocab=512,
)

SMOKE_DIMS = TextDims(
    hidden=64, heads=4, kv_heads=2, head_dim=16, experts=8, top_k=2, expert_width=32, vocab=512, mrope_section=(4, 2, 2)
)


def dense_flops_per_token(dims: DenseDims, layers: int, length: int) -> float:
    """Clef-Flash's stack: every `full_attention_every`-th layer is gated attention (q_proj twice
    as wide for its output gate), the others Gated DeltaNet; all have a SwiGLU MLP. The chunked
    delta rule is counted as 6 * hk * hv (state read-out, update and carry) + 3 * C * (hk + hv)
    (the products inside a chunk of C = 64 tokens) per value head and token: an approximation,
    within a few percent of torch's FLOP counter on its PyTorch path (see the tests)."""
    d, H, K, h = dims.hidden, dims.heads, dims.kv_heads, dims.head_dim
    full = sum((index + 1) % dims.full_attention_every == 0 for index in range(layers))
    mlp = 3 * 2 * d * dims.intermediate
    attention = 2 * d * (2 * H * h + 2 * K * h) + 2 * (H * h) * d + 4 * H * h * (length + 1) / 2
    keys, values = dims.linear_key_heads * dims.linear_key_dim, dims.linear_value_heads * dims.linear_value_dim
    projections = 2 * d * (2 * keys + values) + 2 * d * values + 2 * d * 2 * dims.linear_value_heads + 2 * values * d
    hk, hv = dims.linear_key_dim, dims.linear_value_dim
    recurrence = dims.linear_value_heads * (6 * hk * hv + 3 * DELTA_CHUNK * (hk + hv))
    return full * (attention + mlp) + (layers - full) * (projections + recurrence + mlp)


def flops_per_token(dims: TextDims | DenseDims, layers: int, length: int, causal: bool = True) -> float:
    """The formula of the module docstring; `causal=False` counts attention over all L tokens
    (what a dense attention kernel computes), for comparison with a FLOP counter."""
    if isinstance(dims, DenseDims):
        return dense_flops_per_token(dims, layers, length)
    d, H, K, h = dims.hidden, dims.heads, dims.kv_heads, dims.head_dim
    projections = 2 * d * (H * h + 2 * K * h) + 2 * (H * h) * d
    context = (length + 1) / 2 if causal else length
    attention = 4 * H * h * context
    router = 2 * d * dims.experts
    experts = dims.top_k * 3 * 2 * d * dims.expert_width
    return layers * (projections + attention + router + experts)


def build_model(dims: TextDims, layers: int, dtype, device, experts_impl: str):
    """A random-weight thinker text stack with its experts and attention backends pinned and checked."""
    import torch
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeTextConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerTextModel

    config = Qwen3OmniMoeTextConfig(
        vocab_size=dims.vocab,
        hidden_size=dims.hidden,
        num_hidden_layers=layers,
        num_attention_heads=dims.heads,
        num_key_value_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        num_experts=dims.experts,
        num_experts_per_tok=dims.top_k,
        moe_intermediate_size=dims.expert_width,
        max_position_embeddings=65536,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1_000_000.0,
            "mrope_section": list(dims.mrope_section),
            "interleaved": True,
        },
    )
    torch.manual_seed(0)
    model = Qwen3OmniMoeThinkerTextModel._from_config(
        config, dtype=dtype, attn_implementation="sdpa", experts_implementation=experts_impl
    )
    model.to(device).eval().requires_grad_(False)
    got = model.get_experts_implementation()[""]
    if got != experts_impl:
        raise RuntimeError(f"asked for experts_implementation={experts_impl!r}, transformers chose {got!r}")
    if model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"attention is {model.config._attn_implementation!r}, not sdpa")
    return model


def build_dense_model(dims: DenseDims, layers: int, dtype, device):
    """A random-weight Clef-Flash text stack (Gated DeltaNet + gated attention), SDPA attention."""
    import torch
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextModel

    config = Qwen3_5TextConfig(
        vocab_size=dims.vocab,
        hidden_size=dims.hidden,
        intermediate_size=dims.intermediate,
        num_hidden_layers=layers,
        num_attention_heads=dims.heads,
        num_key_value_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        linear_num_key_heads=dims.linear_key_heads,
        linear_num_value_heads=dims.linear_value_heads,
        linear_key_head_dim=dims.linear_key_dim,
        linear_value_head_dim=dims.linear_value_dim,
        full_attention_interval=dims.full_attention_every,
    )
    torch.manual_seed(0)
    model = Qwen3_5TextModel._from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval().requires_grad_(False)


def measure(
    model, dims: TextDims | DenseDims, layers: int, batch: int, length: int, device, min_seconds: float
) -> dict:
    """Median-free and simple: one warm-up forward, then forwards until `min_seconds` (at least 2)."""
    import torch

    generator = torch.Generator().manual_seed(batch * 100003 + length)
    ids = torch.randint(0, dims.vocab, (batch, length), generator=generator).to(device)
    mask = torch.ones_like(ids)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=mask, use_cache=False)
        sync()
        runs, started = 0, time.perf_counter()
        while runs < 2 or time.perf_counter() - started < min_seconds:
            model(input_ids=ids, attention_mask=mask, use_cache=False)
            sync()
            runs += 1
        seconds = (time.perf_counter() - started) / runs
    tokens = batch * length
    flops = flops_per_token(dims, layers, length) * tokens
    return {
        "batch_size": batch,
        "tokens_per_forward": tokens,
        "seconds_per_forward": seconds,
        "tokens_per_s": tokens / seconds,
        "tflops": flops / seconds / 1e12,
        "mfu": flops / seconds / (PEAK_TFLOPS * 1e12),
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
        "full_model_tokens_per_s_estimate": tokens / seconds * layers / dims.full_layers,
    }


def run(args: argparse.Namespace) -> dict:
    import torch

    smoke, dense = args.cpu_smoke, args.family == "dense"
    if dense:
        dims: TextDims | DenseDims = DENSE_SMOKE_DIMS if smoke else DenseDims()
    else:
        dims = SMOKE_DIMS if smoke else TextDims()
    device = torch.device("cpu" if smoke else args.device)
    dtype = torch.float32 if smoke else torch.bfloat16
    budgets = [int(value) for value in args.budgets.split(",")]
    lengths = [int(value) for value in args.lengths.split(",")]
    results: list[dict] = []
    started = time.perf_counter()
    for impl in ["dense"] if dense else args.experts.split(","):
        try:
            if dense:
                model = build_dense_model(dims, args.layers, dtype, device)
            else:
                model = build_model(dims, args.layers, dtype, device, impl)
        except (RuntimeError, ValueError, ImportError) as error:
            results.append({"experts": impl, "error": f"{type(error).__name__}: {error}"})
            continue
        for budget in budgets:
            for length in lengths:
                point = {"experts": impl, "max_batch_tokens": budget, "record_tokens": length}
                batch = max(1, budget // length)
                try:
                    point |= measure(model, dims, args.layers, batch, length, device, args.min_seconds)
                except torch.OutOfMemoryError:
                    point["error"] = "out of memory"
                    torch.cuda.empty_cache()
                results.append(point)
                if not args.quiet:
                    shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in point.items()}
                    print(json.dumps(shown), flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "family": args.family,
        "layers": args.layers,
        "dims": asdict(dims),
        "dtype": str(dtype).removeprefix("torch."),
        "peak_tflops": PEAK_TFLOPS,
        "flop_formula": DENSE_FORMULA
        if dense
        else "per layer and token: 2d(Hh+2Kh) + 2Hhd + 4Hh(L+1)/2 + 2dE + k*6*d*m",
        "seconds": time.perf_counter() - started,
        "results": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--family", choices=("omni", "dense"), default="omni", help="omni: Clef-Omni's MoE thinker; dense: Clef-Flash"
    )
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (the thinker has 48, Clef-Flash 32)")
    parser.add_argument("--budgets", default="16384,65536,131072", help="padded tokens per forward")
    parser.add_argument("--lengths", default="1024,4096,16384", help="record lengths in tokens")
    parser.add_argument("--experts", default="grouped_mm,eager", help="experts implementations to compare")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--min-seconds", type=float, default=1.0, help="time each point for at least this long")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny dimensions on the CPU, a few seconds")
    parser.add_argument("--json", help="also write the report to this file")
    parser.add_argument("--quiet", action="store_true", help="print only the final JSON")
    args = parser.parse_args()
    if args.cpu_smoke:
        args.layers = min(args.layers, 2)
        args.budgets, args.lengths, args.min_seconds = "64,256", "16,64", 0.0
    report = run(args)
    text = json.dumps(report)
    print(text)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
