"""A night over millions of records: does memory stay flat, does CPU per record stay constant, and
is the second night proportional to what changed?

    python benchmarks/scale/bench_scale.py                           # 10k, 100k and 1M text records
    python benchmarks/scale/bench_scale.py --sizes 10000,100000      # a quicker run
    python benchmarks/scale/bench_scale.py --sizes 100000,200000 --info-keys 0   # issue 51's growth goal
    python benchmarks/scale/bench_scale.py --sizes 100000,200000 --info-keys 0 --repeats 3   # its median
    python benchmarks/scale/bench_scale.py --sizes 10000 --info-keys 0 --json scale.json

Per size N, each run in a fresh process (so its peak RSS, getrusage's maxrss of that child, is
its own): night 1 scores N short text records into a new store, night 2 scores the same table
with 1% new records appended on the same store. The thinker's forward is bench_feed.py's
SimulatedDevice (sleeps padded tokens / --device-rate, returns zero states; the default rate makes
the wait ~0); everything else is clef's own (reading, keying, planning, the joint head, commits,
the Parquet output), with `--hidden-states drop` and no encoding workers. Printed per night: peak
RSS, the job's CPU µs per record, and per stage (scale_stages.py: read, key, plan, forward,
commit, output, other). Then `clef checkpoint info` and `clef checkpoint prune --keep-runs 1` (each
a fresh `clef` process, wall time) on the largest size's store, and on a synthetic store of
--info-keys keys built directly in the store's format (scale_store.py). `--ray-sizes`: the `--ray`
driver's peak RSS over as many records (scale_ray.py: one simulated actor).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: `benchmarks.` and clef_cli
from benchmarks.scale.scale_records import write_records
from benchmarks.score.bench_score import MODEL

# ----------------------------------------------------------------------------- one night (child)


def read_chars() -> int:
    """Bytes this process has read through read() calls so far (page cache hits included)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def night(inputs: Path, output: Path, store: Path, rate: float, verify_media: bool = False) -> dict:
    """One `clef score` of `inputs` into `store`, in this process: CPU per stage, peak RSS and
    the bytes read (`verify_media`: every media file hashed again, as before the stat cache)."""
    from benchmarks.feed.bench_feed import simulated_scorer
    from benchmarks.scale.scale_stages import STAGES, StageCpu
    from clef_cli.engines.local.pipeline import ScoreJob, ScoreSettings

    scorer = simulated_scorer(rate)
    cpu = StageCpu()
    cpu.install()
    settings = ScoreSettings(
        inputs=[inputs], output=output, model=str(MODEL), workers=0, hidden_states="drop", checkpoint=store,
        device="cpu", dtype="float32", verify_media=verify_media,
    )  # fmt: skip
    before, wall, read = time.process_time(), time.perf_counter(), read_chars()
    summary = ScoreJob(settings, scorer=scorer).run()
    job_cpu, wall, read = time.process_time() - before, time.perf_counter() - wall, read_chars() - read
    stages = {name: cpu.seconds[name] for name in STAGES}
    stages["other"] = max(0.0, job_cpu - sum(stages.values()))
    return {
        "records": summary.records,
        "run": summary.run,
        "reused": summary.reused,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "job_cpu_s": job_cpu,
        "read_bytes": read,
        "wall_s": wall,
        "cpu_us_per_record": 1e6 * job_cpu / summary.records,
        "stage_us_per_record": {name: 1e6 * value / summary.records for name, value in stages.items()},
    }


def child(args: argparse.Namespace) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = night(args.inputs, args.output, args.store, args.device_rate, args.verify_media)
    print("RESULT " + json.dumps(result))


def run_night(inputs: Path, output: Path, store: Path, rate: float, verify_media: bool = False) -> dict:
    command = [sys.executable, __file__, "--child", "--inputs", str(inputs), "--output", str(output),
               "--store", str(store), "--device-rate", str(rate)] + ["--verify-media"] * verify_media  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"night failed ({done.returncode}): {done.stderr[-3000:]}")
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def clef_seconds(*args: str) -> float:
    """Wall seconds of one `clef` command in a fresh process (imports included)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "clef_cli", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"clef {' '.join(args)} failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")
    return time.perf_counter() - started


# ----------------------------------------------------------------------------- the parent


def show(size: int, name: str, result: dict) -> None:
    stages = ", ".join(f"{stage} {value:.0f}" for stage, value in result["stage_us_per_record"].items())
    rss, cpu, counts = result["peak_rss_mib"], result["cpu_us_per_record"], f"run {result['run']:,}"
    print(
        f"{size:>9,} {name}: peak RSS {rss:,.0f} MiB, {cpu:.0f} CPU µs/record ({result['job_cpu_s']:.1f} s; "
        f"{counts}, reused {result['reused']:,}; wall {result['wall_s']:.1f} s)\n{'':>10}µs/record: {stages}"
    )


def measure_size(size: int, folder: Path, rate: float, new_share: float, repeats: int = 1) -> dict:
    """Night 1 (`repeats` times, each into a fresh store: its peak RSS moves by about 10 MiB from
    run to run, so the growth goals read the median), then night 2 on the first night's store."""
    folder.mkdir(parents=True, exist_ok=True)
    store = folder / "store.ckpt"
    records = write_records(folder / "night1.jsonl", size)
    first = run_night(records, folder / "night1.parquet", store, rate)
    show(size, "night 1", first)
    peaks = [first["peak_rss_mib"]]
    for again in range(1, repeats):
        other = run_night(records, folder / f"night1.{again}.parquet", folder / f"store.{again}.ckpt", rate)
        show(size, f"night 1 again ({again + 1}/{repeats})", other)
        peaks.append(other["peak_rss_mib"])
    first["peak_rss_runs_mib"] = peaks
    first["peak_rss_mib"] = statistics.median(peaks)
    if repeats > 1:
        print(f"{'':>10}night 1 peak RSS, median of {repeats} runs: {first['peak_rss_mib']:,.0f} MiB")
    grown = write_records(folder / "night2.jsonl", size, new=round(size * new_share))
    second = run_night(grown, folder / "night2.parquet", store, rate)
    show(size, "night 2", second)
    ratio = second["job_cpu_s"] / first["job_cpu_s"]
    print(f"{'':>10}night 2 / night 1 CPU: {ratio:.1%}")
    return {"night1": first, "night2": second, "night2_cpu_ratio": ratio}


def store_commands(store: Path, label: str) -> dict:
    info = clef_seconds("checkpoint", "info", str(store))
    prune = clef_seconds("checkpoint", "prune", str(store), "--keep-runs", "1")
    print(f"{label}: checkpoint info {info:.1f} s, prune --keep-runs 1 {prune:.1f} s")
    return {"info_s": info, "prune_s": prune}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000", help="record counts (default 10k, 100k, 1M)")
    parser.add_argument("--new-share", type=float, default=0.01, help="night 2's new records (default 1%%)")
    parser.add_argument("--device-rate", type=float, default=1e9, help="simulated tokens/s (default 1e9: no wait)")
    parser.add_argument("--info-keys", type=int, default=10_000_000, help="synthetic store's keys (0: none)")
    parser.add_argument("--repeats", type=int, default=1, help="night 1 runs per size; peak RSS: their median")
    parser.add_argument("--ray-sizes", default="", help="record counts for the --ray driver (default: none)")
    parser.add_argument("--folder", type=Path, help="keep the stores here (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--inputs", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--verify-media", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    sizes = [int(value) for value in args.sizes.split(",") if value.strip()]
    print(f"{len(os.sched_getaffinity(0))} usable cores; simulated device {args.device_rate:,.0f} tokens/s")
    report: dict = {"sizes": {}, "stores": {}}
    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        for size in sizes:
            report["sizes"][str(size)] = measure_size(
                size, Path(tmp) / str(size), args.device_rate, args.new_share, args.repeats
            )
        if sizes:
            largest = max(sizes)
            store = Path(tmp) / str(largest) / "store.ckpt"
            report["stores"][str(largest)] = store_commands(store, f"{largest:,} keys")
        if args.info_keys:
            from benchmarks.scale.scale_store import synthetic_store

            store, keys = Path(tmp) / "synthetic.ckpt", args.info_keys
            print(f"synthetic store of {keys:,} keys built in {synthetic_store(store, keys):.0f} s")
            report["stores"][str(keys)] = store_commands(store, f"{keys:,} synthetic keys")
        if args.ray_sizes:
            from benchmarks.scale.scale_ray import measure

            report["ray"] = measure([int(size) for size in args.ray_sizes.split(",")], Path(tmp), args.device_rate)
    summarise(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


GROWTH_GOAL_MIB = 10
"""Issue 51: night 1's peak RSS over 200k records at most this much above over 100k."""


def summarise(report: dict) -> None:
    """The goals of issues 39 and 51, as measured."""
    ray = report.get("ray", {})
    if len(ray) >= 2:
        low, high = min(ray, key=int), max(ray, key=int)
        growth = ray[high]["driver_peak_rss_mib"] / ray[low]["driver_peak_rss_mib"]
        print(f"--ray driver peak RSS {high} / {low} records: {growth:.2f}x")
    sizes = report["sizes"]
    if len(sizes) < 2:
        return
    smallest, largest = sizes[min(sizes, key=int)], sizes[max(sizes, key=int)]
    rss = largest["night1"]["peak_rss_mib"] / smallest["night1"]["peak_rss_mib"]
    cpu = largest["night1"]["cpu_us_per_record"] / smallest["night1"]["cpu_us_per_record"]
    print(f"peak RSS {max(sizes, key=int)} / {min(sizes, key=int)} records: {rss:.2f}x (goal <= 1.2x)")
    print(f"CPU per record {max(sizes, key=int)} / {min(sizes, key=int)}: {cpu:.2f}x (goal 0.8x to 1.2x)")
    if "100000" in sizes and "200000" in sizes:  # issue 51: what a record more costs, where it shows
        grown = sizes["200000"]["night1"]["peak_rss_mib"] - sizes["100000"]["night1"]["peak_rss_mib"]
        print(f"peak RSS 200000 - 100000 records: {grown:+.0f} MiB (goal <= +{GROWTH_GOAL_MIB} MiB)")


if __name__ == "__main__":
    main()
