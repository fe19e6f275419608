"""Night 2 of a store in a bucket, on a fresh machine: requests, bytes, wall time and their cost.

A local moto S3 server behind the tests' counting proxy (tests/support/s3_proxy.py; `--delay-ms` adds a
fixed delay to every request, the order of a cloud request) holds a store of `--stored` records,
written over `--nights` nights by one machine (one sync a night: one segment each, compacted by
level as jobs end). Then a second machine with an empty cache folder runs night 2: the records
of the store plus `--new-share` new ones. It opens the store, keys the night's records against it
(the job's ledger, the real one), commits the new records' results, gathers every output row in
input order (as the output is written), records the run and syncs: everything `clef score` does
with the store, without the model. Results are made-up rows of the real schema (one question),
hidden states are not stored (night 2 reads none either way).

    python benchmarks/store/bench_remote_night.py --stored 100000 --new-share 0.01 [--delay-ms 30]

Cost at S3 Standard prices (us-east-1, 2026: PUT, POST, LIST $0.005 per 1,000; GET, HEAD
$0.0004 per 1,000; transfer to a machine in the same region free). Needs the test extra (moto).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.feed.bench_media_s3 import start_moto  # noqa: E402
from tests.support.remote_stores import commit, key_of, open_machine  # noqa: E402
from tests.support.s3_proxy import TEST_ENVIRONMENT, S3Proxy  # noqa: E402

BUCKET = "clef-bench-store"
STORE = f"s3://{BUCKET}/nightly/"
WRITE_PRICE, READ_PRICE = 0.005 / 1000, 0.0004 / 1000
SHARD = 256
"""Records per committed shard (a batch's worth)."""


def kind(method: str, path: str) -> str:
    if method == "GET" and "list-type=2" in path:
        return "LIST"
    return method


def write_store(folder: Path, stored: int, nights: int) -> None:
    """One machine writes the store, a night at a time."""
    per_night = stored // nights
    for night in range(nights):
        writer = open_machine(STORE, folder / "writer")
        commit(writer, range(night * per_night, (night + 1) * per_night), per_shard=SHARD)
        writer.close()


def night_two(folder: Path, stored: int, new: int) -> dict[str, object]:
    """A fresh machine's night over the stored records and `new` more (see the module's note)."""
    from clef_cli.store.ledger import Ledger
    from clef_cli.store.remote import manifests

    manifests.forget()
    started = time.perf_counter()
    job = open_machine(STORE, folder / "fresh")
    opened = time.perf_counter()
    job.begin_run()
    ledger = Ledger(job.index, job.run_seq)
    rows = ((number, f"r{number}", key_of(number), None) for number in range(stored + new))
    with job.index.transaction() as db:
        db.executemany("INSERT INTO temp.job VALUES (?, ?, ?, ?)", rows)
        db.execute("CREATE INDEX temp.job_by_key ON job(key)")
    ledger.to_run.flags = bytearray(stored + new)
    ledger._decide(stored + new, needs_hidden=False)
    job.ledger = ledger
    keyed = time.perf_counter()
    commit(job, range(stored, stored + new), per_shard=SHARD)
    output_rows = sum(table.num_rows for table in ledger.ordered(job.index, job.open_shard))
    gathered = time.perf_counter()
    job.index.finish_run(job.run_id, {"run": ledger.counts.run, "reused": ledger.counts.reused})
    job.close()
    return {
        "run": ledger.counts.run,
        "reused": ledger.counts.reused,
        "output_rows": output_rows,
        "seconds": {
            "open": round(opened - started, 2),
            "key": round(keyed - opened, 2),
            "commit_and_gather": round(gathered - keyed, 2),
            "sync": round(time.perf_counter() - gathered, 2),
            "total": round(time.perf_counter() - started, 2),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stored", type=int, default=100_000)
    parser.add_argument("--new-share", type=float, default=0.01)
    parser.add_argument("--nights", type=int, default=10)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--json", type=Path, default=None)
    options = parser.parse_args()
    server, url = start_moto()
    proxy = S3Proxy(url)
    os.environ.update(TEST_ENVIRONMENT | {"AWS_ENDPOINT_URL": proxy.start()})
    import boto3

    boto3.client("s3", endpoint_url=url).create_bucket(Bucket=BUCKET)
    try:
        with tempfile.TemporaryDirectory(prefix="clef-bench-store-") as folder:
            write_store(Path(folder), options.stored, options.nights)
            proxy.clear()
            proxy.delay_seconds = options.delay_ms / 1000
            new = int(options.stored * options.new_share)
            report = night_two(Path(folder), options.stored, new)
    finally:
        proxy.stop()
        server.stop()
    kinds = Counter(kind(method, path) for method, path in proxy.requests)
    writes = kinds["PUT"] + kinds["POST"] + kinds["LIST"]
    reads = kinds["GET"] + kinds["HEAD"]
    report |= {
        "stored": options.stored,
        "new": new,
        "delay_ms": options.delay_ms,
        "requests": dict(sorted(kinds.items())),
        "requests_total": len(proxy.requests),
        "downloaded_bytes": proxy.bytes_sent,
        "uploaded_bytes": proxy.bytes_received,
        "cost_usd": round(writes * WRITE_PRICE + reads * READ_PRICE, 8),
    }
    print(json.dumps(report, indent=2))
    if options.json:
        options.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
