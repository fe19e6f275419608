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

from tests.support import background

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_bench_gpu():
    if "bench_gpu" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_gpu", BENCHMARKS / "gpu" / "bench_gpu.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_gpu"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules["bench_gpu"]


@pytest.mark.slow  # ~40 s on a loaded 2-core machine, mostly imports; CI runs it
def test_bench_gpu_cpu_smoke(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu" / "bench_gpu.py"), "--cpu-smoke", "--quiet", "--json", str(out)],
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


@pytest.mark.slow  # two clef runs through the stand-in worker; CI runs it
def test_bench_feed_vllm_stand_in_smoke(tmp_path):
    """bench_feed.py --engine vllm drives clef's real worker module through its stand-in engine:
    every record scored at the real width, the device measured busy, the JSON shaped as the HF
    bench's (so a change to the worker's protocol that the stand-in does not follow fails here)."""
    out = tmp_path / "feed.json"
    command = [sys.executable, str(BENCHMARKS / "feed" / "bench_feed.py"), "--engine", "vllm", "--sets", "text,image"]
    command += ["--scale", "0.1", "--workers", "1", "--device-rate", "200000", "--hidden-states", "keep"]
    command += ["--hidden-size", "512", "--media-dir", str(tmp_path / "media"), "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=BENCHMARKS)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["engine"] == "vllm" and report["hidden_size"] == 512
    for name in ("text", "image"):
        result = report["sets"][name]
        run = result["runs"]["1"]
        assert run["failed"] == 0 and run["records"] == result["records"], run
        assert 0 < result["busy"]["1"] <= 1 and 0 < result["busy_head_excluded"]["1"] <= 1
        assert run["hidden_bytes_written"] >= run["tokens"] * 512 * 2  # bf16 states of every token kept
        assert run["main_thread_cpu_us_per_token_head_excluded"] > 0


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
        [
            sys.executable,
            str(BENCHMARKS / "gpu" / "bench_gpu.py"),
            "--cpu-smoke",
            "--family",
            "dense",
            "--quiet",
            "--json",
            str(out),
        ],
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
        assert point["full_model_tokens_per_s_estimate"] == pytest.approx(point["tokens_per_s"] * report["layers"] / 32)


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


def load_benchmark(name: str):
    """A benchmark by its path under benchmarks/ (`gpu/gpu_env`), loaded as a module."""
    spec = importlib.util.spec_from_file_location(Path(name).name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GPU_IMAGE = {"torch", "transformers", "tokenizers", "pyarrow", "numpy", "typer", "rich"}
"""What the GPU machine's image has (issue 24); the rest must be carried or be left out on purpose."""
IMPORT_NAMES = {"PIL": "pillow", "huggingface_hub": "huggingface-hub", "yaml": "pyyaml"}


def third_party_imports(paths) -> set[str]:
    """Top-level modules imported anywhere in these files, not from the standard library or clef."""
    import ast

    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    local = {"clef_cli", "benchmarks", "tests"}
    return {IMPORT_NAMES.get(name, name) for name in names - set(sys.stdlib_module_names) - local}


def test_every_import_of_clef_and_the_gpu_check_is_on_the_image_carried_or_named_as_left_out():
    listed = (BENCHMARKS / "gpu" / "gpu_wheels.txt").read_text()
    carried = {line.split("==")[0] for line in listed.splitlines() if line and not line.startswith("#")}
    left_out = {"torchvision", "pillow", "soundfile", "scipy", "matplotlib", "ray", "vllm", "obstore"}
    for name in left_out:  # each one is named, with why, in the list's comments
        assert name in listed.split("Not carried:")[1].split("# Python:")[0], name
    steps = ["gpu/bench_gpu", "score/bench_score", "feed/bench_feed", "feed/feed_vllm", "feed/vllm_stand_in"]
    steps += ["gpu/gpu_env", "gpu/gpu_parity", "gpu/gpu_summary", "gpu/vllm_chunked"]
    sources = [*Path(BENCHMARKS.parent / "clef_cli").rglob("*.py"), *(BENCHMARKS / f"{s}.py" for s in steps)]
    imported = third_party_imports(sources)
    assert {"av", "transformers", "safetensors", "torch"} <= imported  # the scan sees real imports
    missing = imported - GPU_IMAGE - carried - left_out
    assert not missing, f"imported but neither on the GPU image, carried nor named as left out: {sorted(missing)}"
    assert "transformers" in carried and "av" in carried


@pytest.mark.parametrize(
    ("wheel", "python", "fits"),
    [
        ("transformers-5.24.0-py3-none-any.whl", (3, 12), True),
        ("av-18.1.0-cp311-abi3-manylinux_2_28_x86_64.whl", (3, 12), True),
        ("av-18.1.0-cp311-abi3-manylinux_2_28_x86_64.whl", (3, 10), False),
        ("regex-2026.11.19-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", (3, 11), True),
        ("regex-2026.11.19-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", (3, 12), False),
        ("regex-2026.11.19-cp312-cp312-macosx_11_0_arm64.whl", (3, 12), False),
    ],
)
def test_only_wheels_that_fit_the_interpreter_are_unpacked(wheel, python, fits):
    assert load_benchmark("gpu/gpu_env").fits(wheel, python) is fits


@pytest.mark.slow  # the quick loop's budget (issue 36.12): CI's whole run has it
def test_gpu_check_cpu_smoke_runs_every_step():
    """The script's steps at tiny sizes on the CPU: every step ends with exit 0 and the summary
    holds each step's figures (parity within the float32 fixtures' fallback bound). The run is
    started with the session and this test comes last (tests/support/background.py): it is six fresh
    interpreters, so it runs beside the in-process tests."""
    run = background.run("gpu-check")
    returncode = run.wait(timeout=900)
    out = run.folder / "out"
    log = (out / "gpu_check.log").read_text()
    assert returncode == 0, log[-3000:]
    steps = ["environment", "parity", "gpu-omni", "gpu-dense", "score", "feed", "summary"]
    for step in steps:
        assert f"=== {step}: exit 0 " in log, (step, log[-3000:])
    files = sorted(path.name for path in out.iterdir())
    assert len(files) <= 8 and {"summary.json", "parity.json", "gpu_omni.json", "environment.json"} <= set(files)
    summary = json.loads((out / "summary.json").read_text())
    version = summary["environment"]["modules"]["transformers"]["version"]
    assert tuple(int(part) for part in version.split(".")[:2]) >= (5, 23)
    parity = {(row["family"], row["dtype"]): row for row in summary["parity"]}
    assert set(parity) == {(f, d) for f in ("omni", "dense") for d in ("float32", "bfloat16")}
    for (_, dtype), row in parity.items():
        assert "error" not in row, row
        if dtype == "float32":
            assert row["alone_vs_reference"]["logit"] <= 1e-4 and row["batched_vs_alone"]["logit"] <= 1e-4
    assert {"grouped_mm", "eager"} <= set(summary["gpu_omni"]["points"]) and "dense" in summary["gpu_dense"]["points"]
    assert set(summary["score"]) == {"text", "mixed"} and summary["score"]["text"]["failed"] == 0
    assert summary["feed"]["text"]["busy"]["0"] > 0


def test_the_vllm_chunked_check_fails_on_each_upstream_bug():
    """vllm_chunked.py's verdict (gpu_check.sh runs it where a vLLM and a GPU are at hand) on
    states made up here: clean runs pass; compiled states wrong past the first chunk (vllm#48901),
    prefix caching on, or a rerun handed only its uncached tokens' states (vllm#44485) each fail."""
    import numpy as np

    check = load_benchmark("gpu/vllm_chunked")
    chunk, rng = 8, np.random.default_rng(0)
    prompts = [{"id": "long", "ids": list(range(30))}, {"id": "pair", "ids": list(range(20))}]
    facts = {"enforce_eager": False, "chunked_prefill": True, "max_num_batched_tokens": chunk, "prefix_caching": False}
    states = {f"first/{p['id']}": rng.standard_normal((len(p["ids"]), 4)).astype(np.float32) for p in prompts}
    states["again/pair"] = states["first/pair"].copy()

    def failures(compiled: dict, eager: dict, compiled_facts: dict = facts) -> list[str]:
        runs = {"compiled": (compiled_facts, compiled), "eager": ({**facts, "enforce_eager": True}, eager)}
        return check.verdict(prompts, ["pair"], runs, chunk, "float32")[1]

    assert failures(states, states) == []
    wrong_later = {**states, "first/long": states["first/long"].copy()}
    wrong_later["first/long"][chunk:] += 0.5
    figures, found = check.verdict(
        prompts, ["pair"], {"compiled": (facts, wrong_later), "eager": (facts, states)}, chunk, "float32"
    )
    assert figures["prompts"]["long"]["compiled_vs_eager"]["first_chunk"] == 0.0
    assert len(found) == 1 and found[0].startswith("long compiled_vs_eager")
    assert "prefix caching is True" in failures(states, states, {**facts, "prefix_caching": True})[0]
    cached = {**states, "again/pair": states["again/pair"][12:]}
    assert any("8 states for 20 tokens" in failure for failure in failures(cached, states))
    assert "ran eager" in failures(states, states, {**facts, "enforce_eager": True})[0]
    short = {name: array for name, array in states.items() if "pair" in name}
    runs = {"compiled": (facts, short), "eager": (facts, short)}
    assert "was not tested" in check.verdict(prompts[1:], ["pair"], runs, 64, "float32")[1][0]  # one chunk: no test
