"""`clef score --checkpoint s3://…` end to end against moto's S3 server behind a counting proxy:
refusals before any record is read, and (slow) one environment for records, media, output and
store. Issue 52's "Done when" runs in real processes in tests/test_remote_store_done.py. Each
machine is its own cache folder (CLEF_CACHE_DIR)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.locations import buckets
from clef_cli.store.remote import manifests

from .support.helpers import TINY_MODEL, write_jsonl
from .support.s3_proxy import TEST_ENVIRONMENT

runner = CliRunner()
BUCKET = "clef-store-jobs"
STORE = f"s3://{BUCKET}/store/"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
COMMON = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--max-length", "4096", "--max-batch-size", "2"]


@pytest.fixture
def s3(store_bucket, monkeypatch, tmp_path):
    monkeypatch.setenv("CLEF_CACHE_DIR", str(tmp_path / "machine-1"))
    return store_bucket


def records(count: int, start: int = 0) -> list[dict]:
    numbers = range(start, start + count)
    return [{"id": f"r{n}", "state": f"ticket {n}: the printer is on fire", "questions": QUESTIONS} for n in numbers]


def score(inputs, output, *extra, store: str = STORE):
    result = runner.invoke(app, ["score", *map(str, inputs), "-o", str(output), "--checkpoint", store, *COMMON, *extra])
    return result, (pq.read_table(output).to_pylist() if os.path.exists(output) else None)


def keys_in(client) -> list[str]:
    return [item["Key"] for item in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])]


def test_a_store_prefix_or_uri_that_cannot_be_one_is_refused_before_anything_is_written(s3, proxy, tmp_path):
    local = write_jsonl(tmp_path / "records.jsonl", records(2))
    s3.put_object(Bucket=BUCKET, Key="reports/summary.csv", Body=b"a,b\n")
    for store, words in [
        (f"s3://{BUCKET}/reports/", "not a clef store"),
        ("s3:///store/", "no bucket"),
        (f"s3://{BUCKET}/store/?x=1", "query strings"),
    ]:
        result, rows = score([local], tmp_path / "o.parquet", store=store)
        assert result.exit_code == 2, (store, result.output)
        assert words in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert rows is None and keys_in(s3) == ["reports/summary.csv"]
    result, _ = score([local], tmp_path / "o.parquet", "--restart")
    assert result.exit_code == 2 and "--confirm-restart" in result.stderr, result.output
    assert not any(method == "PUT" for method, _ in proxy.requests), proxy.requests


def test_no_bucket_or_no_credentials_end_the_job_in_one_line_before_a_record_is_read(s3, monkeypatch, tmp_path):
    unread = tmp_path / "export.csv"  # read, it would be refused (no state column: exit 2)
    unread.write_text("id,text\n1,hello\n")
    result, _ = score([unread], tmp_path / "o.parquet", store="s3://no-such-bucket-here/store/")
    assert result.exit_code == 2 and "does not exist" in result.stderr, result.output  # as for -o (issue 56.5)
    assert len(result.stderr.strip().splitlines()) == 1
    s3.put_object(Bucket=BUCKET, Key="store/latest.json", Body=b'{"seq": 0}')
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    result, _ = score([unread], tmp_path / "o.parquet")
    assert result.exit_code == 1 and ": no credentials (" in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_ENVIRONMENT["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_ENVIRONMENT["AWS_SECRET_ACCESS_KEY"])
    result, _ = score([unread], tmp_path / "o.parquet")
    assert result.exit_code == 2 and "state" in result.stderr, result.output  # the records are read now


def on_machine(monkeypatch, tmp_path, number: int) -> None:
    """The next command runs on machine `number`: its own cache folder, nothing else shared."""
    monkeypatch.setenv("CLEF_CACHE_DIR", str(tmp_path / f"machine-{number}"))
    buckets.forget()
    manifests.forget()


@pytest.mark.slow  # two runs of the tiny model with an image (about a minute)
def test_one_environment_reaches_records_media_output_and_store_with_nothing_local(s3, proxy, monkeypatch, tmp_path):
    from .support.helpers import MEDIA

    s3.put_object(Bucket=BUCKET, Key="in/img/a.png", Body=(MEDIA / "image_a.png").read_bytes())
    lines = [*records(2), {"id": "img", "state": "a picture", "questions": QUESTIONS, "images": ["img/a.png"]}]
    s3.put_object(Bucket=BUCKET, Key="in/records.jsonl", Body="".join(json.dumps(line) + "\n" for line in lines))
    profile = tmp_path / "credentials"  # only a profile: no key in the environment
    profile.write_text(
        "[nightly]\naws_access_key_id = {AWS_ACCESS_KEY_ID}\naws_secret_access_key = {AWS_SECRET_ACCESS_KEY}\n".format(
            **TEST_ENVIRONMENT
        )
    )
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(profile))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_PROFILE", "nightly")
    output = f"s3://{BUCKET}/out/night.parquet"
    args = ["score", f"s3://{BUCKET}/in/records.jsonl", "-o", output, "--checkpoint", STORE, *COMMON]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "out/night.parquet" in keys_in(s3) and any(key.startswith("store/manifests/") for key in keys_in(s3))
    body = s3.get_object(Bucket=BUCKET, Key="out/night.parquet")["Body"].read()
    scored = pq.read_table(pa.BufferReader(body)).to_pylist()
    assert [row["error"] for row in scored] == [None, None, None]
    on_machine(monkeypatch, tmp_path, 2)
    second = runner.invoke(app, args)
    assert second.exit_code == 0 and "0 run through the model, 3 from the checkpoint" in second.stderr, second.output
