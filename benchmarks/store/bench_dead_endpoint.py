"""How long a job takes to fail when its object store does not answer, for each place an object
can be: the input (its expansion), a record's media (its folder's listing) and the output (the
check before the job). docs/scoring.md ("Data in object stores") quotes the figures; the goal is
about 10 s everywhere (issue 51.4: 9.8 s for an input and 40.5 s for media before).

`python benchmarks/store/bench_dead_endpoint.py [--kind silent|refused]`: `silent` is a port
whose connection queue is full, so a connection is never made (a dead host); `refused` a port
nothing listens on. Nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from collections.abc import Callable


def endpoint(kind: str) -> tuple[str, list[socket.socket]]:
    """The endpoint's URL and the sockets that keep it dead while the benchmark runs."""
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
        return time.monotonic() - started, f"{type(error).__name__}: {str(error)[:90]}"
    return time.monotonic() - started, "no failure"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("silent", "refused"), default="silent")
    args = parser.parse_args()
    url, keep = endpoint(args.kind)
    os.environ.update(
        AWS_ENDPOINT_URL=url,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    from clef_cli.inputs.sources import expand_inputs
    from clef_cli.locations import buckets, object_store
    from clef_cli.locations.uploads import check_writable

    places = {
        "input": lambda: expand_inputs(["s3://bench/in/records.jsonl"]),
        "media": lambda: object_store.stamp("s3://bench/media/a.png"),
        "output": lambda: check_writable("s3://bench/out/night.parquet", "-o"),
    }
    for place, call in places.items():
        object_store.forget()
        buckets.forget()
        seconds, said = timed(call)
        print(f"{args.kind} endpoint, {place}: failed in {seconds:.1f} s ({said})")
    for item in keep:
        item.close()


if __name__ == "__main__":
    main()
