"""Two nights over media in an object store: requests and bytes per record.

A local moto S3 server behind the tests' counting proxy (tests/support/s3_proxy.py, optionally adding a
fixed delay per request, `--delay-ms`, the order of a cloud GET) serves N records in one Parquet
part whose images (the sample images, each record its own copy with one byte changed, so that no
two share a key) lie beside it under `img/`. Night 1 scores them into a fresh store; night 2
scores the same table again; night 3 after one object was rewritten. Reports, per night, the
requests by kind (LIST, HEAD, GET of media), the bytes downloaded and the wall time.

    python benchmarks/feed/bench_media_s3.py --records 40 [--delay-ms 30]

Needs the test extra (moto). The tiny fixture model; nothing here is a GPU figure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.s3_proxy import S3Proxy  # noqa: E402

BUCKET = "clef-bench"
QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Urgent?"},
    "team": {"type": "choice", "criteria": {"a": None, "b": None}},
}


def start_moto() -> tuple[object, str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server, f"http://127.0.0.1:{port}"


def populate(client: object, records: int) -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    images = [(ROOT / "tests" / "fixtures" / "media" / name).read_bytes() for name in ("image_a.png", "image_b.png")]
    rows = []
    for index in range(records):
        client.put_object(Bucket=BUCKET, Key=f"night/img/{index}.png", Body=images[index % 2] + bytes([index % 251]))
        rows.append(
            {
                "id": f"r{index}",
                "state": f"ticket {index}",
                "questions": json.dumps(QUESTIONS),
                "images": [f"img/{index}.png"],
            }
        )
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    client.put_object(Bucket=BUCKET, Key="night/part-0.parquet", Body=buffer.getvalue())


def night(proxy: S3Proxy, store: Path, output: Path) -> dict[str, object]:
    from typer.testing import CliRunner

    from clef_cli.cli import app

    proxy.clear()
    started = time.monotonic()
    args = ["score", f"s3://{BUCKET}/night/", "-o", str(output), "--checkpoint", str(store), "--quiet"]
    args += [
        "--model",
        str(ROOT / "tests" / "fixtures" / "tiny-clef-omni"),
        "--hidden-states",
        "drop",
        "--workers",
        "0",
    ]
    result = CliRunner().invoke(app, args)
    wall = time.monotonic() - started
    lists = sum(1 for method, path in proxy.requests if method == "GET" and "list-type=2" in path)
    return {
        "exit": result.exit_code,
        "summary": result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "",
        "list": lists,
        "head_media": proxy.count("HEAD", "/night/img/"),
        "get_media": proxy.count("GET", "/night/img/"),
        "requests": len(proxy.requests),
        "bytes": proxy.bytes_sent,
        "wall_s": round(wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=40)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    options = parser.parse_args()
    import boto3

    server, url = start_moto()
    proxy = S3Proxy(url, delay_seconds=options.delay_ms / 1000)
    os.environ.update(
        AWS_ENDPOINT_URL=proxy.start(),
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    from clef_cli.store import media_stats

    media_stats.RACY_NS = 0  # objects were written seconds ago; a real night 2 is a day later
    client = boto3.client("s3", endpoint_url=url)
    client.create_bucket(Bucket=BUCKET)
    populate(client, options.records)
    with tempfile.TemporaryDirectory() as folder:
        store, nights = Path(folder) / "store", {}
        nights["night 1"] = night(proxy, store, Path(folder) / "n1.parquet")
        nights["night 2"] = night(proxy, store, Path(folder) / "n2.parquet")
        client.put_object(Bucket=BUCKET, Key="night/img/0.png", Body=b"\x89PNG-not-an-image")
        nights["night 3 (1 object rewritten)"] = night(proxy, store, Path(folder) / "n3.parquet")
    proxy.stop()
    server.stop()
    print(json.dumps({"records": options.records, "delay_ms": options.delay_ms, "nights": nights}, indent=2))


if __name__ == "__main__":
    main()
