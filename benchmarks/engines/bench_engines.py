"""Both engines on the same records, side by side in one run: `clef score --engine hf` and
`--engine vllm` (issue 33), and the bare engine: vLLM's own `LLM.encode` with its built-in Clef-Omni
pooler over the same prompts, tokenized by clef beforehand (vllm_bare.py, issue 37). Prints
tokens/s, the ratios and the time to the first result of each, and the pooler's worst logit and
probability gap against clef's HF engine (its parity, measured).

    CLEF_VLLM_PYTHON=$(.ci/vllm_venv.sh)/bin/python python benchmarks/engines/bench_engines.py --records 200

On the CPU with the tiny release this is a sanity figure (is the vLLM path wired, and what does
clef cost around vLLM), not a verdict: vLLM's kernels pay off on a GPU with the real model. The
goal there: clef's vLLM engine at >= 0.95 of the bare engine's tokens/s (both without loading).
Text records.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.score.bench_score import text_records  # noqa: E402


def _committed(journal: Path) -> bool:
    """Whether the job's journal records a commit with records in it (its first result)."""
    try:
        lines = journal.read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        try:
            if json.loads(line).get("records"):
                return True
        except (json.JSONDecodeError, AttributeError):
            continue
    return False


def run_engine(engine: str, model: Path, inputs: Path, folder: Path, dtype: str, device: str) -> dict:
    """One `clef score` run in a fresh process: wall time, tokens, and when the first commit came."""
    import subprocess

    out = folder / f"{engine}.parquet"
    stats = folder / f"{engine}.stats.json"
    command = [sys.executable, "-m", "clef_cli", "score", str(inputs), "-o", str(out), "--model", str(model)]
    command += ["--engine", engine, "--dtype", dtype, "--device", device, "--hidden-states", "drop", "--quiet"]
    command += ["--stats-json", str(stats)]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = None
    journal = folder / f"{engine}.parquet.ckpt"
    while process.poll() is None:
        if first is None and _committed(journal / "journal.jsonl"):
            first = time.perf_counter() - started
        time.sleep(0.05)
    wall = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit(f"{engine} failed ({process.returncode}): {process.stderr.read()[-2000:]}")
    figures = json.loads(stats.read_text())
    import pyarrow.parquet as pq

    tokens = sum(row or 0 for row in pq.read_table(out, columns=["prompt_tokens"]).column(0).to_pylist())
    return {
        "engine": engine,
        "wall_s": wall,
        "tokens": tokens,
        "first_result_s": first or wall,
        "load_s": figures.get("stages_seconds", {}).get("load", 0.0),
        "steady_s": figures.get("scoring_seconds", 0.0) - figures.get("first_forward_seconds", 0.0),
    }


def bare_prompts(model: Path, inputs: Path) -> list[dict]:
    """clef's own encoding of each record, as the built-in pooler takes it: ids and the schema's
    spans counted from the prompt's end."""
    from clef_cli.encoding.prompt import PromptEncoder
    from clef_cli.inputs.readers import read_records
    from clef_cli.release import load_processor, resolve_release

    encoder = PromptEncoder(load_processor(resolve_release(str(model))), max_length=64000)
    prompts = []
    for record in read_records([inputs]):
        encoded = encoder.encode(record)
        length = encoded.length
        questions = encoded.questions
        schema = {
            "question_types": [q.question_type for q in questions],
            "question_spans": [[q.question_span[0] - length, q.question_span[1] - length] for q in questions],
            "option_spans": [[start - length, end - length] for q in questions for start, end in q.option_spans],
            "option_counts": [len(q.option_spans) for q in questions],
        }
        labels = [[q.question_id, label] for q in questions for label in q.option_ids]
        prompts.append({"id": record.id, "ids": list(encoded.input_ids), "schema": schema, "labels": labels})
    return prompts


def run_bare(model: Path, inputs: Path, folder: Path, dtype: str) -> dict:
    """vllm_bare.py in vLLM's Python over clef's prompts: its times and logits."""
    import subprocess

    prompts = bare_prompts(model, inputs)
    job = folder / "bare.json"
    job.write_text(json.dumps({"options": {"dtype": dtype, "cpu_kv_cache_gib": 1}, "prompts": prompts}))
    out = folder / "bare.out.json"
    script = Path(__file__).with_name("vllm_bare.py")
    started = time.perf_counter()
    done = subprocess.run(
        [os.environ["CLEF_VLLM_PYTHON"], str(script), str(model), str(job), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    if done.returncode != 0:
        raise SystemExit(f"the bare engine failed ({done.returncode}): {done.stderr[-3000:]}")
    result = json.loads(out.read_text())
    result |= {"wall_s": time.perf_counter() - started, "prompts": prompts}
    return result


def pooler_parity(bare: dict, hf_output: Path) -> tuple[float, float]:
    """The worst |logit| and |probability| gap between vLLM's pooler and clef's HF engine."""
    import math

    import pyarrow.parquet as pq

    rows = {row["id"]: row for row in pq.read_table(hf_output).to_pylist()}
    worst_logit = worst_probability = 0.0
    for prompt in bare["prompts"]:
        theirs = bare["logits"][prompt["id"]]
        ours = {
            (answer["question_id"], label["label"]): label
            for answer in rows[prompt["id"]]["answers"]
            for label in answer["labels"]
        }
        by_question: dict[str, list[tuple[float, dict]]] = {}
        for (question, label), logit in zip(prompt["labels"], theirs, strict=True):
            by_question.setdefault(question, []).append((logit, ours[(question, label)]))
        for pairs in by_question.values():
            top = max(logit for logit, _ in pairs)
            total = sum(math.exp(logit - top) for logit, _ in pairs)
            for logit, label in pairs:
                worst_logit = max(worst_logit, abs(logit - label["logit"]))
                worst_probability = max(worst_probability, abs(math.exp(logit - top) / total - label["probability"]))
    return worst_logit, worst_probability


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100)
    parser.add_argument("--model", type=Path, default=None, help="default: the vLLM-ready tiny release")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if not os.environ.get("CLEF_VLLM_PYTHON"):
        raise SystemExit("set CLEF_VLLM_PYTHON to vLLM's Python (.ci/vllm_venv.sh builds one)")
    from tests.support.vllm_release import cached_release

    model = args.model or cached_release()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        inputs = folder / "records.jsonl"
        inputs.write_text("".join(json.dumps(r) + "\n" for r in text_records(args.records)))
        results = [run_engine(engine, model, inputs, folder, args.dtype, args.device) for engine in ("hf", "vllm")]
        bare = run_bare(model, inputs, folder, args.dtype)
        worst_logit, worst_probability = pooler_parity(bare, folder / "hf.parquet")
    print(f"{args.records} text records, {model.name}, {args.dtype} on {args.device}")
    print(f"{'engine':8}{'tokens':>9}{'wall s':>9}{'load s':>9}{'tok/s':>10}{'tok/s ex-load':>15}{'first s':>9}")
    rates = {}
    for r in results:
        rate = r["tokens"] / r["wall_s"]
        busy = r["tokens"] / max(1e-9, r["wall_s"] - r["load_s"])
        rates[r["engine"]] = (rate, busy)
        print(
            f"{r['engine']:8}{r['tokens']:>9}{r['wall_s']:>9.1f}{r['load_s']:>9.1f}{rate:>10.0f}{busy:>15.0f}"
            f"{r['first_result_s']:>9.1f}"
        )
    bare_rate = bare["tokens"] / bare["encode_s"]
    for r in results:  # from the first forward to the last commit: no start-up, no load
        print(f"{r['engine']}: {r['tokens'] / max(1e-9, r['steady_s']):,.0f} tok/s steady ({r['steady_s']:.2f} s)")
    steady = results[1]["tokens"] / max(1e-9, results[1]["steady_s"])
    print(
        f"{'bare':8}{bare['tokens']:>9}{bare['wall_s']:>9.1f}{bare['load_s']:>9.1f}"
        f"{bare['tokens'] / bare['wall_s']:>10.0f}{bare_rate:>15.0f}{'':>9}  (vLLM's LLM.encode + its pooler)"
    )
    print(
        f"vllm/hf tokens/s: {rates['vllm'][0] / rates['hf'][0]:.2f} (ex-load {rates['vllm'][1] / rates['hf'][1]:.2f})"
    )
    print(
        f"clef vllm / bare vLLM tokens/s: {steady / bare_rate:.2f} steady, {rates['vllm'][1] / bare_rate:.2f} ex-load "
        "(goal on a GPU: >= 0.95)"
    )
    print(f"vLLM's pooler against clef's HF engine: worst logit {worst_logit:.2e}, probability {worst_probability:.2e}")


if __name__ == "__main__":
    main()
