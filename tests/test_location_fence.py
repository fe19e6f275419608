"""Untrusted records stay inside their fences (issue 50, points 1-3, 10 and 11): one check for
every location string (no control character, no credentials), made on the key the S3 client
sends; where a record came from decides what it may reach; credentials are never written; an
error names the location as the record wrote it and never tells whether a file exists. Against
moto's S3 server behind the counting proxy: its request log says what the store was asked for."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.encoding.media import MediaError, MediaLimits, close_source, open_source
from clef_cli.errors import RecordError, UsageError
from clef_cli.inputs.readers import read_records
from clef_cli.inputs.sources import InputFile
from clef_cli.locations import object_store
from clef_cli.locations.fence import Place, Roots, local_entry, media_base, place
from clef_cli.locations.uris import LocationProblem, normalized, option_location
from clef_cli.store.record_key import MediaHasher

from .support.helpers import MEDIA, TINY_MODEL, write_jsonl
from .support.s3_proxy import S3Proxy

runner = CliRunner()
BUCKET, OTHER_BUCKET = "fence-bkt", "fence-other"
QUESTIONS = {"q": {"type": "noul", "instructions": "Urgent?"}}
IMAGE = (MEDIA / "image_a.png").read_bytes()
OBJECTS = {
    BUCKET: ("records/ok.png", "media/ok.png", "other/x.png", "media-private/x.png", "records-x/x.png"),
    OTHER_BUCKET: ("x.png", "media/x.png"),
}
ALLOWED = ("records/", "media/")
"""What a record of s3://fence-bkt/records/ may reach under --media-root s3://fence-bkt/media."""
SECRET = "Sup3rSECRETkey"
COMMON = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--hidden-states", "drop", "--max-length", "4096"]
CONTROLS = [chr(code) for code in (*range(0x20), 0x7F)]
MARK = "clef-secret-"
"""In the name of every local file no record here may open."""
opened: list[str] = []
"""Every such file this process opened (the 'open' audit event) since the last `opened.clear()`."""


def _audit(event: str, args: tuple) -> None:
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if MARK in path:
            opened.append(path)


sys.addaudithook(_audit)  # an audit hook cannot be removed; it only notes paths


@pytest.fixture(scope="module")
def store(s3_server):
    """Two buckets (objects inside and outside the fence) behind a counting proxy, and the
    environment that points pyarrow at the proxy; yields the proxy."""
    import boto3

    proxy = S3Proxy(s3_server)
    proxy.url = proxy.start()
    with pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            patch.delenv(name, raising=False)
        for name, value in {
            "AWS_ENDPOINT_URL": proxy.url,
            "AWS_ACCESS_KEY_ID": "clef-test",
            "AWS_SECRET_ACCESS_KEY": "clef-test-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }.items():
            patch.setenv(name, value)
        patch.setattr(object_store, "RETRY_DELAYS", ())
        client = boto3.client("s3", endpoint_url=s3_server)
        for bucket, keys in OBJECTS.items():
            client.create_bucket(Bucket=bucket)
            for key in keys:
                client.put_object(Bucket=bucket, Key=key, Body=IMAGE)
        proxy.client = client
        object_store.forget()
        yield proxy
        object_store.forget()
        proxy.stop()
        for bucket in OBJECTS:
            for item in client.list_objects_v2(Bucket=bucket).get("Contents", []):
                client.delete_object(Bucket=bucket, Key=item["Key"])
            client.delete_bucket(Bucket=bucket)


def outside_requests(proxy: S3Proxy) -> list[tuple[str, str]]:
    """The requests the server got (keys as it decoded them) for anything but `ALLOWED` in
    BUCKET: an object's key, or a listing's prefix."""
    found = []
    for method, target in list(proxy.requests):
        path, _, query = target.partition("?")
        bucket, _, key = path.lstrip("/").partition("/")
        if "prefix=" in query:
            key = query.split("prefix=", 1)[1].split("&", 1)[0]
        elif query or not key:
            key = "records/" if bucket == BUCKET else key  # the bucket itself (its region, a listing)
        if bucket != BUCKET or not key.startswith(ALLOWED):
            found.append((method, target))
    return found


def read_entry(entry: str, base, limits: MediaLimits) -> tuple[str, str | bytes]:
    """(the record key's part, the bytes decoding reads or the record's error) for one entry."""
    key = MediaHasher(limits).entry(entry, base)
    try:
        source = open_source(entry, base, limits, "images")
    except MediaError as error:
        return key, str(error)
    try:
        return key, source.read() if isinstance(source, io.IOBase) else Path(source).read_bytes()
    finally:
        close_source(source)


# --------------------------------------------------------------------------- 1: control characters


@pytest.mark.parametrize("control", CONTROLS, ids=[f"0x{ord(c):02x}" for c in CONTROLS])
def test_a_control_character_is_refused_in_every_location_string(store, control, tmp_path):
    """The S3 client cuts a key at a NUL (and curl then resolves the `..` it leaves): C0 and DEL
    are refused in an object URI, a relative object entry, a local path, a URL and an option."""
    with pytest.raises(LocationProblem, match="control character"):
        normalized(f"s3://{BUCKET}/media/..{control}/media-private/x.png")
    limits = MediaLimits()
    for entry, base in (
        (f"..{control}/other/x.png", f"s3://{BUCKET}/records/"),
        (f"s3://{BUCKET}/records/..{control}/other/x.png", f"s3://{BUCKET}/records/"),
        (str(tmp_path / f"a{control}.png"), tmp_path),
        (f"https://example.com/a{control}.png", tmp_path),
    ):
        key, read = read_entry(entry, base, limits)
        assert key.startswith("refused:") and "control character" in key, (entry, key)
        assert isinstance(read, str) and "control character" in read and "\\x" in read, (entry, read)
        assert control not in read  # the message shows it escaped: it cannot hide or forge a line
    with pytest.raises(UsageError, match="control character"):
        option_location(f"s3://{BUCKET}/in{control}/", "input")


def test_a_lone_surrogate_is_refused_not_a_crash():
    """A JSON string may hold a lone surrogate, which has no UTF-8 bytes to send."""
    with pytest.raises(LocationProblem, match="surrogate"):
        normalized(f"s3://{BUCKET}/records/\ud800.png")
    key, read = read_entry("\ud800.png", f"s3://{BUCKET}/records/", MediaLimits())
    assert key.startswith("refused:") and "surrogate" in read


def test_the_key_sent_is_the_key_tested(store):
    """Besides cutting at a NUL, the client changes a key in one way only: curl resolves `.` and
    `..` segments (pyarrow refuses an empty one). The fence resolves them first, so the key the
    store is asked for is the normalised one; every other character is sent as written."""
    limits = MediaLimits(object_roots=(f"s3://{BUCKET}/media",))
    written = ["a/./b.png", "a//b.png", "x/../b.png", "b.png.", "a\\b.png", "%2e%2e/b.png", "．．/b.png",
               " ../b.png", "..%2fother/x.png", "caf\u00e9.png", "cafe\u0301.png", "a;b+c~d.png"]  # fmt: skip
    # C1 controls and U+2028/U+2029 are refused (issue 57.6): tests/test_location_controls.py
    for entry in written:
        store.clear()
        read_entry(entry, f"s3://{BUCKET}/records/", limits)
        uri = normalized(f"s3://{BUCKET}/records/{entry}")
        objects = [target for _, target in store.requests if "?" not in target]
        assert objects and set(objects) == {uri.removeprefix("s3:/")}, (entry, store.requests)
        assert not outside_requests(store), (entry, store.requests)


# --------------------------------------------------------------------------- 2: where a record came from


def test_a_record_from_a_bucket_cannot_name_a_local_file(tmp_path):
    """Absolute paths and file: URIs in a remote input's records are refused from their text
    alone, the same words whether the file exists or not, and nothing is opened; a local
    --media-root lets such a record read the files under it, and only those."""
    secret = tmp_path / "clef-secret-0f3a.png"
    secret.write_bytes(IMAGE)
    base = media_base(f"s3://{BUCKET}/night/")  # as a Ray actor gets it, from a row's text
    assert base == f"s3://{BUCKET}/night/"
    answers = {}
    opened.clear()
    for entry in (str(secret), str(tmp_path / "none.png"), f"file://{secret}", f"file:{secret}"):
        key, read = read_entry(entry, base, MediaLimits())
        assert isinstance(read, str), (entry, read)
        assert f"a record from s3://{BUCKET}/night/ cannot name a local file" in read, read
        assert "add a local --media-root to allow it" in read and key == f"refused:{read}"
        answers[entry] = read.replace(entry, "<entry>")
    assert not [path for path in opened if secret.name in path], opened
    assert len(set(answers.values())) == 1, answers  # no "file not found" beside "not decodable"
    inside = MediaLimits(media_roots=(tmp_path,))
    assert read_entry(str(secret), base, inside)[1] == IMAGE
    assert [path for path in opened if secret.name in path]  # the audit hook does see an open
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _, read = read_entry(str(secret), base, MediaLimits(media_roots=(elsewhere,)))
    assert "outside the media roots" in read


def test_any_media_root_fences_every_kind_of_location(tmp_path):
    """With only an s3:// root, a local input's local paths are fenced too (refused unread); with
    no root at all they stay unconfined, as documented."""
    image = tmp_path / "clef-secret-1b2c.png"
    image.write_bytes(IMAGE)
    fenced = MediaLimits(object_roots=(f"s3://{BUCKET}/media/",))
    opened.clear()
    answers = []
    for entry in (image.name, str(image), str(tmp_path / "none.png")):
        key, read = read_entry(entry, tmp_path, fenced)
        assert isinstance(read, str) and "is outside the media roots (--media-root)" in read, read
        assert key == f"refused:{read}"
        answers.append(read.replace(entry, "<entry>"))
    assert len(set(answers)) == 1 and not [path for path in opened if image.name in path], opened
    assert read_entry(image.name, tmp_path, MediaLimits())[1] == IMAGE


def test_a_local_inputs_folder_carried_as_text_stays_a_local_origin(tmp_path):
    """A Ray row carries the origin as text: a local folder's comes back a path, so its records
    read their relative and absolute local files as in a local run; no folder is no origin."""
    (tmp_path / "a.png").write_bytes(IMAGE)
    base = media_base(str(tmp_path))
    assert base == tmp_path
    assert read_entry("a.png", base, MediaLimits())[1] == IMAGE
    assert read_entry(str(tmp_path / "a.png"), base, MediaLimits())[1] == IMAGE
    assert media_base("") is None and media_base(None) is None
    # with no folder, only a relative entry is the record's error, and the sentence says the way out
    refused = "relative media path a.png in an input with no folder: use absolute paths"
    assert read_entry("a.png", None, MediaLimits()) == (f"refused:{refused}", refused)


def test_a_local_file_with_a_colon_in_its_name_is_read_by_path_and_by_file_uri(tmp_path):
    """Only a scheme before the first colon makes a URI: `/data/a:b.png` is a path."""
    image = tmp_path / "a:b.png"
    image.write_bytes(IMAGE)
    for entry in (str(image), f"file://{image}", "a:b.png"):
        assert read_entry(entry, tmp_path, MediaLimits())[1] == IMAGE, entry
    for entry in (str(image), f"file://{image}"):  # a record with no input folder (a library caller's)
        assert read_entry(entry, None, MediaLimits())[1] == IMAGE, entry


def test_every_spelling_of_a_local_file_uri_names_the_same_file_inside_a_media_root(tmp_path):
    """`file:/abs`, `file://abs`, `file:///abs` and `local:` name `/abs`, which a --media-root over
    its folder lets a record read; a URI without a path (`file:a.png`) is a relative entry."""
    image = tmp_path / "a.png"
    image.write_bytes(IMAGE)
    inside = MediaLimits(media_roots=(tmp_path,))
    for entry in (f"file:{image}", f"file:/{image}", f"file://{image}", f"local://{image}", f"FILE:{image}"):
        assert local_entry(entry) == image, entry
        assert read_entry(entry, tmp_path, inside)[1] == IMAGE, entry
    assert local_entry("file:///Xmedia/a.png") == Path("/Xmedia/a.png")
    assert local_entry("file:a.png") is None and local_entry("s3://b/a.png") is None


def test_a_data_url_is_its_own_bytes_whatever_the_records_origin(tmp_path):
    """In a bucket's record as in a local one, a data: URL is never taken for an object or file
    (nothing to fetch or fence), and messages call it that, not its (long) text."""
    url = "data:image/png;base64,AAAA"
    for base in (f"s3://{BUCKET}/records/", tmp_path, None):
        assert place(url, base, Roots(objects=(f"s3://{BUCKET}/media/",))) == Place("data", url, "a data: URL")


def test_each_kind_of_entry_is_placed_whole_with_the_text_the_record_wrote(tmp_path):
    """`place`'s answer, every field: an http(s) URL goes to the one checked fetcher as written,
    whatever the record's origin or roots (the fetcher fences its address); an object carries its
    normalised URI and a local file its path, each with the entry as written for messages."""
    roots = Roots(local=(tmp_path,), objects=(f"s3://{BUCKET}/media/",))
    for url in ("http://media.example/a.png", "https://media.example/a.png?x=1"):
        for base in (f"s3://{BUCKET}/records/", tmp_path, None):
            assert place(url, base, roots) == Place("url", url, url), (url, base)
    uri = f"s3://{BUCKET}/media/a.png"
    assert place(uri, tmp_path, roots) == Place("object", uri, uri)
    assert place("a.png", f"s3://{BUCKET}/media/", roots) == Place("object", uri, "a.png")
    inside = tmp_path / "a.png"
    assert place(str(inside), tmp_path, roots) == Place("file", inside, str(inside))
    assert place("a.png", tmp_path, roots) == Place("file", inside, "a.png")


def test_an_input_uri_with_a_query_string_is_still_a_remote_origin(tmp_path):
    """Its folder is unusable (media must be absolute URIs), but its records name no local file."""
    secret = tmp_path / "clef-secret-9d8e.png"
    secret.write_bytes(IMAGE)
    base = InputFile(f"s3://{BUCKET}/in/records.jsonl?region=us-east-1", 0).base_dir
    assert media_base(str(base)) == base
    _, read = read_entry(str(secret), base, MediaLimits())
    assert isinstance(read, str) and "cannot name a local file" in read


# --------------------------------------------------------------------------- 3: credentials


def test_credentials_in_a_location_are_refused_with_exit_2_and_never_shown(store, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    local = write_jsonl(tmp_path / "r.jsonl", [{"id": "a", "state": "x", "questions": QUESTIONS}])
    store.client.put_object(Bucket=BUCKET, Key="in/r.jsonl", Body=local.read_bytes())
    output, checkpoint = str(work / "o.parquet"), ["--checkpoint", str(work / "store")]
    for args in (
        [f"s3://AKIAEXAMPLE:{SECRET}@{BUCKET}/in/r.jsonl", "-o", output],
        [f"s3://{SECRET}@{BUCKET}/in/r.jsonl", "-o", output],
        [f"https://user:{SECRET}@example.com/r.jsonl", "-o", output],
        [str(local), "-o", f"s3://AKIAEXAMPLE:{SECRET}@{BUCKET}/out/o.parquet", *checkpoint],
        [str(local), "-o", output, "--checkpoint", f"s3://AKIAEXAMPLE:{SECRET}@{BUCKET}/store"],
        [str(local), "-o", output, "--media-root", f"s3://AKIAEXAMPLE:{SECRET}@{BUCKET}/media/"],
    ):
        result = runner.invoke(app, ["score", *args, *COMMON])
        assert result.exit_code == 2, (args, result.output)
        assert "put credentials in the environment" in result.stderr, (args, result.stderr)
        assert SECRET not in result.output and len(result.stderr.strip().splitlines()) == 1, result.output
        assert not list(work.iterdir()), args  # nothing written


def test_a_record_naming_credentials_fails_and_no_byte_written_holds_them(store, tmp_path):
    """The record's error shows the location masked; the output, every file of the checkpoint
    (keys.sqlite, journals, shards) and what the command printed hold no secret."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "ok.png").write_bytes(IMAGE)
    records = write_jsonl(
        inputs / "r.jsonl",
        [
            {"id": "ok", "state": "fine", "questions": QUESTIONS, "images": ["ok.png"]},
            {
                "id": "key",
                "state": "x",
                "questions": QUESTIONS,
                "images": [f"s3://AKIA:{SECRET}@{BUCKET}/media/ok.png"],
            },
            {"id": "user", "state": "x", "questions": QUESTIONS, "images": [f"s3://{SECRET}@{BUCKET}/media/ok.png"]},
            {"id": "url", "state": "x", "questions": QUESTIONS, "images": [f"https://u:{SECRET}@example.com/a.png"]},
        ],
    )
    written = tmp_path / "written"
    written.mkdir()
    args = ["score", str(records), "-o", str(written / "o.parquet"), "--checkpoint", str(written / "store"), *COMMON]
    result = runner.invoke(app, [*args, "--media-root", f"s3://{BUCKET}/media/", "--media-root", str(inputs)])
    assert result.exit_code == 3, result.output
    rows = {row["id"]: row for row in pq.read_table(written / "o.parquet").to_pylist()}
    assert rows["ok"]["error"] is None
    for name in ("key", "user", "url"):
        assert rows[name]["error_kind"] == "media" and "put credentials in the environment" in rows[name]["error"]
        assert "***@" in rows[name]["error"], rows[name]["error"]
    files = [path for path in written.rglob("*") if path.is_file()]
    assert any(path.name == "keys.sqlite" for path in files) and len(files) > 3, files
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in result.output


# --------------------------------------------------------------------------- 10: as the record wrote it


def test_error_cells_name_the_location_as_the_record_wrote_it(processor, tmp_path):
    """Not the host's absolute path: neither clef's own message nor a decoder's (PyAV quotes the
    file it opened)."""
    from clef_cli.encoding.prompt import PromptEncoder

    (tmp_path / "bad.mp4").write_text("not a video")
    records = write_jsonl(
        tmp_path / "r.jsonl",
        [
            {"id": "missing", "state": "s", "questions": QUESTIONS, "images": ["img/none.png"]},
            {"id": "bad", "state": "s", "questions": QUESTIONS, "videos": ["bad.mp4"]},
        ],
    )
    encoder = PromptEncoder(processor, max_length=4096)
    for record, written in zip(read_records([records]), ("img/none.png", "bad.mp4"), strict=True):
        with pytest.raises(RecordError) as failed:
            encoder.encode(record)
        assert written in failed.value.message and str(tmp_path) not in failed.value.message, failed.value.message


# --------------------------------------------------------------------------- 11: hostile strings

PIECES = [
    "..", ".", "/", "//", "\\", "%2e", "%2E%2e", "%2f", "%00", "%252e", "\x00", "\x01", "\t", "\n", "\x7f", "\x85",
    "．", "․", "\u2024\u2024", "\uff0f", "\u2215", "media", "records", "media-private", "records-x", "other", "x.png",
    "ok.png", f"s3://{BUCKET}/", f"s3://{OTHER_BUCKET}/", "S3://", "s3:", "gs://", "file://", "file:", "local://",
    "~", "@", ":", f"AKIA:{SECRET}@", "?", "#", " ", "\ud800", "/tmp/", "clef-secret-7c1d.png",
]  # fmt: skip
hostile = st.lists(st.sampled_from(PIECES), min_size=1, max_size=8).map("".join) | st.text(max_size=12)


@pytest.fixture(scope="module")
def outside_file(tmp_path_factory):
    """A local file no record of the bucket may open."""
    path = tmp_path_factory.mktemp("host") / "clef-secret-7c1d.png"
    path.write_bytes(IMAGE)
    return path


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entry=hostile)
@example(entry="..\x00/other/x.png")
@example(entry="..\x00/..\x00/fence-other/x.png")
@example(entry=f"s3://{BUCKET}/media/..\x00/media-private/x.png")
@example(entry="/tmp/clef-secret-7c1d.png")
@example(entry="file:///tmp/clef-secret-7c1d.png")
@example(entry=f"s3://AKIA:{SECRET}@{BUCKET}/media/ok.png")
def test_no_hostile_location_reaches_outside_the_fence(store, outside_file, entry):
    """Whatever a record of s3://fence-bkt/records/ writes, keying and decoding it ask the store
    for nothing outside records/ and media/ (the --media-root), open no local file, and fail as
    the record's error, never the job's."""
    if entry.startswith("/tmp/") or entry.startswith("file:///tmp/"):
        entry = entry.replace("/tmp/clef-secret-7c1d.png", str(outside_file))
    limits = MediaLimits(object_roots=(f"s3://{BUCKET}/media",), allow_remote=False)
    store.clear()
    opened.clear()
    key, read = read_entry(entry, f"s3://{BUCKET}/records/", limits)
    assert not outside_requests(store), (entry, store.requests)
    assert not [path for path in opened if outside_file.name in path], (entry, opened)
    if entry.lower().startswith(f"s3://akia:{SECRET.lower()}@"):  # credentials: refused, masked
        assert SECRET not in key and isinstance(read, str) and SECRET not in read
    if isinstance(read, bytes):
        assert read == IMAGE and normalized(f"s3://{BUCKET}/records/{entry}").endswith("ok.png")


def test_a_bucket_of_hostile_records_is_scored_inside_its_fence(store, outside_file, tmp_path):
    """End to end: the issue's cases in a remote JSONL and a Parquet `{bytes: null, path}` cell,
    scored; each is its record's error, the good record is scored, the store was asked for
    nothing outside the fence and no local file was opened."""
    entries = {
        "nul": "..\x00/other/x.png",
        "nul_bucket": "..\x00/..\x00/fence-other/x.png",
        "nul_root": f"s3://{BUCKET}/media/..\x00/media-private/x.png",
        "local": str(outside_file),
        "file_uri": f"file://{outside_file}",
        "credentials": f"s3://AKIA:{SECRET}@{BUCKET}/media/ok.png",
        "ok": "ok.png",
        "root": f"s3://{BUCKET}/media/ok.png",
    }
    lines = "".join(
        json.dumps({"id": name, "state": "s", "questions": QUESTIONS, "images": [entry]}) + "\n"
        for name, entry in entries.items()
    )
    store.client.put_object(Bucket=BUCKET, Key="records/r.jsonl", Body=lines.encode())
    table = pa.table(
        {
            "id": ["cell"],
            "state": ["s"],
            "questions": [json.dumps(QUESTIONS)],
            "images": [[{"bytes": None, "path": f"s3://{BUCKET}/media/..\x00/media-private/x.png"}]],
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    store.client.put_object(Bucket=BUCKET, Key="records/r.parquet", Body=sink.getvalue())
    store.clear()
    opened.clear()
    output = tmp_path / "o.parquet"
    inputs = [f"s3://{BUCKET}/records/r.jsonl", f"s3://{BUCKET}/records/r.parquet"]
    result = runner.invoke(app, ["score", *inputs, "-o", str(output), "--media-root", f"s3://{BUCKET}/media", *COMMON])
    assert result.exit_code == 3, result.output
    assert not outside_requests(store), store.requests
    assert not [path for path in opened if outside_file.name in path], opened
    rows = {row["id"]: row for row in pq.read_table(output).to_pylist()}
    assert rows["ok"]["error"] is None and rows["root"]["error"] is None
    for name in ("nul", "nul_bucket", "nul_root", "cell"):
        assert rows[name]["error_kind"] == "media" and "control character" in rows[name]["error"], rows[name]
    for name in ("local", "file_uri"):
        assert "cannot name a local file" in rows[name]["error"] and str(outside_file) in rows[name]["error"]
    assert "put credentials in the environment" in rows["credentials"]["error"]
    assert SECRET not in result.output and SECRET.encode() not in output.read_bytes()


@pytest.mark.slow  # a Ray cluster and a scoring run (about 40 s on the 2-core machine)
@pytest.mark.ray
def test_a_ray_actor_applies_the_same_fence(store, cluster, outside_file, tmp_path):
    """The record's origin reaches the actor with the record (its folder's URI, as text): a
    bucket's record naming a local file fails there as it does in a local run."""
    from clef_cli.engines.ray.job import RayScoreJob, RaySettings

    from .support.helpers import settings_for

    records = [
        {"id": "ok", "state": "s", "questions": QUESTIONS, "images": ["ok.png"]},
        {"id": "local", "state": "s", "questions": QUESTIONS, "images": [str(outside_file)]},
        {"id": "nul", "state": "s", "questions": QUESTIONS, "images": ["..\x00/other/x.png"]},
    ]
    lines = "".join(json.dumps(record) + "\n" for record in records)
    store.client.put_object(Bucket=BUCKET, Key="records/ray.jsonl", Body=lines.encode())
    store.clear()
    settings = settings_for(tmp_path, [f"s3://{BUCKET}/records/ray.jsonl"], hidden_states="drop", max_length=4096)
    summary = RayScoreJob(settings, RaySettings(num_workers=1, cpus_per_worker=0.5, block_records=2)).run()
    assert summary.failed == 2, summary
    rows = {row["id"]: row for row in pq.read_table(tmp_path / "out.parquet").to_pylist()}
    assert rows["ok"]["error"] is None
    assert "cannot name a local file" in rows["local"]["error"] and "control character" in rows["nul"]["error"]
    assert not outside_requests(store), store.requests
