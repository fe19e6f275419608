"""clef's vLLM engine, compiled (CUDA graphs) against eager, on prompts longer than one prefill
chunk, and prefix caching off for clef's pooling requests: a step of gpu_check.sh.

    python benchmarks/gpu/vllm_chunked.py --json vllm_chunked.json     # $CLEF_VLLM_PYTHON is vLLM's

Two upstream bugs this guards against. Compiled pooling gave wrong states past the first prefill
chunk (vllm#48901): so the tiny vLLM-ready release is loaded twice, each time in a fresh vLLM
process through the worker's own `load` and `encode` (clef_cli/engines/vllm/worker.py), with
clef's engine options (compiled mode and CUDA graphs on CUDA; `enforce_eager` for the second) and
`max_num_batched_tokens` cut to `--chunk`, so that the long prompts run in 2 to 4 chunks; their
final hidden states (what clef's head scores) are compared token by token, within the first
chunk and past it. With prefix caching on, vLLM hands the pooler only the states of the tokens it
did not find cached (vllm#44485): each engine reports its prefix-caching setting as built, and two
prompts sharing a long prefix run, then the second runs again: every output must have a state per
prompt token, and the rerun must equal the first run.

The figures are printed; any failure is printed as `FAILED: ...` and the exit status is 1. On
vLLM's CPU build the worker always runs eager, so there the two engines are the same mode (the
run says so) and only the chunking and prefix-caching checks mean anything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "clef_cli" / "engines" / "vllm" / "worker.py"
MODES = {"compiled": False, "eager": True}
"""Each engine's `enforce_eager`."""
TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 1e-2}
"""The worst state difference allowed, relative to the largest state value of the eager run."""
MAX_NUM_SEQS = 256
"""vLLM refuses a step budget below `max_num_seqs`; 256 also keeps 512-token steps in CUDA graphs."""


# ----------------------------------------------------------------------------- vLLM's side


def _engine_facts(llm) -> dict:
    """What the engine was built with, read back from vLLM's own config (None where unreadable)."""
    facts: dict = {}
    config = getattr(llm.llm_engine, "vllm_config", None)
    reads = {
        "enforce_eager": lambda: config.model_config.enforce_eager,
        "compilation_mode": lambda: str(getattr(config.compilation_config, "mode", None)),
        "cudagraph_mode": lambda: str(getattr(config.compilation_config, "cudagraph_mode", None)),
        "max_num_batched_tokens": lambda: config.scheduler_config.max_num_batched_tokens,
        "chunked_prefill": lambda: bool(config.scheduler_config.enable_chunked_prefill),
        "prefix_caching": lambda: bool(config.cache_config.enable_prefix_caching),
    }
    for name, read in reads.items():
        try:
            facts[name] = read()
        except AttributeError:
            facts[name] = None
    return facts


def engine_side(job_path: Path, out: Path) -> None:
    """In vLLM's Python: one engine, the prompts encoded, then the repeated ones again."""
    import importlib.util

    import numpy as np

    spec = importlib.util.spec_from_file_location("clef_vllm_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    job = json.loads(job_path.read_text())
    clefs = worker.engine_options
    step = {"max_num_batched_tokens": job["chunk"], "max_num_seqs": min(MAX_NUM_SEQS, job["chunk"])}
    worker.engine_options = lambda options, on_cpu: {**clefs(options, on_cpu), **step}
    import vllm

    llm = worker.load(job["model"], job["options"])
    prompts = [{"ids": np.asarray(prompt["ids"], dtype=np.int32)} for prompt in job["prompts"]]
    first = worker.encode(llm, prompts)
    positions = [n for n, prompt in enumerate(job["prompts"]) if prompt["id"] in job["repeat"]]
    again = worker.encode(llm, [prompts[n] for n in positions])
    names = [f"first/{prompt['id']}" for prompt in job["prompts"]]
    names += [f"again/{job['prompts'][n]['id']}" for n in positions]
    outputs = zip(names, first + again, strict=True)
    states = {name: output.outputs.data.float().cpu().numpy() for name, output in outputs}
    np.savez(out.with_suffix(".npz"), **states)
    from vllm.platforms import current_platform

    facts = _engine_facts(llm) | {"vllm": vllm.__version__, "cpu_build": bool(current_platform.is_cpu())}
    out.write_text(json.dumps(facts))


# ----------------------------------------------------------------------------- clef's side


def long_prompts(model: Path, chunk: int) -> tuple[list[dict], list[str]]:
    """clef's own text prompts: two long ones (about 1.6 and 3.4 chunks), two sharing a prefix of
    about 2.3 chunks, two of a few words (the prompt's template alone is over 600 tokens); and the
    ids that run again (the second of the pair)."""
    import random

    from benchmarks.score.bench_score import QUESTIONS, WORDS
    from clef_cli.encoding.prompt import PromptEncoder
    from clef_cli.inputs.records import RecordBuilder
    from clef_cli.release import load_processor, resolve_release

    encoder = PromptEncoder(load_processor(resolve_release(str(model))), max_length=64000)
    builder = RecordBuilder()
    rng = random.Random(48901)

    def text(words: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(words))

    def ids(name: str, state: str) -> list[int]:
        record = builder.build({"id": name, "state": state, "questions": QUESTIONS}, 0, None)
        return [int(token) for token in encoder.encode(record).input_ids]

    template = len(ids("probe-1", text(1)))  # the prompt around the state
    per_word = (len(ids("probe-401", text(401))) - template) / 400

    def words(chunks: float) -> int:
        return max(1, int((chunks * chunk - template) / per_word))

    shared = text(words(2.3))
    states = {"long-a": text(words(1.6)), "long-b": text(words(3.4)), "prefix-a": shared + " Is it late?",
              "prefix-b": shared + " Which team answers?", "short-a": text(12), "short-b": text(30)}  # fmt: skip
    prompts = [{"id": name, "ids": ids(name, state)} for name, state in states.items()]
    return prompts, ["prefix-b"]


def run_engine(python: str, mode: str, job: dict, folder: Path) -> tuple[dict, dict]:
    """One fresh vLLM process (`mode`'s engine): its facts and its states by `first/ID`, `again/ID`."""
    import numpy as np

    job = {**job, "options": {**job["options"], "enforce_eager": MODES[mode]}}
    (folder / f"{mode}.job.json").write_text(json.dumps(job))
    out = folder / f"{mode}.json"
    with (folder / f"{mode}.log").open("w") as log:
        done = subprocess.run(
            [python, __file__, "--engine-side", str(folder / f"{mode}.job.json"), str(out)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        )  # fmt: skip
    if done.returncode != 0:
        tail = (folder / f"{mode}.log").read_text()[-3000:]
        raise SystemExit(f"FAILED: the {mode} engine exited {done.returncode}:\n{tail}")
    with np.load(out.with_suffix(".npz")) as states:
        return json.loads(out.read_text()), {name: states[name] for name in states.files}


def gap(got, want, chunk: int) -> dict:
    """The worst |difference| of two [L, H] state arrays, within the first chunk and past it."""
    import numpy as np

    difference = np.abs(got - want)
    first, later = difference[:chunk], difference[chunk:]
    worst = lambda part: float(part.max()) if part.size else 0.0  # noqa: E731
    return {"first_chunk": worst(first), "later": worst(later)}


def verdict(prompts: list[dict], repeat: list[str], runs: dict, chunk: int, dtype: str) -> tuple[dict, list[str]]:
    """The figures and the failures of the runs (mode -> (facts, states)); eager is the reference."""
    import numpy as np

    failures: list[str] = []
    lengths = {prompt["id"]: len(prompt["ids"]) for prompt in prompts}
    if max(lengths.values()) <= chunk:
        failures.append(f"no prompt is longer than one chunk ({chunk} tokens): chunked prefill was not tested")
    for mode, (facts, states) in runs.items():
        if facts.get("prefix_caching") is not False:
            failures.append(f"{mode}: prefix caching is {facts.get('prefix_caching')} in the engine clef built")
        if facts.get("chunked_prefill") is False or facts.get("max_num_batched_tokens") not in (None, chunk):
            failures.append(f"{mode}: the engine does not chunk prefill at {chunk} tokens: {facts}")
        if mode == "compiled" and not facts.get("cpu_build") and facts.get("enforce_eager") is not False:
            failures.append(f"compiled: the engine ran eager ({facts}): compiled pooling was not tested")
        for name, array in states.items():
            if array.shape[0] != lengths[name.split("/", 1)[1]]:
                failures.append(f"{mode}: {name} has {array.shape[0]} states for {lengths[name.split('/', 1)[1]]} "
                                "tokens (the pooler was handed part of the prompt: prefix caching?)")  # fmt: skip
    eager = runs["eager"][1]
    scale = max(float(np.abs(array).max()) for array in eager.values()) or 1.0
    limit = TOLERANCE.get(dtype, 1e-2) * scale
    figures: dict = {"chunk": chunk, "dtype": dtype, "scale": scale, "limit": limit, "prompts": {}}
    figures["engines"] = {mode: facts for mode, (facts, _) in runs.items()}
    shaped = lambda a, b: a.shape == b.shape  # noqa: E731
    for prompt in prompts:
        name = prompt["id"]
        row: dict = {"tokens": lengths[name], "chunks": -(-lengths[name] // chunk)}
        for mode, (_, states) in runs.items():
            if mode != "eager" and shaped(states[f"first/{name}"], eager[f"first/{name}"]):
                row[f"{mode}_vs_eager"] = gap(states[f"first/{name}"], eager[f"first/{name}"], chunk)
            if name in repeat and shaped(states[f"again/{name}"], states[f"first/{name}"]):
                row[f"{mode}_rerun"] = gap(states[f"again/{name}"], states[f"first/{name}"], chunk)
        for key, value in row.items():
            if isinstance(value, dict) and max(value.values()) > limit:
                failures.append(f"{name} {key}: worst state gap {max(value.values()):.3g} > {limit:.3g} ({value})")
        figures["prompts"][name] = row
    return figures, failures


def report(figures: dict, failures: list[str]) -> None:
    for mode, facts in figures["engines"].items():
        print(f"{mode}: " + ", ".join(f"{key} {value}" for key, value in facts.items()))
    print(f"chunk {figures['chunk']} tokens, {figures['dtype']}, allowed state gap {figures['limit']:.3g}")
    print(f"{'prompt':10}{'tokens':>8}{'chunks':>8}  worst state gap (first chunk / later chunks)")
    for name, row in figures["prompts"].items():
        gaps = "  ".join(f"{k} {v['first_chunk']:.2e}/{v['later']:.2e}" for k, v in row.items() if isinstance(v, dict))
        print(f"{name:10}{row['tokens']:>8}{row['chunks']:>8}  {gaps}")
    for failure in failures:
        print(f"FAILED: {failure}")
    print("vllm-chunked: " + ("FAILED" if failures else "ok: compiled = eager past the first chunk, no prefix caching"))


def main() -> None:
    if sys.argv[1:2] == ["--engine-side"]:
        engine_side(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk", type=int, default=512, help="max_num_batched_tokens: one prefill chunk")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--model", type=Path, help="default: the vLLM-ready tiny release")
    parser.add_argument("--vllm-python", default=os.environ.get("CLEF_VLLM_PYTHON"), help="vLLM's Python")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if not args.vllm_python:
        raise SystemExit("set CLEF_VLLM_PYTHON (or --vllm-python) to vLLM's Python")
    sys.path.insert(0, str(ROOT))
    from tests.support.vllm_release import cached_release

    model = args.model or cached_release()
    prompts, repeat = long_prompts(model, args.chunk)
    options = {"dtype": args.dtype, "max_model_len": 4 * args.chunk + 512, "cpu_kv_cache_gib": 1}
    job = {"model": str(model), "options": options, "chunk": args.chunk, "prompts": prompts, "repeat": repeat}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {mode: run_engine(args.vllm_python, mode, job, Path(tmp)) for mode in MODES}
    figures, failures = verdict(prompts, repeat, runs, args.chunk, args.dtype)
    if runs["compiled"][0].get("cpu_build"):
        print("vLLM's CPU build runs eager only: compiled and eager are the same mode here")
    report(figures, failures)
    if args.json:
        args.json.write_text(json.dumps({**figures, "failures": failures}, indent=2) + "\n")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
