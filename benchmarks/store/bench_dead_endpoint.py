"""How long a job takes to fail when its object store does not answer, for each place an object
can be: the input (its expansion), a record's media (its folder's listing), the output (the
check before the job) and the store in a bucket (`--checkpoint s3://...`, its check before the
job). docs/scoring.md ("Data in object stores") quotes the figures; the goal is about 10 s
everywhere, 15 s at most (issue 56.5: 62-70 s for the store and 19-22 s for the rest before).

`python benchmarks/store/bench_dead_endpoint.py [--kind refused|silent|blackhole ...]`, every
kind by default. Nothing leaves the machine: every endpoint is a port on 127.0.0.1.
- `refused`: a port nothing listens on (the connection is refused at once).
- `silent`: a port that accepts the connection (the kernel completes it, its queue is long) and
  never answers a byte (a hung server, a proxy that holds the request).
- `blackhole`: a port whose connection queue is full, so no connection is ever made (a dead
  host or a firewall that drops packets: the SYN goes unanswered). Sending to an unroutable
  address would leave the machine; a full queue on loopback times out the same way.
The figures are printed, one line per kind and place, and the run exits 1 if one is over 15 s.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

LIMIT_SECONDS = 15.0
KINDS = ("refused", "silent", "blackhole")


def endpoint(kind: str) -> tuple[str, list[socket.socket]]:
    """The endpoint's URL and the sockets that keep it dead while the benchmark runs."""
    if kind == "silent":
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)  # the kernel accepts up to 128 connections; nobody reads them
        return f"http://127.0.0.1:{listener.getsockname()[1]}", [listener]
    if kind == "refused":
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()  # nothing listens there now
        return f"http://127.0.0.1:{port}", []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    filler = socket.create_connection(listener.getsockname())  # the queue is full: connects time out
    return f"http://127.0.0.1:{listener.getsockname()[1]}", [listener, filler]


def timed(call: Callable[[], object]) -> tuple[float, str]:
    started = time.monotonic()
    try:
        call()
    except Exception as error:  # the job's one line is what is measured
        return time.monotonic() - started, f"{type(error).__name__}: {str(error)[:160]}"
    return time.monotonic() - started, "no failure"


def places(scratch: str) -> dict[str, Callable[[], object]]:
    """The job's own first call for each place an object can be."""
    from clef_cli.inputs.sources import expand_inputs
    from clef_cli.locations import object_store
    from clef_cli.locations.uploads import check_writable
    from clef_cli.store.location import remote_location
    from clef_cli.store.opening import check_store

    return {
        "input": lambda: expand_inputs(["s3://bench/in/records.jsonl"]),
        "media": lambda: object_store.stamp("s3://bench/media/a.png"),
        "output": lambda: check_writable("s3://bench/out/night.parquet", "-o"),
        "store": lambda: check_store(remote_location("s3://bench/store/", Path(scratch))),
    }


def measure(kind: str, scratch: str) -> list[float]:
    url, keep = endpoint(kind)
    os.environ["AWS_ENDPOINT_URL"] = url
    from clef_cli.locations import buckets, object_store

    figures = []
    for place, call in places(scratch).items():
        object_store.forget()
        buckets.forget()
        seconds, said = timed(call)
        figures.append(seconds)
        print(f"{kind} endpoint, {place}: failed in {seconds:.1f} s ({said})", flush=True)
    for item in keep:
        item.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=KINDS, action="append", help="every kind when not given")
    args = parser.parse_args()
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    with tempfile.TemporaryDirectory() as scratch:
        figures = [seconds for kind in args.kind or KINDS for seconds in measure(kind, scratch)]
    print(f"slowest: {max(figures):.1f} s (limit {LIMIT_SECONDS:g} s)")
    sys.exit(0 if max(figures) <= LIMIT_SECONDS else 1)


if __name__ == "__main__":
    main()
