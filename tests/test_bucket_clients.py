"""locations/buckets.py in the test's own process: the S3 configuration read from the
environment and the profile's files as pyarrow reads them (each source against a direct reading
of the case), the clients' timeouts and retries, one client per bucket, and each request of the
client against a bucket in memory (an obstore `MemoryStore`), so a mutation run tries every
planted bug quickly (test_buckets.py covers the same client against moto)."""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone

import obstore
import pytest
from obstore.store import MemoryStore

from clef_cli.locations import buckets, object_store
from clef_cli.locations.buckets import Bucket, ObjectInfo, WriteConflict, _info, _make_store, aws_config
from clef_cli.locations.failures import DENIED, ObjectStoreError, words_of
from clef_cli.locations.object_store import MissingObject
from clef_cli.locations.uris import LocationProblem

from .support.memory_bucket import NAME, ROOT, Refusals, denied, forget_served, keys_in, put_object, served, slow_down

NO_METADATA = {"AWS_EC2_METADATA_DISABLED": "true"}


@pytest.fixture
def files(tmp_path):
    """A credentials file and a config file, each with a default and a `night` profile; the
    environment naming them."""
    credentials = tmp_path / "credentials"
    credentials.write_text(
        "[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key = s-default\n"
        "[night]\naws_access_key_id = AKNIGHT\naws_secret_access_key = s-night\naws_session_token = t-night\n"
        "region = ap-south-1\n"
    )
    config = tmp_path / "config"
    config.write_text(
        "[default]\nregion = eu-north-1\n"
        "[profile night]\nregion = eu-west-3\nendpoint_url = http://minio.local:9000/\n"
        "[profile day]\naws_access_key_id = AKDAY\naws_secret_access_key = s-day\n"
    )
    return {"AWS_SHARED_CREDENTIALS_FILE": str(credentials), "AWS_CONFIG_FILE": str(config)}


# --------------------------------------------------------------------------- aws_config


def test_the_environments_keys_come_first_with_their_token(files):
    env = files | {"AWS_PROFILE": "night", "AWS_ACCESS_KEY_ID": "AKENV", "AWS_SECRET_ACCESS_KEY": "s-env"}
    assert aws_config(env | {"AWS_SESSION_TOKEN": "t-env"}) == {
        "access_key_id": "AKENV", "secret_access_key": "s-env", "token": "t-env",
        "region": "ap-south-1", "endpoint": "http://minio.local:9000",
    }  # fmt: skip
    assert "token" not in aws_config(env)  # the profile's token is not the environment keys'


def test_a_named_profile_is_read_from_both_files_the_credentials_first(files):
    """`[night]` in the credentials, `[profile night]` in the config: the credentials file's
    region wins over the config's, the config adds what it alone has."""
    assert aws_config(files | {"AWS_PROFILE": "night"}) == {
        "access_key_id": "AKNIGHT", "secret_access_key": "s-night", "token": "t-night",
        "region": "ap-south-1", "endpoint": "http://minio.local:9000",
    }  # fmt: skip


def test_the_default_profile_is_default_and_aws_default_profile_names_one(files):
    assert aws_config(files) == {
        "access_key_id": "AKDEFAULT", "secret_access_key": "s-default", "region": "eu-north-1",
    }  # fmt: skip
    found = aws_config(files | {"AWS_DEFAULT_PROFILE": "day"})
    assert (found["access_key_id"], found["secret_access_key"]) == ("AKDAY", "s-day")
    assert aws_config(files | {"AWS_PROFILE": "night", "AWS_DEFAULT_PROFILE": "day"})["access_key_id"] == "AKNIGHT"


def test_keys_only_in_the_config_file_are_read(files):
    found = aws_config(files | {"AWS_PROFILE": "day"})
    assert (found["access_key_id"], found["secret_access_key"], found["region"]) == ("AKDAY", "s-day", "us-east-1")
    assert "token" not in found


def test_half_the_environments_keys_is_none_the_profiles_are_read(files):
    env = files | {"AWS_PROFILE": "night", "AWS_ACCESS_KEY_ID": "AKENV", "AWS_SESSION_TOKEN": "t-env"}
    found = aws_config(env)
    assert (found["access_key_id"], found["token"]) == ("AKNIGHT", "t-night")
    found = aws_config(files | {"AWS_PROFILE": "night", "AWS_SECRET_ACCESS_KEY": "s-env"})
    assert found["secret_access_key"] == "s-night"


def test_a_key_without_its_secret_is_no_key(tmp_path):
    half = tmp_path / "credentials"
    half.write_text("[default]\naws_access_key_id = AKHALF\n")
    found = aws_config({"AWS_SHARED_CREDENTIALS_FILE": str(half), "AWS_CONFIG_FILE": str(half)} | NO_METADATA)
    assert found == {"skip_signature": True, "region": "us-east-1"}


def test_the_default_files_are_in_the_home_folder(tmp_path, monkeypatch):
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\naws_access_key_id = AKHOME\naws_secret_access_key = s\n")
    (tmp_path / ".aws" / "config").write_text("[default]\nregion = sa-east-1\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    found = aws_config({})
    assert (found["access_key_id"], found["region"]) == ("AKHOME", "sa-east-1")


def test_the_process_environment_is_read_when_none_is_given(monkeypatch, files):
    for name, value in (files | {"AWS_ACCESS_KEY_ID": "AKPROC", "AWS_SECRET_ACCESS_KEY": "s"}).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_REGION", "us-west-1")
    found = aws_config()
    assert (found["access_key_id"], found["region"]) == ("AKPROC", "us-west-1")


@pytest.mark.parametrize(
    ("env", "region"),
    [
        ({"AWS_REGION": "us-west-2", "AWS_DEFAULT_REGION": "us-east-2"}, "us-west-2"),
        ({"AWS_DEFAULT_REGION": "us-east-2"}, "us-east-2"),
        ({"AWS_PROFILE": "night"}, "ap-south-1"),
        ({"AWS_PROFILE": "day"}, "us-east-1"),
    ],
    ids=["region", "default-region", "profile", "none"],
)
def test_the_region_in_order_and_us_east_1_without_one(files, env, region):
    assert aws_config(files | env)["region"] == region


@pytest.mark.parametrize(
    ("env", "endpoint"),
    [
        ({"AWS_ENDPOINT_URL_S3": "http://s3.local/", "AWS_ENDPOINT_URL": "http://any.local"}, "http://s3.local"),
        ({"AWS_ENDPOINT_URL": "http://any.local//"}, "http://any.local"),
        ({"AWS_ENDPOINT_URL": "http://proxy.local/X/"}, "http://proxy.local/X"),
        ({"AWS_PROFILE": "night"}, "http://minio.local:9000"),
        ({}, None),
    ],
    ids=["s3-endpoint", "endpoint", "path", "profile", "none"],
)
def test_the_endpoint_in_order_without_its_trailing_slash(files, env, endpoint):
    assert aws_config(files | env).get("endpoint") == endpoint


def test_no_credentials_at_all_signs_nothing_only_with_the_metadata_off(tmp_path):
    """As pyarrow: with the instance's metadata off and no other source, an unsigned request."""
    none = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no"), "AWS_CONFIG_FILE": str(tmp_path / "no")}
    assert aws_config(none | NO_METADATA) == {"skip_signature": True, "region": "us-east-1"}
    assert aws_config(none) == {"region": "us-east-1"}  # obstore's chain asks the instance


@pytest.mark.parametrize(
    ("env", "alone"),
    [
        ({"AWS_EC2_METADATA_DISABLED": "true"}, True),
        ({"AWS_EC2_METADATA_DISABLED": "TRUE"}, True),
        ({"AWS_EC2_METADATA_DISABLED": "false"}, False),
        ({}, False),
        (NO_METADATA | {"AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/token"}, False),
        (NO_METADATA | {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/credentials"}, False),
        (NO_METADATA | {"AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://127.0.0.1/creds"}, False),
        (NO_METADATA | {"AWS_WEB_IDENTITY_TOKEN_FILE": ""}, True),
    ],
    ids=["off", "off-capitals", "on", "unset", "web-identity", "container", "container-full", "empty"],
)
def test_other_credentials_are_a_web_identity_a_container_or_the_instance(env, alone):
    assert buckets._no_other_credentials(env) is alone


# --------------------------------------------------------------------------- _make_store


@pytest.fixture
def s3_env(monkeypatch, tmp_path):
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s-env")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9/")
    return monkeypatch


@pytest.mark.parametrize(
    ("quick", "upload", "retries", "patience", "read_timeout"),
    [(False, False, 10, 10, "3s"), (True, False, 2, 8, "3s"), (False, True, 10, 10, None)],
    ids=["patient", "quick", "upload"],
)
def test_an_s3_client_has_the_modules_timeouts_and_retries(s3_env, quick, upload, retries, patience, read_timeout):
    """2 s to connect, 60 s a request, no byte for 3 s fails a try (not for an upload's client);
    10 retries within 10 s, a quick client 2 (ATTEMPTS tries) within 8 s; an http endpoint allowed."""
    store = _make_store("s3://night", quick, upload)
    expected = {"connect_timeout": "2s", "timeout": "1m", "allow_http": "true"}
    assert store.client_options == expected | ({"read_timeout": read_timeout} if read_timeout else {})
    assert store.retry_config["max_retries"] == retries
    assert store.retry_config["retry_timeout"] == timedelta(seconds=patience)
    assert store.config == {
        "bucket": "night", "access_key_id": "AKENV", "secret_access_key": "s-env",
        "region": "us-east-1", "endpoint": "http://127.0.0.1:9",
    }  # fmt: skip


def test_a_session_token_is_obstores_session_token_and_https_is_not_http(s3_env):
    s3_env.setenv("AWS_SESSION_TOKEN", "t-env")
    s3_env.setenv("AWS_ENDPOINT_URL", "https://s3.example.com")
    store = _make_store("s3a://night", False)
    assert store.config["session_token"] == "t-env" and "token" not in store.config
    assert store.config["bucket"] == "night"
    assert store.client_options["allow_http"] == "false"


def test_without_an_endpoint_http_is_not_allowed(s3_env):
    s3_env.delenv("AWS_ENDPOINT_URL")
    assert _make_store("s3://night", False).client_options["allow_http"] == "false"


def test_another_clouds_client_has_the_same_timeouts(s3_env):
    store = _make_store("gs://pictures", True)
    assert store.config["bucket"] == "pictures"
    assert store.client_options == {"connect_timeout": "2s", "timeout": "1m", "read_timeout": "3s"}
    assert (store.retry_config["max_retries"], store.retry_config["retry_timeout"]) == (2, timedelta(seconds=8))


def test_a_client_obstore_cannot_configure_is_one_line_naming_the_bucket(s3_env):
    with pytest.raises(ObjectStoreError) as raised:
        _make_store("az://container", False)
    text = "Generic MicrosoftAzure error: Account must be specified Debug source: Generic { store: "
    assert str(raised.value).startswith(f"az://container: cannot open it (its configuration: {text}")
    assert str(raised.value).endswith(")") and "\n" not in str(raised.value)
    assert raised.value.detail.startswith(text) and raised.value.__cause__ is None


def test_a_long_configuration_error_is_cut_to_300_characters_its_whole_kept(s3_env):
    import obstore.store

    def refuse(*args, **kwargs):
        raise ValueError("bad\n  " + "x" * 400)

    s3_env.setattr(obstore.store, "S3Store", refuse)
    with pytest.raises(ObjectStoreError) as raised:
        _make_store("s3://night", False)
    assert str(raised.value) == f"s3://night: cannot open it (its configuration: {('bad ' + 'x' * 400)[:300]})"
    assert raised.value.detail == "bad " + "x" * 400


def test_a_bucket_built_from_the_environment_uploads_without_the_read_timeout(s3_env):
    client = Bucket("s3://night")
    assert client.store.client_options["read_timeout"] == "3s"
    assert client.store.retry_config["max_retries"] == client.uploads.retry_config["max_retries"] == 10
    assert "read_timeout" not in client.uploads.client_options
    assert client.store.config["bucket"] == client.uploads.config["bucket"] == "night"
    quick = Bucket("s3://night", quick=True)
    assert quick.store.retry_config["max_retries"] == quick.uploads.retry_config["max_retries"] == 2


# --------------------------------------------------------------------------- bucket(), serve_from


def test_one_client_per_bucket_and_patience(s3_env):
    buckets.forget()
    try:
        first = buckets.bucket("s3://night/a/b")
        assert buckets.bucket("s3://night/c") is first and first.root == "s3://night"
        quick = buckets.bucket("s3://night/c", quick=True)
        assert quick is not first and quick.store.retry_config["max_retries"] == 2
        assert buckets.bucket("s3://night/d", quick=True) is quick
        buckets.forget()
        assert buckets.bucket("s3://night/c") is not first
    finally:
        buckets.forget()


def test_a_scheme_the_store_does_not_reach_is_a_location_problem():
    with pytest.raises(LocationProblem) as raised:
        buckets.bucket("hdfs://cluster/store/")
    assert (
        str(raised.value)
        == "hdfs://cluster/store/: clef's store reaches s3, s3a, gs, az, abfs, abfss URIs, not hdfs://"
    )


def test_a_served_bucket_is_its_store_until_unserved_and_outlives_forget(s3_env):
    store = MemoryStore()
    buckets.forget()
    buckets.serve_from(ROOT, store)
    try:
        client = buckets.bucket(f"{ROOT}/x", quick=True)
        assert client.store is store and client.uploads is store and client.root == ROOT
        buckets.forget()
        assert buckets.bucket(f"{ROOT}/y") is client
        buckets.serve_from(ROOT, None)
        built = buckets.bucket(f"{ROOT}/y")
        assert built is not client and built.store.config["bucket"] == "clef-memory"
        buckets.serve_from(ROOT, None)  # unserved already: nothing to do
    finally:
        forget_served(ROOT)
        buckets.forget()


# --------------------------------------------------------------------------- a client's requests


@pytest.fixture
def client(monkeypatch):
    from clef_cli.locations import object_store

    store = MemoryStore()
    monkeypatch.setattr(object_store, "RETRY_DELAYS", ())
    buckets.serve_from(ROOT, store)
    yield buckets.bucket(ROOT), store
    forget_served(ROOT)


def test_keys_and_uris_of_a_bucket(client):
    found, _ = client
    assert found.key(f"{ROOT}/a/b.json") == "a/b.json" and found.uri("a/b.json") == f"{ROOT}/a/b.json"
    with pytest.raises(ValueError) as raised:
        found.key("s3://clef-other/a")
    assert str(raised.value) == f"s3://clef-other/a is not in {ROOT}"


def test_reads_whole_in_ranges_and_heads(client):
    found, store = client
    put_object(store, "a/data", b"0123456789")
    assert found.get("a/data") == b"0123456789"
    assert found.get_range("a/data", 2, 5) == b"234"
    assert found.get_ranges("a/data", [(0, 1), (8, 10), (3, 4)]) == [b"0", b"89", b"3"]
    info = found.head("a/data")
    meta = obstore.head(store, "a/data")
    assert info == ObjectInfo("a/data", 10, meta["last_modified"].timestamp(), meta["e_tag"].strip('"'))


def test_a_missing_object_is_named_by_its_uri(client):
    found, _ = client
    for read in (lambda: found.get("a/none"), lambda: found.get_range("a/none", 0, 1), lambda: found.head("a/none")):
        with pytest.raises(MissingObject) as raised:
            read()
        assert str(raised.value) == f"object not found: {ROOT}/a/none"
    with pytest.raises(MissingObject) as raised:
        found.get_ranges("a/none", [(0, 1)])
    assert str(raised.value) == f"object not found: {ROOT}/a/none"


def test_a_conditional_put_never_overwrites_and_a_plain_one_does(client):
    found, store = client
    found.put("m/1.json", b"first", create=True)
    with pytest.raises(WriteConflict) as raised:
        found.put("m/1.json", b"second", create=True)
    assert str(raised.value) == "m/1.json"
    found.put("m/1.json", b"third")
    assert keys_in(store) == {"m/1.json": b"third"}


def test_small_bytes_go_through_the_timed_client_the_rest_through_the_uploads(client, tmp_path):
    """Bytes up to SMALL_PUT (1 MiB) through the client with the read timeout; a larger body, a
    file, or pieces through the one without it."""
    found, store = client
    found.uploads = MemoryStore()
    local = tmp_path / "segment"
    local.write_bytes(b"file bytes")
    found.put("small", b"s" * (1 << 20))
    found.put("large", b"l" * ((1 << 20) + 1))
    found.put("file", local)
    found.put("pieces", lambda: iter([b"one ", b"two"]))
    assert set(keys_in(store)) == {"small"}
    assert keys_in(found.uploads) == {
        "large": b"l" * ((1 << 20) + 1), "file": b"file bytes", "pieces": b"one two",
    }  # fmt: skip


def test_pieces_are_asked_for_again_on_each_try(client, monkeypatch):
    from clef_cli.locations import object_store

    monkeypatch.setattr(object_store, "RETRY_DELAYS", (0.0,))
    found, store = client
    asked = []
    real = obstore.put

    def put(target, key, body, **options):
        if not asked[1:]:
            raise slow_down(key)
        return real(target, key, body, **options)

    def pieces():
        asked.append(1)
        return iter([b"again"])

    object_store._answered.add(ROOT)  # the store answered this process: its 503 is the moment's
    monkeypatch.setattr(obstore, "put", put)
    found.put("p", pieces)
    assert len(asked) == 2 and keys_in(store) == {"p": b"again"}


def test_a_download_streams_into_the_file_and_says_its_size(client, tmp_path):
    found, store = client
    data = bytes(range(256)) * 5000
    put_object(store, "seg/1", data)
    target = tmp_path / "seg-1"
    target.write_bytes(b"older and longer" * 100_000)
    assert found.download("seg/1", target) == len(data)
    assert target.read_bytes() == data
    with pytest.raises(MissingObject) as raised:
        found.download("seg/none", tmp_path / "none")
    assert str(raised.value) == f"object not found: {ROOT}/seg/none"


def test_a_download_in_several_parts_says_its_whole_size(monkeypatch, tmp_path):
    """An object the store streams in parts (a folder store's 8 MiB pieces; a memory store's is
    one): the size said is every part's."""
    from obstore.store import LocalStore

    (tmp_path / "store").mkdir()
    store = LocalStore(str(tmp_path / "store"))
    data = bytes(range(256)) * (17 << 12)  # 17 MiB: three parts
    put_object(store, "seg/big", data)
    buckets.serve_from(ROOT, store)
    try:
        assert buckets.bucket(ROOT).download("seg/big", tmp_path / "big") == len(data)
    finally:
        forget_served(ROOT)
    assert (tmp_path / "big").read_bytes() == data


def test_a_delete_removes_and_a_missing_object_is_gone_already(client):
    found, store = client
    put_object(store, "a/1", b"x")
    put_object(store, "a/2", b"y")
    found.delete("a/1")
    found.delete("a/1")
    assert keys_in(store) == {"a/2": b"y"}


def test_a_listing_in_key_order_after_an_offset(client):
    found, store = client
    for key in ("m/3", "m/1", "m/2", "n/1", "m/sub/4"):
        put_object(store, key, key.encode())
    assert [info.key for info in found.list("m/")] == ["m/1", "m/2", "m/3", "m/sub/4"]
    assert [info.key for info in found.list("m/", offset="m/2")] == ["m/3", "m/sub/4"]
    assert [info.size for info in found.list("n/")] == [3]
    assert list(found.list("none/")) == []


def test_the_names_directly_under_a_folder_folders_with_a_slash(client):
    found, store = client
    for key in ("s/a", "s/b/1", "s/b/2", "s/c/d/3", "t/x", "root"):
        put_object(store, key, b"x")
    assert sorted(found.top_level("s/")) == ["a", "b/", "c/"]
    assert sorted(found.top_level("")) == ["root", "s/", "t/"]
    assert found.top_level("none/") == []
    put_object(store, "s/BOX/in", b"x")
    put_object(store, "s/BOX/X/deep", b"x")
    assert sorted(found.top_level("s/BOX/")) == ["X/", "in"]


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        (
            {"path": "a/b", "size": 7, "last_modified": datetime(2026, 12, 7, 15, 0, 1, 500000, timezone.utc),
             "e_tag": '"abc"'},
            ObjectInfo("a/b", 7, datetime(2026, 12, 7, 15, 0, 1, 500000, timezone.utc).timestamp(), "abc"),
        ),
        ({"path": "a/c", "size": None, "e_tag": None}, ObjectInfo("a/c", 0, 0.0, "")),
        ({"path": "a/d"}, ObjectInfo("a/d", 0, 0.0, "")),
        ({"path": "a/e", "e_tag": "X0aX"}, ObjectInfo("a/e", 0, 0.0, "X0aX")),
    ],
    ids=["whole", "nones", "bare", "opaque-etag"],
)  # fmt: skip
def test_an_objects_info_from_what_obstore_says(meta, expected):
    found = _info(meta)
    assert found == expected and type(found.size) is int and type(found.key) is str


@pytest.fixture
def watched(monkeypatch):
    """The bucket in memory seen by both clients, obstore's calls refusable (tests/support/memory_bucket.py)."""
    store, _ = served(monkeypatch)
    yield buckets.bucket(ROOT), store, Refusals(monkeypatch)
    forget_served(ROOT)


def test_a_refused_request_is_the_jobs_even_after_a_read(watched):
    """The store's requests are the store's own (its manifests, segments): access denied there is
    the job's credentials, however many media objects of the bucket were read."""
    found, store, refusals = watched
    put_object(store, "in/a.png", b"png")
    object_store.read_object(f"{ROOT}/in/a.png", 10, io.BytesIO())
    refusals.refuse("put", denied)
    with pytest.raises(ObjectStoreError) as raised:
        found.put("m/1.json", b"x")
    assert str(raised.value) == f"{ROOT}/m/1.json: {words_of(DENIED, NAME)}"


def test_a_delete_a_store_answers_404_is_gone_already_and_a_refused_one_names_its_object(watched):
    found, _, refusals = watched
    refusals.refuse("delete", lambda key: FileNotFoundError(f"Object at location {key} not found"))
    found.delete("m/1.json")
    refusals.refuse("delete", denied)
    with pytest.raises(ObjectStoreError) as raised:
        found.delete("m/1.json")
    assert str(raised.value) == f"{ROOT}/m/1.json: {words_of(DENIED, NAME)}"


def test_a_refused_folder_listing_names_the_folder(watched, monkeypatch):
    found, _, _ = watched

    def refused(store, prefix=None):
        raise denied(prefix or "")

    monkeypatch.setattr(obstore, "list_with_delimiter", refused)
    with pytest.raises(ObjectStoreError) as raised:
        found.top_level("m/")
    assert str(raised.value) == f"{ROOT}/m/: {words_of(DENIED, NAME)}"


def test_a_refused_listing_names_the_prefix_listed(watched):
    found, _, refusals = watched
    refusals.refuse("list", denied, when=lambda key: True)
    with pytest.raises(ObjectStoreError) as raised:
        list(found.list("m/"))
    assert str(raised.value) == f"{ROOT}/m/: {words_of(DENIED, NAME)}"
