"""The `--ray` driver's memory over a growing job, for bench_scale.py (`--ray-sizes`).

    python benchmarks/scale/scale_ray.py --sizes 10000,100000      # one fresh process per size

Each size runs in a fresh process: a local Ray cluster, one actor, the same short text records
as bench_scale.py, `--hidden-states drop`. The actor is clef's own ScoreActor with the thinker's
forward replaced by bench_feed.py's SimulatedDevice (its default rate makes the wait ~0), so the
job's cost is reading, keying, encoding, the joint head, commits and the output, the way
bench_scale.py measures the local pipeline. What is measured is the driver (this process): its
peak RSS (getrusage), and the peaks of its anonymous, file-backed and shared-memory (Ray's
object store, mapped as blocks are read) resident pages, sampled every 0.2 s from /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository: `benchmarks.` and clef_cli

from clef_cli.engines.ray.actor import ScoreActor  # noqa: E402

FIELDS = ("RssAnon", "RssFile", "RssShmem")


class SimulatedActor(ScoreActor):
    """clef's actor with the simulated device in place of the thinker's forward."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from benchmarks.feed.bench_feed import SimulatedDevice

        backbone = self.runner.scorer.backbone
        backbone.hidden_states = SimulatedDevice(backbone.hidden_size, float(os.environ["CLEF_BENCH_RATE"]))


class RssPeaks:
    """The peaks of this process's resident pages by kind (KiB), sampled in a thread."""

    def __init__(self, every: float = 0.2) -> None:
        self.every, self.peaks = every, dict.fromkeys(FIELDS, 0)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.done.wait(self.every):
            for line in Path("/proc/self/status").read_text().splitlines():
                name, _, value = line.partition(":")
                if name in self.peaks:
                    self.peaks[name] = max(self.peaks[name], int(value.split()[0]))

    def __enter__(self) -> RssPeaks:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


def ray_night(inputs: Path, output: Path, store: Path, rate: float) -> dict:
    """One `clef score --ray` of `inputs` in this process (the driver), with one simulated actor."""
    import ray

    import clef_cli.engines.ray.job as ray_job
    from clef_cli.engines.local.pipeline import ScoreSettings

    os.environ["CLEF_BENCH_RATE"] = str(rate)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    # the job's runtime environment, as `clef score --ray` starts Ray (CLEF_BENCH_RATE: workers
    # inherit this process's environment)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=ray_job.job_runtime_env())
    ray_job.ScoreActor = SimulatedActor
    settings = ScoreSettings(
        inputs=[inputs], output=output, model=str(ROOT / "tests/fixtures/tiny-clef-omni"), workers=0,
        hidden_states="drop", checkpoint=store, device="cpu", dtype="float32",
    )  # fmt: skip
    started, cpu = time.perf_counter(), time.process_time()
    try:
        with RssPeaks() as peaks:
            summary = ray_job.RayScoreJob(settings, ray_job.RaySettings(num_workers=1)).run()
    finally:
        ray.shutdown()
    return {
        "records": summary.records,
        "run": summary.run,
        "driver_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "driver_peak_mib": {name: value / 1024 for name, value in peaks.peaks.items()},
        "driver_cpu_s": time.process_time() - cpu,
        "wall_s": time.perf_counter() - started,
    }


def run_ray_night(inputs: Path, output: Path, store: Path, rate: float) -> dict:
    """`ray_night` in a fresh process (its own peak RSS)."""
    command = [sys.executable, __file__, "--child", str(inputs), str(output), str(store), str(rate)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ray night failed ({done.returncode}): {done.stderr[-3000:]}")
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def measure(sizes: list[int], folder: Path, rate: float) -> dict:
    from benchmarks.scale.scale_records import write_records

    report = {}
    for size in sizes:
        where = folder / f"ray-{size}"
        where.mkdir(parents=True, exist_ok=True)
        inputs = write_records(where / "in.jsonl", size)
        result = report[str(size)] = run_ray_night(inputs, where / "out.parquet", where / "store.ckpt", rate)
        kinds = ", ".join(f"{name} {value:,.0f}" for name, value in result["driver_peak_mib"].items())
        first = report[str(sizes[0])]["driver_peak_rss_mib"]
        print(f"{size:>9,} --ray: driver peak RSS {result['driver_peak_rss_mib']:,.0f} MiB "
              f"({result['driver_peak_rss_mib'] / first:.2f}x {sizes[0]:,}; {kinds} MiB); "
              f"driver CPU {result['driver_cpu_s']:.1f} s, wall {result['wall_s']:.1f} s", flush=True)  # fmt: skip
    return report


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        inputs, output, store, rate = sys.argv[2:6]
        print("RESULT " + json.dumps(ray_night(Path(inputs), Path(output), Path(store), float(rate))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="record counts")
    parser.add_argument("--device-rate", type=float, default=1e9, help="simulated tokens/s (default: no wait)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = measure([int(size) for size in args.sizes.split(",")], Path(tmp), args.device_rate)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
