"""One reading of a bucket's errors (issue 56.5): the same cause gives the same exit code and the
same words whichever option named the bucket (an input, a record's media, `-o`, `--checkpoint`,
`checkpoint info|prune`'s store), each message names the option and the URI given (never the
store's `latest.json` or `manifests/`, the output's probe, or the server's XML), the server's
answer shows only under `clef -v`, and an endpoint that accepts and never answers ends a job in
about ten seconds. moto's S3 server behind the failing proxy (tests/support/s3_proxy.py); every run is
refused before the model loads."""

from __future__ import annotations

import re
import socket
import time

import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.locations import buckets, object_store
from clef_cli.locations.failures import DENIED, NO_BUCKET, NO_CREDENTIALS, SILENT, UNREACHABLE, words_of
from clef_cli.locations.uris import LocationProblem

from .support.helpers import TINY_MODEL, put_two_records, write_jsonl

runner = CliRunner()
BUCKET = "clef-bucket-errors"
MISSING = "clef-no-such-bucket"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
COMMON = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--hidden-states", "drop"]
INTERNAL = ("latest.json", "manifests/", ".clef-probe-", "<?xml", "<Error>", "<Code>", "169.254", "/latest/api")


@pytest.fixture
def s3(store_bucket, proxy):
    client = store_bucket
    put_two_records(client, BUCKET, QUESTIONS)
    proxy.failure_status, proxy.failure_code = 503, "SlowDown"
    object_store.forget()
    yield client
    proxy.failures.clear()


def commands(tmp_path, bucket: str) -> dict[str, tuple[str | None, str, list[str]]]:
    """Option -> (the label its message must start with, None: any but `--checkpoint`; the URI
    given; the command line), each naming `bucket` in one place only."""
    local = tmp_path / "local"
    local.mkdir(exist_ok=True)
    image = {"id": "m", "state": "x", "questions": QUESTIONS, "images": [f"s3://{bucket}/in/a.png"]}
    media = str(write_jsonl(local / "media.jsonl", [image]))
    text = str(write_jsonl(local / "text.jsonl", [{"id": "t", "state": "x", "questions": QUESTIONS}]))
    out, store = str(local / "o.parquet"), str(local / "store")
    cache = ["--cache-dir", str(tmp_path / "cache")]
    keys = {"input": "in/records.jsonl", "media": "in/a.png", "-o": "out/o.parquet", "store": "store/"}
    given = {name: f"s3://{bucket}/{key}" for name, key in keys.items()}
    return {
        "input": ("input", given["input"], ["score", given["input"], "-o", out, "--checkpoint", store, *COMMON]),
        "media": ("media", given["media"],
                  ["score", media, "-o", out, "--media-root", f"s3://{bucket}/in/", "--checkpoint", store, *COMMON]),
        "-o": ("-o", given["-o"], ["score", text, "-o", given["-o"], "--checkpoint", store, *COMMON]),
        "--checkpoint": ("--checkpoint", given["store"], ["score", text, "-o", out, "--checkpoint", given["store"],
                                                           *cache, *COMMON]),
        "checkpoint info": (None, given["store"], ["checkpoint", "info", given["store"], *cache]),
        "checkpoint prune": (None, given["store"], ["checkpoint", "prune", given["store"], "--keep-runs", "1"]),
    }  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def no_credentials(monkeypatch, tmp_path) -> None:
    """No key, no profile, and the instance's metadata endpoint (pyarrow's and obstore's) a
    loopback port nothing listens on: nothing is sent off the machine."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_EC2_METADATA_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    metadata = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", metadata)
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", metadata)


CAUSES = {
    # cause: (the exit code, its words: locations/failures.py)
    "a bucket that does not exist": (2, NO_BUCKET),
    "access denied (403 AccessDenied)": (1, DENIED),
    "a key the store does not know (InvalidAccessKeyId)": (1, DENIED),
    "a wrong secret (SignatureDoesNotMatch)": (1, DENIED),
    "no credentials at all": (1, NO_CREDENTIALS),
    "an endpoint that refuses": (1, UNREACHABLE),
}


def cause_of(what: str, proxy, monkeypatch, tmp_path) -> str:
    """Set up `what`; the bucket the commands name."""
    if what == "a bucket that does not exist":
        return MISSING
    code = {cause: cause.split("(")[1].split()[-1].rstrip(")") for cause in CAUSES if "(" in cause}
    if what in code:
        proxy.failures[f"/{BUCKET}"], proxy.failure_status, proxy.failure_code = 10**6, 403, code[what]
    elif what == "no credentials at all":
        no_credentials(monkeypatch, tmp_path)
    elif what == "an endpoint that refuses":
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    return BUCKET


def line_of(args: list[str], code: int, verbose: bool = False) -> str:
    object_store.forget()
    buckets.forget()
    result = runner.invoke(app, (["-v"] if verbose else []) + args)
    assert result.exit_code == code, (args, result.output)
    return result.stderr.strip()


@pytest.mark.parametrize("what", list(CAUSES), ids=list(CAUSES))
def test_one_cause_reads_alike_whichever_option_named_the_bucket(s3, proxy, monkeypatch, tmp_path, what):
    """Before: a missing bucket was exit 1 for --checkpoint and 2 for -o; the store's bad key
    'refused the job's credentials', the output's 'access denied'; the store named its
    `latest.json`, the output its probe, both with the server's XML cut mid-word; no credentials
    showed the instance-metadata call. Now one cause, one code, one text after `OPTION URI: `."""
    code, failure = CAUSES[what]
    bucket = cause_of(what, proxy, monkeypatch, tmp_path)
    words = words_of(failure, bucket)
    for option, (label, given, args) in commands(tmp_path, bucket).items():
        line = line_of(args, code)
        assert "\n" not in line, (option, line)  # one line
        assert line.endswith(f" {given}: {words}"), (option, line)  # the URI given, the cause's words
        prefix = line[len("error: ") : -len(f" {given}: {words}")]
        assert prefix == label if label is not None else prefix not in ("", "--checkpoint"), (option, line)
        assert not any(mark in line for mark in INTERNAL), (option, line)


def test_the_stores_answer_shows_only_under_verbose(s3, proxy, tmp_path):
    """The server's body (its XML) is the error's detail: `clef -v` prints it on a line of its own."""
    proxy.failures[f"/{BUCKET}"], proxy.failure_status, proxy.failure_code = 10**6, 403, "InvalidAccessKeyId"
    for option, (_, _, args) in commands(tmp_path, BUCKET).items():
        assert "the store answered" not in line_of(args, 1), option
        shown = line_of(args, 1, verbose=True)
        answer = next(line for line in shown.splitlines() if line.startswith("the store answered: "))
        # obstore (the store's client) keeps the body; pyarrow's HEAD has none, its code is its answer
        assert re.search(r"<Code>InvalidAccessKeyId</Code>|(ACCESS_DENIED|INVALID_ACCESS_KEY_ID) during", answer), shown
        assert "<Code>" in answer or option not in ("--checkpoint", "checkpoint info", "checkpoint prune"), answer


def test_an_input_in_a_missing_bucket_is_not_a_missing_object(s3, tmp_path):
    """A HEAD in a missing bucket is a bare 404: the input read 'input not found' (its object),
    while -o said the bucket. Now the bucket is asked after the object was not found."""
    _, given, args = commands(tmp_path, MISSING)["input"]
    assert line_of(args, 2) == f"error: input {given}: {words_of(NO_BUCKET, MISSING)}"
    _, given, args = commands(tmp_path, BUCKET)["input"]
    s3.delete_object(Bucket=BUCKET, Key="in/records.jsonl")
    assert line_of(args, 2) == f"error: input not found: {given}"


@pytest.fixture
def accepting_silent(monkeypatch):
    """An endpoint that accepts every connection (the kernel's queue holds them) and never
    answers a byte: a hung server. The real timeouts (object_store.GIVE_UP_SECONDS)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
    yield
    listener.close()


def test_a_silent_endpoint_ends_the_store_check_in_seconds(s3, accepting_silent, tmp_path):
    """Each of the store's requests waited 60 s (62-70 s in all); obstore now has a read timeout
    (buckets.READ_TIMEOUT) and the retries stop after GIVE_UP_SECONDS, as pyarrow's do.
    (benchmarks/store/bench_dead_endpoint.py measures every place and kind: about 10 s.)"""
    _, given, args = commands(tmp_path, BUCKET)["--checkpoint"]
    started = time.monotonic()
    line = line_of(args, 1)
    took = time.monotonic() - started
    assert line == f"error: --checkpoint {given}: {words_of(SILENT, BUCKET)}"
    assert took < 25, took


def test_a_large_upload_is_not_cut_by_the_read_timeout(s3, proxy, monkeypatch, tmp_path):
    """reqwest counts its read timeout from the request's start, upload included: a body that
    takes longer than it to send goes through the client without one (`Bucket.uploads`)."""
    monkeypatch.setattr(buckets, "READ_TIMEOUT", buckets.timedelta(seconds=0.3))
    monkeypatch.setattr(buckets, "PATIENCE", buckets.timedelta(seconds=0.5))
    proxy.delay_seconds = 0.6  # the store answers 0.6 s after the body: past the read timeout
    try:
        client = buckets.bucket(f"s3://{BUCKET}/x")
        client.put("segments/big", b"x" * (buckets.SMALL_PUT + 1))
        with pytest.raises(LocationProblem, match="kept failing"):  # a small put keeps the read timeout
            client.put("segments/small", b"x")
    finally:
        time.sleep(1.5)  # the proxy's handlers of the timed-out tries finish here, not in another test
        proxy.delay_seconds = 0.0
    assert s3.get_object(Bucket=BUCKET, Key="segments/big")["Body"].read() == b"x" * (buckets.SMALL_PUT + 1)
