"""The GPU benchmark's smoke mode runs, so the script never rots; its FLOP formula matches torch's
own FLOP counter on a dense-attention run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_bench_gpu():
    if "bench_gpu" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_gpu", BENCHMARKS / "bench_gpu.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_gpu"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules["bench_gpu"]


@pytest.mark.slow  # ~40 s on a loaded 2-core machine, mostly imports; CI runs it
def test_bench_gpu_cpu_smoke(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_gpu.py"), "--cpu-smoke", "--quiet", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert json.loads(done.stdout.strip().splitlines()[-1]) == report
    bench = load_bench_gpu()
    points = report["results"]
    assert {(p["experts"], p["max_batch_tokens"], p["record_tokens"]) for p in points} == {
        (impl, budget, length) for impl in ("grouped_mm", "eager") for budget in (64, 256) for length in (16, 64)
    }
    dims = bench.TextDims(**{k: tuple(v) if isinstance(v, list) else v for k, v in report["dims"].items()})
    for point in points:
        assert "error" not in point, point
        assert point["batch_size"] == max(1, point["max_batch_tokens"] // point["record_tokens"])
        tokens = point["batch_size"] * point["record_tokens"]
        assert point["tokens_per_s"] == pytest.approx(tokens / point["seconds_per_forward"])
        flops = bench.flops_per_token(dims, report["layers"], point["record_tokens"]) * tokens
        assert point["mfu"] == pytest.approx(flops / point["seconds_per_forward"] / 989e12)


@pytest.mark.parametrize("experts", ["eager", "grouped_mm"])
def test_flop_formula_matches_torch_flop_counter(experts):
    """With eager attention (dense L x L matmuls) and per-expert loops torch counts every matmul;
    grouped_mm is invisible to the counter, so there only the attention and dense parts match."""
    from torch.utils.flop_counter import FlopCounterMode

    bench = load_bench_gpu()
    dims, layers, batch, length = bench.SMOKE_DIMS, 2, 3, 40
    model = bench.build_model(dims, layers, torch.float32, torch.device("cpu"), experts)
    assert model.get_experts_implementation()[""] == experts
    model.set_attn_implementation("eager")
    ids = torch.randint(0, dims.vocab, (batch, length))
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    expected = bench.flops_per_token(dims, layers, length, causal=False) * batch * length
    if experts == "grouped_mm":
        expected -= layers * dims.top_k * 6 * dims.hidden * dims.expert_width * batch * length
    assert counter.get_total_flops() == expected


@pytest.mark.slow
def test_bench_gpu_dense_cpu_smoke(tmp_path):
    out = tmp_path / "gpu_dense.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_gpu.py"), "--cpu-smoke", "--family", "dense", "--quiet",
         "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["family"] == "dense"
    bench = load_bench_gpu()
    dims = bench.DenseDims(**report["dims"])
    points = report["results"]
    assert {(p["experts"], p["max_batch_tokens"], p["record_tokens"]) for p in points} == {
        ("dense", budget, length) for budget in (64, 256) for length in (16, 64)
    }
    for point in points:
        assert "error" not in point, point
        tokens = point["batch_size"] * point["record_tokens"]
        flops = bench.dense_flops_per_token(dims, report["layers"], point["record_tokens"]) * tokens
        assert point["mfu"] == pytest.approx(flops / point["seconds_per_forward"] / 989e12)
        assert point["full_model_tokens_per_s_estimate"] == pytest.approx(
            point["tokens_per_s"] * report["layers"] / 32
        )


def test_dense_flop_formula_is_within_a_few_percent_of_torch_flop_counter():
    """Projections, MLPs and attention are exact; the chunked delta rule is an approximation."""
    from torch.utils.flop_counter import FlopCounterMode

    bench = load_bench_gpu()
    dims, layers, batch, length = bench.DENSE_SMOKE_DIMS, 4, 2, 128
    model = bench.build_dense_model(dims, layers, torch.float32, torch.device("cpu"))
    model.set_attn_implementation("eager")
    ids = torch.randint(0, dims.vocab, (batch, length))
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    tokens = batch * length
    formula = bench.dense_flops_per_token(dims, layers, length) * tokens
    # eager attention computes the whole L x L product, where the formula counts the causal half
    full_layers = layers // dims.full_attention_every
    formula += full_layers * 4 * dims.heads * dims.head_dim * (length - (length + 1) / 2) * tokens
    assert abs(counter.get_total_flops() - formula) / formula < 0.05
