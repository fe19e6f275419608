"""`s3://` inputs against a real S3-compatible server (moto's, started here on 127.0.0.1), found
through the standard AWS variables (`AWS_ENDPOINT_URL`, the access keys), as any S3-compatible store
(MinIO, Ceph, R2) is: a JSONL object and a folder of Parquet parts score as the same local files do."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app

from .support.helpers import TINY_MODEL, assert_same_rows, write_jsonl

runner = CliRunner()
BUCKET = "clef-inputs"
QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Urgent?"},
    "team": {"type": "choice", "criteria": {"billing": "Money", "tech": None}},
}
COMMON = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--hidden-states", "drop"]


@pytest.fixture(params=["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def endpoint_variable(request):
    return request.param


@pytest.fixture
def s3_env(s3_server, monkeypatch, endpoint_variable):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    for name, value in {
        endpoint_variable: s3_server,
        "AWS_ACCESS_KEY_ID": "clef-test",
        "AWS_SECRET_ACCESS_KEY": "clef-test-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata lookups for credentials
    }.items():
        monkeypatch.setenv(name, value)
    import boto3

    client = boto3.client("s3", endpoint_url=s3_server)
    client.create_bucket(Bucket=BUCKET)
    yield client
    for item in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=item["Key"])
    client.delete_bucket(Bucket=BUCKET)


def local_inputs(folder):
    records = [{"id": f"t{i}", "state": "ticket " + "word " * (2 + 3 * i), "questions": QUESTIONS} for i in range(7)]
    jsonl = write_jsonl(folder / "records.jsonl", records[:3])
    parts = folder / "parts"
    parts.mkdir()
    for number, chunk in enumerate((records[3:5], records[5:])):
        columns = {
            "id": [r["id"] for r in chunk],
            "state": [r["state"] for r in chunk],
            "questions": [json.dumps(r["questions"]) for r in chunk],
        }
        pq.write_table(pa.table(columns), parts / f"part-{number}.parquet")
    return jsonl, parts


@pytest.mark.parametrize("endpoint_variable", ["AWS_ENDPOINT_URL"])
def test_s3_objects_and_folders_score_as_the_same_local_files(s3_env, tmp_path):
    jsonl, parts = local_inputs(tmp_path)
    s3_env.upload_file(str(jsonl), BUCKET, "in/records.jsonl")
    for part in sorted(parts.iterdir()):
        s3_env.upload_file(str(part), BUCKET, f"in/parts/{part.name}")
    local = runner.invoke(app, ["score", str(jsonl), str(parts), "-o", str(tmp_path / "local.parquet"), *COMMON])
    assert local.exit_code == 0, local.output
    uris = [f"s3://{BUCKET}/in/records.jsonl", f"s3://{BUCKET}/in/parts/"]
    remote = runner.invoke(app, ["score", *uris, "-o", str(tmp_path / "s3.parquet"), *COMMON])
    assert remote.exit_code == 0, remote.output
    assert "7 scored, 0 failed of 7 records" in remote.stderr
    s3_rows = pq.read_table(tmp_path / "s3.parquet").to_pylist()
    assert [row["id"] for row in s3_rows] == [f"t{i}" for i in range(7)]
    assert_same_rows(s3_rows, pq.read_table(tmp_path / "local.parquet").to_pylist())
    # the checkpoint fingerprints the objects' contents: a rerun finds every record done
    again = runner.invoke(app, ["score", *uris, "-o", str(tmp_path / "s3.parquet"), *COMMON])
    assert again.exit_code == 0, again.output
    assert re.search(r"\b0 run through the model, 7 from the checkpoint", again.stderr), again.stderr


def test_either_endpoint_variable_finds_objects_and_a_missing_one_is_a_usage_error(s3_env, tmp_path):
    from clef_cli.inputs.sources import expand_inputs

    s3_env.put_object(Bucket=BUCKET, Key="one/records.jsonl", Body=b'{"id": "a", "state": "x"}\n')
    (found,) = expand_inputs([f"s3://{BUCKET}/one/records.jsonl"])
    assert found.size == 26
    with found.open_binary() as handle:
        assert handle.read() == b'{"id": "a", "state": "x"}\n'
    result = runner.invoke(app, ["score", f"s3://{BUCKET}/nowhere.jsonl", "-o", str(tmp_path / "o.parquet"), *COMMON])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: input not found: s3://{BUCKET}/nowhere.jsonl"


@pytest.mark.parametrize("endpoint_variable", ["AWS_ENDPOINT_URL"])
def test_s3_compressed_objects_globs_and_hive_folders_read_as_local_files(s3_env, tmp_path):
    import gzip

    from clef_cli.inputs.readers import read_records
    from clef_cli.inputs.sources import expand_inputs

    jsonl, parts = local_inputs(tmp_path)
    data = jsonl.read_bytes()
    s3_env.put_object(Bucket=BUCKET, Key="z/a.jsonl.gz", Body=gzip.compress(data))
    with pa.BufferOutputStream() as sink, pa.CompressedOutputStream(sink, "zstd") as out:
        out.write(data)
        out.close()
        s3_env.put_object(Bucket=BUCKET, Key="z/b.jsonl.zst", Body=sink.getvalue().to_pybytes())
    s3_env.put_object(Bucket=BUCKET, Key="z/notes.txt", Body=b"not records")
    for number, part in enumerate(sorted(parts.iterdir())):
        s3_env.upload_file(str(part), BUCKET, f"hive/team=t{number}/{part.name}")
    s3_env.put_object(Bucket=BUCKET, Key="hive/_SUCCESS", Body=b"")

    def states(locations: list[str]) -> list[tuple[str, object]]:
        return [(record.id, record.state) for record in read_records(locations, questions=QUESTIONS)]

    globbed = expand_inputs([f"s3://{BUCKET}/z/*.jsonl*"])
    assert [part.location for part in globbed] == [f"s3://{BUCKET}/z/a.jsonl.gz", f"s3://{BUCKET}/z/b.jsonl.zst"]
    for part in globbed:
        assert states([part.location]) == states([str(jsonl)]), part.location
    hive = expand_inputs([f"s3://{BUCKET}/hive/"])
    assert [dict(part.partitions) for part in hive] == [{"team": "t0"}, {"team": "t1"}]
    assert states([f"s3://{BUCKET}/hive/"]) == states([str(parts)])
