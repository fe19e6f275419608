"""The bucket client (locations/buckets.py) against moto's S3 server: conditional writes, ranged
reads, listings from an offset, the environment pyarrow reads, and failures sorted as every other
object read's (a missing object, a throttling storm retried, the job's own errors in one line)."""

from __future__ import annotations

import time

import pytest

from clef_cli.locations import buckets
from clef_cli.locations.buckets import WriteConflict, aws_config
from clef_cli.locations.object_store import MissingObject, ObjectStoreError

BUCKET = "clef-buckets"


@pytest.fixture
def s3(store_bucket):
    return store_bucket


def test_a_conditional_write_never_overwrites_and_reads_take_ranges_and_offsets(s3):
    bucket = buckets.bucket(f"s3://{BUCKET}/store/")
    bucket.put("store/manifests/00000001.json", b"first", create=True)
    with pytest.raises(WriteConflict):
        bucket.put("store/manifests/00000001.json", b"second", create=True)
    assert bucket.get("store/manifests/00000001.json") == b"first"
    bucket.put("store/manifests/00000002.json", b"0123456789", create=True)
    assert bucket.get_range("store/manifests/00000002.json", 2, 5) == b"234"
    assert bucket.get_ranges("store/manifests/00000002.json", [(0, 1), (8, 10)]) == [b"0", b"89"]
    assert bucket.head("store/manifests/00000002.json").size == 10
    listed = [info.key for info in bucket.list("store/manifests/", offset="store/manifests/00000001.json")]
    assert listed == ["store/manifests/00000002.json"]
    bucket.delete("store/manifests/00000002.json")
    bucket.delete("store/manifests/00000002.json")  # gone already: nothing to do
    with pytest.raises(MissingObject):
        bucket.get("store/manifests/00000002.json")


def test_the_environment_is_the_one_pyarrow_reads(tmp_path):
    credentials = tmp_path / "credentials"
    credentials.write_text("[night]\naws_access_key_id = AKNIGHT\naws_secret_access_key = s3cret\n")
    config = tmp_path / "config"
    config.write_text("[profile night]\nregion = eu-west-3\nendpoint_url = http://minio.local:9000\n")
    files = {"AWS_SHARED_CREDENTIALS_FILE": str(credentials), "AWS_CONFIG_FILE": str(config)}
    found = aws_config({**files, "AWS_PROFILE": "night"})
    assert found["access_key_id"] == "AKNIGHT" and found["secret_access_key"] == "s3cret"
    assert found["region"] == "eu-west-3" and found["endpoint"] == "http://minio.local:9000"
    environment = {**files, "AWS_PROFILE": "night", "AWS_ACCESS_KEY_ID": "AKENV", "AWS_SECRET_ACCESS_KEY": "x"}
    environment |= {"AWS_REGION": "us-west-2", "AWS_ENDPOINT_URL": "http://a:1", "AWS_ENDPOINT_URL_S3": "http://b:2"}
    found = aws_config(environment)
    assert (found["access_key_id"], found["region"], found["endpoint"]) == ("AKENV", "us-west-2", "http://b:2")
    anonymous = aws_config({**files, "AWS_PROFILE": "none", "AWS_EC2_METADATA_DISABLED": "true"})
    assert anonymous.get("skip_signature") is True and "access_key_id" not in anonymous


def test_a_throttling_storm_is_retried_with_backoff(s3, proxy):
    bucket = buckets.bucket(f"s3://{BUCKET}/store/")
    proxy.failures["store/storm"] = 4
    bucket.put("store/storm", b"x", create=True)
    assert bucket.get("store/storm") == b"x"
    assert proxy.count("PUT", "store/storm") == 5


def test_the_jobs_own_failures_are_one_store_error(s3, monkeypatch):
    with pytest.raises(ObjectStoreError, match="does not exist"):
        buckets.bucket("s3://no-such-bucket-here/x").get("x")
    s3.put_object(Bucket=BUCKET, Key="x", Body=b"x")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    buckets.forget()
    with pytest.raises(ObjectStoreError, match="no credentials"):  # unsigned, refused: locations/failures.py
        buckets.bucket(f"s3://{BUCKET}/x").get("x")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "clef-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "clef-test-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    buckets.forget()
    started = time.monotonic()
    with pytest.raises(ObjectStoreError, match=r"cannot connect to the endpoint http://127\.0\.0\.1:9 "):
        buckets.bucket(f"s3://{BUCKET}/x", quick=True).get("x")
    assert time.monotonic() - started < 15
