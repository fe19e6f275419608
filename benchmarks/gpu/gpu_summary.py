"""One summary of a `gpu_check.sh` run, from the raw JSON files it left in a folder.

    python benchmarks/gpu/gpu_summary.py OUT_DIR      # writes OUT_DIR/summary.json and prints it

Each step's figures that a reader compares first: golden parity per family and dtype, grouped_mm
against eager and MFU by record length (the goal: >= 40% at 8k-token records), clef's own
throughput on the device, the feed's efficiency on that machine's CPUs, and (when a vLLM was at
hand) vLLM's compiled-against-eager check. A step that failed or was skipped is named with its
error instead of its figures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MFU_GOAL = 0.40
GOAL_RECORD_TOKENS = 8192


def _load(folder: Path, name: str) -> dict | None:
    path = folder / name
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def gpu_points(report: dict | None) -> dict:
    """Per experts implementation: tokens/s and MFU by (budget, record length); the best MFU at
    the goal's record length, when it was measured."""
    if report is None:
        return {"error": "no report (the step failed or was skipped; see gpu_check.log)"}
    points: dict[str, list] = {}
    for point in report.get("results", []):
        row = {key: point.get(key) for key in ("max_batch_tokens", "record_tokens", "tokens_per_s", "mfu", "error")}
        points.setdefault(point.get("experts", "?"), []).append({k: v for k, v in row.items() if v is not None})
    at_goal = [p.get("mfu", 0.0) for p in report.get("results", []) if p.get("record_tokens") == GOAL_RECORD_TOKENS]
    summary: dict = {"layers": report.get("layers"), "points": points}
    if at_goal:
        summary["best_mfu_at_8k_records"] = max(at_goal)
        summary["meets_mfu_goal"] = max(at_goal) >= MFU_GOAL
    return summary


def chunked_points(report: dict | None) -> dict | None:
    """vllm_chunked.py's verdict: its failures, and the worst compiled-vs-eager state gap within the
    first prefill chunk and past it (None when no vLLM was at hand)."""
    if report is None:
        return None
    gaps = [row["compiled_vs_eager"] for row in report.get("prompts", {}).values() if "compiled_vs_eager" in row]
    worst = {part: max((gap[part] for gap in gaps), default=None) for part in ("first_chunk", "later")}
    return {"failures": report.get("failures", []), "limit": report.get("limit"), "compiled_vs_eager": worst}


def summarise(folder: Path) -> dict:
    parity = _load(folder, "parity.json")
    score = _load(folder, "score.json")
    feed = _load(folder, "feed.json")
    summary = {
        "environment": _load(folder, "environment.json"),
        "parity": parity["results"] if parity else {"error": "no report"},
        "gpu_omni": gpu_points(_load(folder, "gpu_omni.json")),
        "gpu_dense": gpu_points(_load(folder, "gpu_dense.json")),
        "score": {
            part: {key: value["pipeline"].get(key) for key in ("records_per_s", "tokens_per_s", "failed")}
            for part, value in (score or {}).items()
            if isinstance(value, dict) and "pipeline" in value
        }
        or {"error": "no report"},
        "feed": {
            name: {key: result.get(key) for key in ("busy", "efficiency", "encode_tokens_per_s_per_core")}
            for name, result in (feed or {}).get("sets", {}).items()
        }
        or {"error": "no report"},
        "mfu_goal": {"mfu": MFU_GOAL, "record_tokens": GOAL_RECORD_TOKENS},
    }
    chunked = chunked_points(_load(folder, "vllm_chunked.json"))
    if chunked is not None:
        summary["vllm_chunked"] = chunked
    return summary


def main() -> None:
    folder = Path(sys.argv[1])
    summary = summarise(folder)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
