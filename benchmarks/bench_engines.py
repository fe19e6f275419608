"""Both engines on the same records, side by side in one run: `clef score --engine hf` and
`--engine vllm` (issue 33). Prints tokens/s, the ratio and the time to the first result of each.

    CLEF_VLLM_PYTHON=$(.ci/vllm_venv.sh)/bin/python python benchmarks/bench_engines.py --records 200

On the CPU with the tiny release this is a sanity figure (is the vLLM path wired, and how much
does the worker's pipe cost), not a verdict: vLLM's kernels pay off on a GPU with the real model.
Text records only (the vLLM engine refuses media records for now).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_score import text_records  # noqa: E402


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
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100)
    parser.add_argument("--model", type=Path, default=None, help="default: the vLLM-ready tiny release")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if not os.environ.get("CLEF_VLLM_PYTHON"):
        raise SystemExit("set CLEF_VLLM_PYTHON to vLLM's Python (.ci/vllm_venv.sh builds one)")
    from tests.vllm_release import cached_release

    model = args.model or cached_release()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        inputs = folder / "records.jsonl"
        inputs.write_text("".join(json.dumps(r) + "\n" for r in text_records(args.records)))
        results = [run_engine(engine, model, inputs, folder, args.dtype, args.device) for engine in ("hf", "vllm")]
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
    print(
        f"vllm/hf tokens/s: {rates['vllm'][0] / rates['hf'][0]:.2f} (ex-load {rates['vllm'][1] / rates['hf'][1]:.2f})"
    )


if __name__ == "__main__":
    main()
