"""Does a dry run pay for encoding workers? `clef score --dry-run` over short text records with
`--workers 0, 1, 2, ...`, each in a fresh process.

    python benchmarks/scale/scale_dry_run.py --records 50000 --workers 0,1,2

Per worker count: wall seconds, the main process's CPU seconds (reading, keying, planning the
windows the workers send back, unpickling them) and the workers' (encoding, pickling), each per
record past a `--base` run's (start-up: imports, the processor, spawning workers, cancel out).
A dry run loads no weights, so its cores are free; with N workers the wall time is at best about
records x max(main CPU, workers' CPU / N) per record, which says how far more cores would take it
(the main process's share is the floor).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: `benchmarks.` and clef_cli


def dry_run(inputs: Path, workers: int) -> dict:
    """One dry run in this process; CPU split between this process and its (reaped) workers."""
    from benchmarks.score.bench_score import MODEL
    from clef_cli.engines.local.pipeline import ScoreJob, ScoreSettings

    settings = ScoreSettings(inputs=[inputs], output=inputs.with_suffix(".parquet"), model=str(MODEL),
                             workers=workers, device="cpu", dtype="float32")  # fmt: skip
    started, main = time.perf_counter(), time.process_time()
    report = ScoreJob(settings).dry_run()
    wall, main = time.perf_counter() - started, time.process_time() - main
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"records": report.records, "batches": report.batches, "wall_s": wall, "main_cpu_s": main,
            "workers_cpu_s": children.ru_utime + children.ru_stime}  # fmt: skip


def run(inputs: Path, workers: int) -> dict:
    command = [sys.executable, __file__, "--child", str(inputs), str(workers)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"dry run failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(dry_run(Path(sys.argv[2]), int(sys.argv[3]))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--base", type=int, default=1_000, help="a smaller run whose cost is subtracted")
    parser.add_argument("--workers", default="0,1,2", help="worker counts to compare")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    from benchmarks.scale.scale_records import write_records

    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        inputs = write_records(Path(tmp) / "in.jsonl", args.records)
        base = write_records(Path(tmp) / "base.jsonl", args.base)
        for workers in (int(value) for value in args.workers.split(",")):
            big, small = run(inputs, workers), run(base, workers)
            extra = big["records"] - small["records"]
            per = {name: 1e6 * (big[name] - small[name]) / extra for name in ("wall_s", "main_cpu_s", "workers_cpu_s")}
            report[str(workers)] = {"run": big, "base": small, "us_per_record": per}
            print(
                f"--workers {workers}: wall {big['wall_s']:.1f} s ({args.base:,} records: {small['wall_s']:.1f} s); "
                f"per record past those: wall {per['wall_s']:.0f} µs, main CPU {per['main_cpu_s']:.0f} µs, "
                f"workers' CPU {per['workers_cpu_s']:.0f} µs",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
