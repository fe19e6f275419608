"""Throughput, padding and memory of `clef score`, measured in one run on the tiny fixture model.

    python benchmarks/score/bench_score.py            # all three parts
    python benchmarks/score/bench_score.py --records 2000 --media-records 200

(a) text records with log-normal state lengths: the pipeline (planning, background encoding,
    length-sorted token-budget batches, checkpoint commits, Parquet output) against a sequential
    loop that encodes, runs the thinker alone and applies the head one record at a time (the
    reference's way); (b) the same on a mixed-media set; (c) peak RSS of a planning run over 10k
    and 100k text records, each in a fresh process.

The tiny model's forward is cheap, so these figures stress the pipeline's own overhead; on the
real 30B model the forward dominates and batching matters more, not less.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "tests" / "fixtures" / "tiny-clef-omni"
MEDIA = [ROOT / "sample_data" / "media", ROOT / "tests" / "fixtures" / "media"]
WORDS = (
    "the customer order refund shipping late damaged account password login error payment card invoice "
    "support team urgent please help thanks week yesterday today delivery box item price discount coupon "
    "tracking warehouse returned email phone chat manager review stars quality broken screen battery"
).split()
QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Is this urgent?"},
    "team": {
        "type": "choice",
        "instructions": "Who handles it?",
        "criteria": {"billing": "Payments and refunds", "tech": None, "shipping": "Deliveries", "other": None},
    },
    "severity": {"type": "score", "criteria": ["none", "minor", "major", "critical"]},
}


def iter_text_records(count: int, seed: int = 7) -> Iterator[dict]:
    """Support-ticket-like states whose word counts are log-normal (median ~74, long tail)."""
    rng = random.Random(seed)
    for index in range(count):
        words = max(3, min(1500, int(rng.lognormvariate(4.3, 0.9))))
        state = " ".join(rng.choice(WORDS) for _ in range(words))
        yield {"id": f"t{index}", "state": state, "questions": QUESTIONS}


def text_records(count: int, seed: int = 7) -> list[dict]:
    return list(iter_text_records(count, seed))


def media_records(count: int, seed: int = 11) -> list[dict]:
    rng = random.Random(seed)
    files = {kind: [] for kind in ("images", "audio", "videos")}
    for folder in MEDIA:
        for path in sorted(folder.iterdir()):
            kind = {".png": "images", ".jpg": "images", ".wav": "audio", ".flac": "audio"}.get(path.suffix)
            kind = kind or ("videos" if path.suffix in (".mp4", ".webm") else None)
            if kind:
                files[kind].append(str(path))
    records = text_records(count, seed)
    for record in records:
        kind = rng.choice(["text", "images", "audio", "videos", "images+audio"])
        for part in kind.split("+"):
            if part != "text":
                record[part] = [rng.choice(files[part])]
    return records


def write_jsonl(path: Path, records: Iterable[dict]) -> Path:
    with path.open("w") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    return path


def run_pipeline(path: Path, out: Path, workers: int | None, device: str) -> dict:
    from clef_cli.engines.local.pipeline import ScoreJob, ScoreSettings

    settings = ScoreSettings(
        inputs=[path],
        output=out,
        model=str(MODEL),
        device=device,
        workers=workers,
        max_length=4096,
        hidden_states="drop",
    )
    plan = ScoreJob(settings).dry_run()
    started = time.perf_counter()
    summary = ScoreJob(settings).run()
    seconds = time.perf_counter() - started
    return {
        "records": summary.records,
        "seconds": seconds,
        "records_per_s": summary.records / seconds,
        "tokens_per_s": summary.tokens / seconds,
        "padding_waste": plan.padding_waste,
        "failed": summary.failed,
    }


def run_sequential(path: Path, device: str) -> dict:
    """The reference's way: encode, forward alone, head, one record at a time (nothing written)."""
    from clef_cli.encoding.prompt import PromptEncoder
    from clef_cli.inputs.readers import read_records
    from clef_cli.model.scoring import load_scorer
    from clef_cli.release import load_processor, resolve_release

    started = time.perf_counter()  # start-up included, as it is for the pipeline
    release = resolve_release(str(MODEL))
    encoder = PromptEncoder(load_processor(release), max_length=4096)
    scorer = load_scorer(release, device=device)
    records = tokens = 0
    for record in read_records([path]):
        encoded = encoder.encode(record)
        scorer.score_batch([encoded])
        records += 1
        tokens += encoded.length
    seconds = time.perf_counter() - started
    return {
        "records": records,
        "seconds": seconds,
        "records_per_s": records / seconds,
        "tokens_per_s": tokens / seconds,
    }


def peak_rss_kib() -> int:
    """VmHWM: unlike getrusage's ru_maxrss, it is not inherited across exec from the parent."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def plan_child(count: int) -> None:
    """Runs in a fresh process: a dry run (planning only) over `count` text records."""
    from clef_cli.engines.local.pipeline import ScoreJob, ScoreSettings

    with tempfile.TemporaryDirectory() as folder:
        path = write_jsonl(Path(folder) / "records.jsonl", iter_text_records(count, seed=3))
        baseline = peak_rss_kib()
        settings = ScoreSettings(
            inputs=[path], output=Path(folder) / "o.parquet", model=str(MODEL), workers=0, max_length=4096
        )
        report = ScoreJob(settings).dry_run()
    peak = peak_rss_kib()
    print(json.dumps({"records": report.records, "peak_rss_kib": peak, "baseline_rss_kib": baseline}))


def planning_rss(count: int) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--plan-child", str(count)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2000, help="text records for part (a)")
    parser.add_argument("--media-records", type=int, default=400, help="records for part (b)")
    parser.add_argument(
        "--workers", type=int, default=None, help="encoding processes for the pipeline (default: clef's own choice)"
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N for parts (a) and (b)")
    parser.add_argument("--rss-counts", default="10000,100000", help="record counts for part (c)")
    parser.add_argument("--skip", default="", help="parts to skip, e.g. 'c'")
    parser.add_argument("--json", type=Path, help="also write parts (a) and (b) to this file")
    parser.add_argument("--plan-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plan_child:
        plan_child(args.plan_child)
        return

    import torch

    workers = "auto" if args.workers is None else args.workers
    where = f"{torch.get_num_threads()} CPU threads" if args.device == "cpu" else args.device
    print(f"clef benchmark: tiny fixture model on {where}, workers={workers}")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for part, records in (("a", text_records(args.records)), ("b", media_records(args.media_records))):
            if part in args.skip:
                continue
            path = write_jsonl(Path(folder) / f"{part}.jsonl", records)
            pipeline = run_pipeline(path, Path(folder) / f"{part}.parquet", args.workers, args.device)
            sequential = run_sequential(path, args.device)
            rows.append((part, pipeline, sequential))
    print()
    print(
        f"{'set':<16}{'records':>8}{'pipeline rec/s':>16}{'sequential rec/s':>18}{'speed-up':>10}"
        f"{'pipeline tok/s':>16}{'sequential tok/s':>18}{'padding waste':>15}"
    )
    for part, pipeline, sequential in rows:
        name = "(a) text" if part == "a" else "(b) mixed media"
        print(
            f"{name:<16}{pipeline['records']:>8}{pipeline['records_per_s']:>16.1f}{sequential['records_per_s']:>18.1f}"
            f"{pipeline['records_per_s'] / sequential['records_per_s']:>9.2f}x"
            f"{pipeline['tokens_per_s']:>16.0f}{sequential['tokens_per_s']:>18.0f}{pipeline['padding_waste']:>14.2%}"
        )
    if args.json:
        report = {"device": args.device, "workers": workers}
        for part, pipeline, sequential in rows:
            report["text" if part == "a" else "mixed"] = {"pipeline": pipeline, "sequential": sequential}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if "c" not in args.skip:
        small, large = (int(n) for n in args.rss_counts.split(","))
        first, second = planning_rss(small), planning_rss(large)
        print()
        print(
            f"(c) planning peak RSS: {small} records {first['peak_rss_kib'] / 1024:.0f} MiB, "
            f"{large} records {second['peak_rss_kib'] / 1024:.0f} MiB, "
            f"ratio {second['peak_rss_kib'] / first['peak_rss_kib']:.3f}"
        )


if __name__ == "__main__":
    main()
