"""Does the model wait for media in an object store? bench_feed.py's measurement over S3.

    python benchmarks/feed/bench_feed_s3.py --sets image --delay-ms 30 [--records 64] [--json out.json]

The image (and video) sets of benchmarks/feed/bench_feed.py (the same generated files and records)
are served by a local moto S3 server (in its own process, as a real store is: `start_store`)
behind the tests' proxy (tests/support/s3_proxy.py), which adds
`--delay-ms` to every request (30 ms: the order of a cloud GET). Each record names its media
relative to its input, `s3://bucket/feed/records-SET.jsonl` + `media/image3.jpg`. The job is
bench_feed.py's own (`run_job`: the real pipeline around its simulated device at
`--device-rate`), run at the default `--workers` over the local files and over the bucket with a
fresh checkpoint (a first night: keying reads every object, 8 at a time, and keeps it for the
encoding workers), then once more over the bucket with every record's state edited and the same
checkpoint (new keys, the media keyed from the store's cache without a GET, so each planning
window's objects are read into the job's copy ahead of its encoding, 8 at a time:
clef_cli/encoding/object_prefetch.py). Each is reported the same way:
busy, efficiency = busy / min(1, workers x per-core rate / device rate) with the per-core rate
of the local files, with and without the joint head's CPU time, the start-up (keying, which
reads each object once, is there), and the requests and bytes the store served.

Needs the test extra (moto). The tiny fixture model; nothing here is a GPU figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: `benchmarks.` and clef_cli
from benchmarks.feed import bench_feed
from benchmarks.score.bench_score import write_jsonl
from tests.support.s3_proxy import S3Proxy

BUCKET = "clef-feed"
FIELDS = tuple(bench_feed.MEDIA_FIELDS.values())


def start_store() -> tuple[subprocess.Popen, str]:
    """moto's S3 server in a process of its own, and its URL. In this process its Python (some 4
    ms a read here) would hold the GIL the measured job's main thread needs, and only on a night
    whose reads happen while the model runs (night 1 reads every object while keying, before the
    first forward), so it would charge night 2 for the simulated store's own work."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return server, url
        except urllib.error.HTTPError:
            return server, url  # it answers
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit(f"moto's server did not start on {url}")


def own_copies(records: list[dict], folder: Path) -> list[dict]:
    """Each record's images as its own file (the set's JPEG with the record's number appended
    after its end, which decoders ignore): a real night's records do not share media, so every
    one costs the store its requests. Videos stay shared (an MP4 is not so easily told apart)."""
    copies = []
    for number, record in enumerate(records):
        images = []
        for entry in record.get("images", []):
            path = folder / f"{number}-{Path(entry).name}"
            path.write_bytes(Path(entry).read_bytes() + number.to_bytes(8, "big"))
            images.append(str(path))
        copies.append({**record, "images": images} if images else record)
    return copies


def remote_records(records: list[dict]) -> list[dict]:
    """The records with each media entry relative to the input's folder (`media/NAME`)."""
    return [
        {**record, **{f: [f"media/{Path(entry).name}" for entry in record[f]] for f in FIELDS if f in record}}
        for record in records
    ]


def upload_media(client: object, records: list[dict]) -> None:
    names = {entry for record in records for f in FIELDS for entry in record.get(f, [])}
    for entry in sorted(names):
        client.upload_file(entry, BUCKET, f"feed/media/{Path(entry).name}")  # type: ignore[attr-defined]


def store_figures(proxy: S3Proxy) -> dict[str, float]:
    media = [(method, path) for method, path in proxy.requests if "/feed/media/" in path]
    return {
        "requests": len(proxy.requests),
        "media_get": sum(1 for method, _ in media if method == "GET"),
        "media_head": sum(1 for method, _ in media if method == "HEAD"),
        "list": sum(1 for method, path in proxy.requests if method == "GET" and "list-type=2" in path),
        "bytes": proxy.bytes_sent,
    }


def measure(name: str, count: int, files: dict, args: argparse.Namespace, context: dict) -> dict:
    """One set: the local run and the S3 run, at the same workers and window."""
    from clef_cli.locations import object_store

    folder = Path(context["tmp"]) / name
    folder.mkdir()
    (folder / "media").mkdir()
    records = own_copies(bench_feed.set_records(name, count, files), folder / "media")
    upload_media(context["client"], records)
    local = write_jsonl(folder / "records.jsonl", records)
    key = f"feed/records-{name}.jsonl"
    body = "".join(json.dumps(record) + "\n" for record in remote_records(records))
    context["client"].put_object(Bucket=BUCKET, Key=key, Body=body)
    per_core = bench_feed.encode_rate(local)["tokens_per_s_cpu"]
    window = max(math.ceil(count / args.windows), 2 * args.workers)
    feedable = min(1.0, args.workers * per_core / args.device_rate)
    result: dict[str, object] = {"records": count, "workers": args.workers, "encode_tokens_per_s_per_core": per_core}
    edited = [{**record, "state": record["state"] + " (edited)"} for record in records]
    edited_key = f"feed/records-{name}-edited.jsonl"
    body = "".join(json.dumps(record) + "\n" for record in remote_records(edited))
    context["client"].put_object(Bucket=BUCKET, Key=edited_key, Body=body)
    runs = [("local", local, True), ("s3", f"s3://{BUCKET}/{key}", True)]
    # night 2, every state edited: new keys, media keyed from the store's cache (no GET while
    # keying), so every object is read while the job runs, ahead of each window's encoding
    runs.append(("s3 night 2 (states edited)", f"s3://{BUCKET}/{edited_key}", False))
    for where, source, fresh in runs:
        out = folder / where.split()[0]
        out.mkdir(exist_ok=True)
        object_store.forget()
        context["proxy"].clear()
        started = time.perf_counter()
        run = bench_feed.run_job(source, out, args.workers, window, context["scorer"], restart=fresh)
        run["wall_s"] = time.perf_counter() - started  # the job's whole time: keying (the reads) included
        run["efficiency"] = run["busy"] / feedable
        run["efficiency_head_excluded"] = run["busy_head_excluded"] / feedable
        run["store"] = store_figures(context["proxy"])
        run["load_average"] = os.getloadavg()[0]
        result[where] = run
        print(
            f"{name:<6} {where} {count} records, w{args.workers}: busy {run['busy']:.2f}, efficiency "
            f"{run['efficiency']:.2f} (head excluded {run['efficiency_head_excluded']:.2f}), start-up "
            f"{run['startup_s']:.1f} s, scoring {run['scoring_s']:.1f} s of {run['wall_s']:.1f} s, "
            f"encode wait {run['encode_wait_s']:.1f} s, failed {run['failed']}; store {run['store']}; "
            f"load {run['load_average']:.1f}",
            flush=True,
        )
    return result


def run_sets(args: argparse.Namespace, names: list[str], files: dict, url: str) -> dict:
    """Each set measured against the store at `url`, behind the delaying, counting proxy."""
    import boto3

    proxy = S3Proxy(url, delay_seconds=args.delay_ms / 1000)
    os.environ.update(
        AWS_ENDPOINT_URL=proxy.start(), AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
    )  # fmt: skip
    client = boto3.client("s3", endpoint_url=url)
    client.create_bucket(Bucket=BUCKET)
    print(f"simulated device {args.device_rate:,.0f} tok/s, {args.delay_ms:.0f} ms per request, workers {args.workers}")
    results = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            scorer = bench_feed.simulated_scorer(args.device_rate)
            context = {"tmp": tmp, "client": client, "proxy": proxy, "scorer": scorer}
            for name in names:
                count = args.records or bench_feed.DEFAULT_RECORDS[name]
                results[name] = measure(name, count, files, args, context)
    finally:
        proxy.stop()
    return results


def main() -> None:
    from clef_cli.encoding.media import MediaLimits
    from clef_cli.engines.local.pool_size import default_workers

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="image", help="comma-separated: image, video")
    parser.add_argument("--records", type=int, help="records per set (default: bench_feed.py's)")
    parser.add_argument("--delay-ms", type=float, default=30.0, help="added to every request (default 30)")
    parser.add_argument("--device-rate", type=float, default=40000, help="simulated prefill tokens/s (default 40000)")
    parser.add_argument("--workers", type=int, default=default_workers(MediaLimits()), help="default: clef's")
    parser.add_argument("--windows", type=int, default=4, help="planning windows per set (as bench_feed.py)")
    parser.add_argument("--media-dir", type=Path, default=Path(tempfile.gettempdir()) / "clef-bench-feed-media")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from clef_cli.store import media_stats

    media_stats.RACY_NS = 0  # the objects were written seconds ago; a real night 2 is a day later

    names = [name.strip() for name in args.sets.split(",") if name.strip()]
    files = bench_feed.media_files(args.media_dir, names)
    server, url = start_store()
    try:
        results = run_sets(args, names, files, url)
    finally:
        server.terminate()
        server.wait()
    if args.json:
        args.json.write_text(json.dumps({"delay_ms": args.delay_ms, "sets": results}, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
