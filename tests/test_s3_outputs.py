"""An output in an object store is checked before any record is read (issue 51.2), and a store's
failure reads the same and fails as fast for the input, the media and the output (51.4): moto's
S3 server behind the counting proxy; every run here is refused before the model loads."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.locations import buckets, object_store

from .support.helpers import TINY_MODEL, put_two_records, write_jsonl

runner = CliRunner()
BUCKET = "clef-outputs"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
COMMON = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--hidden-states", "drop"]


@pytest.fixture
def s3(store_bucket, proxy):
    """store_bucket holding two records and an image (put straight to the server: no proxy count)."""
    client = store_bucket
    put_two_records(client, BUCKET, QUESTIONS)
    proxy.failure_status, proxy.failure_code = 503, "SlowDown"
    object_store.forget()
    return client


def keys(client, prefix: str = "") -> list[str]:
    return [item["Key"] for item in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


def refused(args: list[str], tmp_path, code: int) -> str:
    """Run `clef score`, refused or failed with `code` in one line, leaving no output, store or
    lock (a media-side failure left OUTPUT.ckpt/: issue 51.4) and nothing outside `in/`."""
    result = runner.invoke(app, ["score", *args, *COMMON])
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in"], "a refused job leaves no folder"
    made = [path.name for path in (tmp_path / "in").iterdir() if not path.name.endswith(".jsonl")]
    assert made == [], f"a refused or failed job leaves nothing it made: {made}"
    return line


OUTPUTS = [
    ("a bucket that does not exist", "s3://clef-no-such-bucket/out/night.parquet", 2, "does not exist"),
    ("an existing prefix, a folder", f"s3://{BUCKET}/out/night.parquet", 2, "is a folder in the store"),
    ("a query string", f"s3://{BUCKET}/out/night.parquet?endpoint_override=elsewhere", 2, "no query strings"),
    ("an http URL", "https://example.com/night.parquet", 2, "not an object store's URI"),
]


@pytest.mark.parametrize(("what", "target", "code", "said"), OUTPUTS, ids=[case[0] for case in OUTPUTS])
def test_a_remote_output_is_checked_before_any_record_is_read(s3, proxy, tmp_path, what, target, code, said):
    """These surfaced only after the whole job (exit 1, 'rerun to upload it again', which cannot
    help), wrote a file/folder twin, or went to a local folder named `s3:`. Now each is refused
    first, like a local -o into a missing folder: one line, no record read, nothing written."""
    s3.put_object(Bucket=BUCKET, Key="out/night.parquet/part-0.parquet", Body=b"x")  # a "folder"
    (tmp_path / "in").mkdir()
    before = keys(s3)
    line = refused([f"s3://{BUCKET}/in/records.jsonl", "-o", target, "--checkpoint", str(tmp_path / "store")],
                   tmp_path, code)  # fmt: skip
    assert said in line, line
    assert proxy.count("GET", "/in/records.jsonl") == 0, proxy.requests  # no record read
    assert keys(s3) == before  # no probe, no marker, no object


def test_an_output_leaves_no_folder_marker_and_its_check_no_probe(s3, tmp_path):
    """pyarrow's S3 filesystem put an empty `out/` object at every delete (to keep its
    "directory"): every S3 output left one beside it. The check's probe and the upload go through
    obstore, which makes none."""
    from clef_cli.locations.uploads import check_writable, upload_whole

    check_writable(f"s3://{BUCKET}/out/night.parquet", "-o")
    assert keys(s3, "out/") == []
    local = tmp_path / "night.parquet"
    local.write_bytes(b"PAR1 a whole output PAR1")
    upload_whole(local, f"s3://{BUCKET}/out/night.parquet")
    upload_whole(local, f"s3://{BUCKET}/out/night.parquet")  # a rerun replaces it whole
    assert keys(s3) == ["in/a.png", "in/records.jsonl", "out/night.parquet"]
    assert s3.get_object(Bucket=BUCKET, Key="out/night.parquet")["Body"].read() == local.read_bytes()
    assert not s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads")


def places(tmp_path) -> dict[str, list[str]]:
    """The same bucket as the input, as a record's media, and as the output."""
    (tmp_path / "in").mkdir()
    image = {"id": "m", "state": "x", "questions": QUESTIONS, "images": [f"s3://{BUCKET}/in/a.png"]}
    media = str(write_jsonl(tmp_path / "in" / "media.jsonl", [image]))
    text = str(write_jsonl(tmp_path / "in" / "text.jsonl", [{"id": "t", "state": "x", "questions": QUESTIONS}]))
    return {
        "input": [f"s3://{BUCKET}/in/records.jsonl", "-o", str(tmp_path / "in" / "o.parquet")],
        "media": [media, "-o", str(tmp_path / "in" / "o.parquet"), "--media-root", f"s3://{BUCKET}/in/"],
        "output": [text, "-o", f"s3://{BUCKET}/out/o.parquet", "--checkpoint", str(tmp_path / "store")],
    }


def test_refused_credentials_read_the_same_for_the_input_the_media_and_the_output(s3, proxy, monkeypatch, tmp_path):
    """'OSError: ... ACCESS_DENIED during HeadObject' for the input, 'the store refused the job's
    credentials' for media, and for the output nothing until the job's end: now one sorting
    (`object_store._classify`) and one text, before any record is scored. (moto takes an
    unsigned write, so the output's bucket refuses it through the proxy, as a read-only role's.)"""
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    proxy.failures[f"PUT /{BUCKET}/out/"], proxy.failure_status, proxy.failure_code = 100, 403, "AccessDenied"
    for place, args in places(tmp_path).items():
        line = refused(args, tmp_path, 1)
        place = "-o" if place == "output" else place
        assert line.startswith(f"error: {place} s3://{BUCKET}/"), (place, line)  # the option and the URI given
        assert line.endswith(": no credentials (none in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or an AWS_PROFILE, "
                             "and no instance or pod role the store accepts)"), (place, line)  # fmt: skip
    assert keys(s3, "out/") == []


@pytest.fixture
def silent_endpoint(monkeypatch):
    """An endpoint that takes no connection and answers nothing (a dead host), with the one
    timeout policy made short for the test (the real one fails in about 10 s: docs/scoring.md)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    filler = socket.create_connection(listener.getsockname())  # the backlog is full: connects time out
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
    monkeypatch.setattr(object_store, "CONNECT_SECONDS", 0.5)
    monkeypatch.setattr(object_store, "REQUEST_SECONDS", 0.5)
    monkeypatch.setattr(object_store, "ATTEMPTS", 1)
    monkeypatch.setattr(buckets, "QUICK_PATIENCE", buckets.timedelta(seconds=1))
    monkeypatch.setattr(buckets, "CONNECT_TIMEOUT", buckets.timedelta(seconds=0.5))
    object_store.forget()
    buckets.forget()
    yield
    filler.close()
    listener.close()


def test_a_dead_endpoint_ends_the_job_in_one_line_wherever_the_object_is(s3, silent_endpoint, tmp_path):
    """The input failed after its client's own long retries (9.8 s), media after 40.5 s or as a
    `transient` error row per record (exit 3): timeouts of a store that has never answered are
    now the job's error, after the client's few tries (`ATTEMPTS`), everywhere."""
    for place, args in places(tmp_path).items():
        line = refused(args, tmp_path, 1)
        place = "-o" if place == "output" else place
        assert line.startswith(f"error: {place} s3://{BUCKET}/"), (place, line)
        assert " did not answer in " in line, (place, line)


def test_a_large_output_goes_up_in_parts_whole_or_not_at_all(s3, proxy, monkeypatch, tmp_path):
    """Above uploads.SINGLE_PUT_BYTES (made small here) the output goes up as a multipart upload
    at its own key: it appears whole, a failed upload leaves the target as it was and aborts the
    upload it began (none is left behind), and nothing is made beside the target."""
    from clef_cli.locations import uploads
    from clef_cli.locations.object_store import ObjectStoreError

    monkeypatch.setattr(uploads, "SINGLE_PUT_BYTES", 1 << 20)
    monkeypatch.setattr(uploads, "PART_BYTES", 5 << 20)  # S3's smallest part
    local = tmp_path / "night.parquet"
    local.write_bytes(bytes(range(256)) * (48 << 10))  # 12 MiB: three parts
    target = f"s3://{BUCKET}/out/night.parquet"
    uploads.upload_whole(local, target)
    assert proxy.count("POST", "/out/night.parquet?uploads") == 1  # in parts
    assert s3.get_object(Bucket=BUCKET, Key="out/night.parquet")["Body"].read() == local.read_bytes()
    local.write_bytes(b"night 2" * (2 << 20))
    proxy.failures["partNumber=2"], proxy.failure_status = 100, 400
    with pytest.raises(ObjectStoreError, match="rerun to upload it again"):
        uploads.upload_whole(local, target)
    assert s3.get_object(Bucket=BUCKET, Key="out/night.parquet")["Body"].read() == bytes(range(256)) * (48 << 10)
    assert not s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads")
    assert keys(s3, "out/") == ["out/night.parquet"]
