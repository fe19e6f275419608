"""Does the sync to a store in the bucket stall the model? bench_feed.py's measurement with the
store in a bucket.

    python benchmarks/store/bench_store_feed.py --sets text,image --delay-ms 30 [--sync-every 2]

bench_feed.py's sets and job (`run_job`: the real pipeline around its simulated device at
`--device-rate` tokens/s, the tiny model's head), run three ways at the default `--workers`: a
folder store, then a store in a bucket (a local moto S3 server behind the tests' proxy, which adds
`--delay-ms` to every request) with `--hidden-states drop`, then with `keep`. The sync runs every
`--sync-every` seconds beside the scoring. Reported per run: busy (the device's share of the
steady state), the commit wait, the syncs (manifests committed) and what was uploaded.

The tiny model's hidden states are narrow (its hidden size), so `keep` uploads far fewer bytes a
token than the real model's 4 KiB: the figure says whether syncing competes with the feed, not
whether a link carries 160 MB/s. Needs the test extra (moto).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: `benchmarks.` and clef_cli
from benchmarks.feed import bench_feed
from benchmarks.feed.bench_media_s3 import start_moto
from benchmarks.score.bench_score import write_jsonl
from tests.support.s3_proxy import TEST_ENVIRONMENT, S3Proxy

BUCKET = "clef-store-feed"


def measure(name: str, count: int, files: dict, args: argparse.Namespace, context: dict) -> dict:
    """One set, three runs: a folder store, a bucket store with states dropped, then kept."""
    from clef_cli.locations import buckets
    from clef_cli.store.remote import manifests

    folder = Path(context["tmp"]) / name
    folder.mkdir()
    records = write_jsonl(folder / "records.jsonl", bench_feed.set_records(name, count, files))
    window = max(math.ceil(count / args.windows), 2)
    result: dict[str, object] = {"records": count}
    runs = [("folder", {}), ("bucket, drop", {"hidden_states": "drop"}), ("bucket, keep", {})]
    for number, (where, more) in enumerate(runs):
        out = folder / f"run-{number}"
        out.mkdir()
        if where.startswith("bucket"):
            more = more | {"checkpoint": f"s3://{BUCKET}/{name}-{number}/", "sync_every": args.sync_every}
            more |= {"cache_dir": out / "cache"}
        buckets.forget()
        manifests.forget()
        context["proxy"].clear()
        started = time.perf_counter()
        fresh = not where.startswith("bucket")  # a bucket store here is new: nothing to restart
        run = bench_feed.run_job(records, out, args.workers, window, context["scorer"], restart=fresh, **more)
        run["wall_s"] = time.perf_counter() - started
        requests = context["proxy"].requests
        run["manifests"] = sum(1 for method, path in requests if method == "PUT" and "/manifests/" in path)
        run["requests"] = len(requests)
        run["uploaded_bytes"] = context["proxy"].bytes_received
        run["load_average"] = os.getloadavg()[0]
        result[where] = run
        print(
            f"{name:<6} {where:<13} {count} records: busy {run['busy']:.2f} (head excluded "
            f"{run['busy_head_excluded']:.2f}), commit wait {run['commit_wait_s']:.2f} s, scoring "
            f"{run['scoring_s']:.1f} s of {run['wall_s']:.1f} s, {run['manifests']} manifests, "
            f"{run['requests']} requests, {run['uploaded_bytes'] / 1e6:.1f} MB up; load {run['load_average']:.1f}",
            flush=True,
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="text,image")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--device-rate", type=float, default=40000)
    parser.add_argument("--delay-ms", type=float, default=30.0)
    parser.add_argument("--sync-every", type=float, default=2.0)
    parser.add_argument("--media-dir", type=Path, default=Path(tempfile.gettempdir()) / "clef-bench-feed-media")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sets = args.sets.split(",")
    server, url = start_moto()
    proxy = S3Proxy(url, delay_seconds=args.delay_ms / 1000)
    os.environ.update(TEST_ENVIRONMENT | {"AWS_ENDPOINT_URL": proxy.start()})
    import boto3

    boto3.client("s3", endpoint_url=url).create_bucket(Bucket=BUCKET)
    results = {"delay_ms": args.delay_ms, "sync_every": args.sync_every, "device_rate": args.device_rate}
    try:
        files = bench_feed.media_files(args.media_dir, sets)
        with tempfile.TemporaryDirectory(prefix="clef-store-feed-") as tmp:
            context = {"tmp": tmp, "proxy": proxy, "scorer": bench_feed.simulated_scorer(args.device_rate)}
            for name in sets:
                count = max(1, round(bench_feed.DEFAULT_RECORDS[name] * args.scale))
                results[name] = measure(name, count, files, args, context)
    finally:
        proxy.stop()
        server.stop()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
