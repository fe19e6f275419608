"""locations/object_store.py in the test's own process, against a bucket in memory seen through
pyarrow's filesystem interface (tests/support/memory_bucket.py): an object read whole after its size is
checked, its stamp from the headers or from one LIST per folder, the bucket asked after an object
was not found, the one filesystem per bucket with the module's timeouts, and the sorting and
retrying of failures by what this process has met of the store (answered, read)."""

from __future__ import annotations

import io
from datetime import datetime

import pyarrow.fs as pafs
import pytest

from clef_cli.locations import object_store
from clef_cli.locations.failures import DENIED, NO_BUCKET, SILENT, words_of
from clef_cli.locations.object_store import (
    MissingObject,
    NoSuchBucket,
    ObjectStamp,
    ObjectStoreError,
    _head_stamp,
    _retried,
    _short,
    check_bucket,
    filesystem,
    read_object,
    stamp,
)
from clef_cli.locations.uris import LocationProblem

from .support.memory_bucket import NAME, ROOT, forget_served, put_object, served

MEDIA = f"{ROOT}/in/a.png"
ACCESS_DENIED = "AWS Error ACCESS_DENIED during GetObject operation: No response body."
SLOW_DOWN = "AWS Error SLOW_DOWN during GetObject operation: Please reduce your request rate."
TIMED_OUT = "AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 28, Timeout was reached"


@pytest.fixture
def bucket(monkeypatch):
    store, handler = served(monkeypatch)
    yield store, handler
    forget_served(ROOT)


class Handle:
    """An input file whose `metadata()` is `headers`."""

    def __init__(self, headers):
        self.headers = headers

    def metadata(self):
        return self.headers


def seconds_of(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp()) * 1_000_000_000


# --------------------------------------------------------------------------- read_object


def test_an_object_is_copied_whole_into_the_file_given_over_what_it_held(bucket):
    """The target's earlier bytes are gone (a retried read starts again from nothing); the stamp
    is what the read saw: its size, its Last-Modified to the second, its ETag without quotes."""
    store, _ = bucket
    put_object(store, "in/a.png", b"\x89PNG pixels")
    into = io.BytesIO(b"an earlier, longer attempt's bytes")
    into.seek(5)
    found = read_object(MEDIA, 11, into)
    assert into.getvalue() == b"\x89PNG pixels"
    meta = object_store_head(store, "in/a.png")
    expected = int(meta["last_modified"].timestamp()) * 1_000_000_000
    assert found == ObjectStamp(11, expected, meta["e_tag"].strip('"'))


def object_store_head(store, key):
    from .support.memory_bucket import _head

    return _head(store, key)


def test_an_object_larger_than_a_read_piece_is_copied_in_pieces(bucket, monkeypatch):
    store, _ = bucket
    monkeypatch.setattr(object_store, "CHUNK", 4)
    put_object(store, "in/a.png", b"0123456789")
    into = io.BytesIO()
    assert read_object(MEDIA, 10, into).size == 10
    assert into.getvalue() == b"0123456789"


def test_an_object_over_the_limit_is_refused_before_a_byte_is_read(bucket):
    store, _ = bucket
    put_object(store, "in/a.png", b"0123456789")
    into = io.BytesIO(b"kept?")
    with pytest.raises(LocationProblem) as raised:
        read_object(MEDIA, 9, into)
    assert str(raised.value) == f"object is 10 bytes, over the limit of 9: {MEDIA}"
    assert not raised.value.transient and into.getvalue() == b""
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_a_missing_object_is_the_records_error(bucket):
    with pytest.raises(MissingObject) as raised:
        read_object(MEDIA, 10, io.BytesIO())
    assert str(raised.value) == f"object not found: {MEDIA}"


def test_access_denied_before_any_read_is_the_jobs_and_after_one_the_objects(bucket):
    """Before any object of the bucket was read, the credentials are wrong for every record (the
    job's error, named by `what`); after one was read, it is that object's ACL (the record's)."""
    store, handler = bucket
    put_object(store, "in/ok.png", b"ok")
    handler.fail = OSError(ACCESS_DENIED)
    with pytest.raises(ObjectStoreError) as raised:
        read_object(MEDIA, 10, io.BytesIO(), what="input")
    assert str(raised.value) == f"input {MEDIA}: {words_of(DENIED, NAME)}"
    assert raised.value.__cause__ is None
    handler.fail = None
    read_object(f"{ROOT}/in/ok.png", 10, io.BytesIO())
    handler.fail = OSError(ACCESS_DENIED)
    with pytest.raises(LocationProblem) as raised:
        read_object(MEDIA, 10, io.BytesIO())
    assert type(raised.value) is LocationProblem and str(raised.value) == f"access denied: {MEDIA}"


def test_a_default_reader_is_named_media(bucket):
    _, handler = bucket
    handler.fail = OSError(ACCESS_DENIED)
    with pytest.raises(ObjectStoreError) as raised:
        read_object(MEDIA, 10, io.BytesIO())
    assert str(raised.value) == f"media {MEDIA}: {words_of(DENIED, NAME)}"


def test_a_timeout_before_the_store_answered_is_the_endpoints_and_after_it_the_moments(bucket):
    """A store that never answered this process: the job ends (one line). One that answered:
    retried after each of RETRY_DELAYS, then the record's transient error."""
    store, handler = bucket
    handler.fail = OSError(TIMED_OUT)
    with pytest.raises(ObjectStoreError) as raised:
        read_object(MEDIA, 10, io.BytesIO())
    assert str(raised.value) == f"media {MEDIA}: {words_of(SILENT, NAME)}"
    handler.fail = None
    put_object(store, "in/ok.png", b"ok")
    read_object(f"{ROOT}/in/ok.png", 10, io.BytesIO())
    handler.fail = OSError(TIMED_OUT)
    with pytest.raises(LocationProblem) as raised:
        read_object(MEDIA, 10, io.BytesIO())
    assert raised.value.transient and str(raised.value).startswith(f"the store kept failing for {MEDIA}: ")


# --------------------------------------------------------------------------- _retried


def test_a_failing_store_is_tried_again_after_each_delay_then_given_up(bucket, monkeypatch):
    """RETRY_DELAYS are slept between tries (2 s by default), the last failure the transient
    error; a call that then succeeds returns its value and marks the store as answered."""
    slept: list[float] = []
    monkeypatch.setattr(object_store.time, "sleep", slept.append)
    monkeypatch.setattr(object_store, "RETRY_DELAYS", (2.0, 5.0))
    tries = []

    def flaky():
        tries.append(1)
        if len(tries) < 3:
            raise OSError(SLOW_DOWN)
        return "bytes"

    assert _retried(MEDIA, False, flaky) == "bytes"
    assert (len(tries), slept) == (3, [2.0, 5.0])
    assert ROOT in object_store._answered
    tries.clear(), slept.clear()

    def failing():
        tries.append(1)
        raise OSError(SLOW_DOWN)

    with pytest.raises(LocationProblem) as raised:
        _retried(MEDIA, False, failing)
    assert raised.value.transient and (len(tries), slept) == (3, [2.0, 5.0])


def test_a_failure_that_is_not_transient_is_not_tried_again(bucket, monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(object_store.time, "sleep", slept.append)
    monkeypatch.setattr(object_store, "RETRY_DELAYS", (2.0,))
    tries = []

    def missing():
        tries.append(1)
        raise FileNotFoundError("Path does not exist")

    with pytest.raises(MissingObject):
        _retried(MEDIA, False, missing)
    assert (len(tries), slept, ROOT in object_store._answered) == (1, [], False)


def test_a_failure_of_another_kind_than_the_clients_is_not_sorted(bucket):
    """`errors`: what the client raises; anything else is a bug of ours, raised as it is."""

    def broken():
        raise KeyError("ours")

    with pytest.raises(KeyError):
        _retried(MEDIA, False, broken)
    with pytest.raises(ValueError):
        _retried(MEDIA, False, lambda: (_ for _ in ()).throw(ValueError("x")), errors=(OSError,))


# --------------------------------------------------------------------------- stamp, listings


def test_a_stamp_comes_from_its_folders_one_listing(bucket):
    """Size and last-modified to the second; the folder listed once for every object in it; a
    folder (common prefix) is no object; an object not in the listing is not found."""
    store, handler = bucket
    put_object(store, "in/a.png", b"12345")
    put_object(store, "in/b.png", b"12")
    put_object(store, "in/sub/c.png", b"1")
    meta = object_store_head(store, "in/a.png")
    moment = int(meta["last_modified"].timestamp()) * 1_000_000_000
    assert stamp(MEDIA) == ObjectStamp(5, moment)
    assert stamp(f"{ROOT}/in/b.png").size == 2
    with pytest.raises(LocationProblem) as raised:
        stamp(f"{ROOT}/in/sub")
    assert str(raised.value) == f"object not found: {ROOT}/in/sub"
    with pytest.raises(LocationProblem, match="object not found"):
        stamp(f"{ROOT}/in/new.png")  # written after the listing: the process keeps its listing
    with pytest.raises(LocationProblem, match="object not found"):
        stamp(f"{ROOT}/in/c.png")  # in/sub/c.png is not in in/
    assert handler.listings == 1


def test_a_folder_whose_name_ends_in_any_letter_is_the_one_listed(bucket):
    store, _ = bucket
    put_object(store, "in/a.png", b"outer")
    put_object(store, "in/BOX/a.png", b"in the box")
    assert stamp(f"{ROOT}/in/BOX/a.png").size == len(b"in the box")


def test_an_empty_or_missing_folder_has_no_objects(bucket):
    _, handler = bucket
    handler.fail = FileNotFoundError("Path does not exist 'clef-memory/gone'")
    with pytest.raises(LocationProblem) as raised:
        stamp(f"{ROOT}/gone/a.png")
    assert str(raised.value) == f"object not found: {ROOT}/gone/a.png"


def test_a_failing_listing_is_transient_and_not_kept(bucket):
    store, handler = bucket
    put_object(store, "in/a.png", b"12345")
    handler.fail = OSError(SLOW_DOWN)
    with pytest.raises(LocationProblem) as raised:
        stamp(MEDIA)
    assert raised.value.transient
    handler.fail = None
    assert stamp(MEDIA).size == 5


def test_a_refused_listing_is_the_jobs_error_named_by_what(bucket):
    """A listing is the folder's: denied there is every record's, even after a read."""
    store, handler = bucket
    put_object(store, "in/ok.png", b"ok")
    read_object(f"{ROOT}/in/ok.png", 10, io.BytesIO())
    handler.fail = OSError("AWS Error ACCESS_DENIED during ListObjectsV2 operation: No response body.")
    with pytest.raises(ObjectStoreError) as raised:
        stamp(MEDIA, "input")
    assert str(raised.value) == f"input {MEDIA}: {words_of(DENIED, NAME)}"
    assert raised.value.__cause__ is None
    with pytest.raises(ObjectStoreError, match=rf"^media {MEDIA}: access denied"):
        stamp(MEDIA)


def test_the_listings_kept_are_bounded_the_latest_used_kept(bucket, monkeypatch):
    """LISTINGS_KEPT folders: the one used longest ago is listed again, one used lately is not."""
    store, handler = bucket
    monkeypatch.setattr(object_store, "LISTINGS_KEPT", 3)
    for folder in "abcd":
        put_object(store, f"{folder}/x", b"x")
    for folder in "abc":
        stamp(f"{ROOT}/{folder}/x")
    stamp(f"{ROOT}/a/x")  # a used again: b is now the oldest
    stamp(f"{ROOT}/d/x")  # b dropped
    assert handler.listings == 4
    stamp(f"{ROOT}/a/x")
    assert handler.listings == 4
    stamp(f"{ROOT}/b/x")
    assert handler.listings == 5
    assert list(object_store._listings) == [f"{ROOT}/{f}/" for f in "dab"]
    assert set(object_store._listing_locks) == set(object_store._listings)


def test_sixty_four_folders_listings_are_kept(bucket):
    store, handler = bucket
    for number in range(65):
        put_object(store, f"f{number}/x", b"x")
    for number in range(64):
        stamp(f"{ROOT}/f{number}/x")
    stamp(f"{ROOT}/f0/x")
    assert handler.listings == 64
    stamp(f"{ROOT}/f64/x")
    stamp(f"{ROOT}/f1/x")  # the oldest but f0, used again
    assert handler.listings == 66


# --------------------------------------------------------------------------- check_bucket


def test_a_missing_bucket_is_said_after_a_missing_object(bucket):
    _, handler = bucket
    check_bucket(MEDIA, "input")  # the bucket is there: nothing to say
    handler.exists = False
    with pytest.raises(NoSuchBucket) as raised:
        check_bucket(MEDIA, "input")
    assert str(raised.value) == f"input {MEDIA}: {words_of(NO_BUCKET, NAME)}"
    assert raised.value.detail == ""  # no server's answer to show under -v


def test_a_bucket_pyarrow_reads_as_missing_is_missing(bucket):
    _, handler = bucket
    handler.fail = FileNotFoundError("Path does not exist 'clef-memory'")
    with pytest.raises(NoSuchBucket) as raised:
        check_bucket(MEDIA, "media")
    assert str(raised.value) == f"media {MEDIA}: {words_of(NO_BUCKET, NAME)}"


def test_a_bucket_that_cannot_be_asked_is_the_jobs_error_named_by_what(bucket):
    _, handler = bucket
    handler.fail = OSError("AWS Error ACCESS_DENIED during HeadBucket operation: No response body.")
    with pytest.raises(ObjectStoreError) as raised:
        check_bucket(MEDIA, "input")
    assert type(raised.value) is ObjectStoreError
    assert str(raised.value) == f"input {MEDIA}: {words_of(DENIED, NAME)}"
    assert raised.value.__cause__ is None


def test_the_bucket_itself_is_asked(bucket):
    """The bucket's name, not the object's key (an object missing in a bucket that is there)."""
    _, handler = bucket
    asked: list = []
    real = handler.get_file_info
    handler.get_file_info = lambda paths: asked.extend(paths) or real(paths)
    check_bucket(f"{ROOT}/in/deep/a.png", "input")
    assert asked == [NAME]


def test_a_bucket_refused_after_a_read_is_still_the_jobs_error(bucket):
    """Asking for the bucket is a listing's question: denied there is the job's, read or not."""
    store, handler = bucket
    put_object(store, "in/ok.png", b"ok")
    read_object(f"{ROOT}/in/ok.png", 10, io.BytesIO())
    handler.fail = OSError("AWS Error ACCESS_DENIED during HeadBucket operation: No response body.")
    with pytest.raises(ObjectStoreError) as raised:
        check_bucket(MEDIA, "input")
    assert str(raised.value) == f"input {MEDIA}: {words_of(DENIED, NAME)}"


# --------------------------------------------------------------------------- _head_stamp


MODIFIED = "2026-12-07T15:28:18Z"
SAME = "2026-12-07T15:28:18+00:00"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Last-Modified": MODIFIED.encode(), "ETag": b'"5d41"'}, (seconds_of("2026-12-07T15:28:18+00:00"), "5d41")),
        ({"last-modified": "Mon, 07 Dec 2026 15:28:18 GMT", "etag": "5d41"}, (seconds_of(SAME), "5d41")),
        ({"LAST-MODIFIED": b"2026-12-07T15:28:18.250+01:00"}, (seconds_of("2026-12-07T14:28:18+00:00"), "")),
        ({"Last-Modified": b"not a date", "x-amz-version-id": b"v1", "VersionId": b"v7"}, (0, "v7")),
        ({"Last-Modified": b"Tue, 99 Foo 2026", "ETag": b'""', "versionid": b"v2"}, (0, "v2")),
        ({"ETag": b'"a"b"'}, (0, 'a"b')),
        ({"ETag": b'"X0aX"'}, (0, "X0aX")),
        ({}, (0, "")),
    ],
    ids=["s3-iso", "rfc-1123", "offset-fraction", "bad-date-version", "bad-rfc-empty-etag", "quoted-etag",
         "opaque-etag", "none"],
)  # fmt: skip
def test_an_objects_stamp_is_read_from_its_headers(headers, expected):
    """Header names in any case, values bytes or text; ISO or HTTP dates to the second; the
    ETag unquoted, else the version id; a date no parser reads is 0 (never equal to a listing's)."""
    assert _head_stamp(Handle(headers), 7) == ObjectStamp(7, *expected)


def test_a_handle_without_metadata_has_no_stamp_but_its_size():
    assert _head_stamp(Handle(None), 3) == ObjectStamp(3, 0, "")


def test_an_integer_header_is_read_as_text():
    """A filesystem other than S3's may give a value as a number."""
    assert _head_stamp(Handle({"ETag": 1234}), 1) == ObjectStamp(1, 0, "1234")


# --------------------------------------------------------------------------- filesystems


class Opened:
    """pyarrow's `FileSystem` whose `from_uri` is counted and answers a local filesystem based at `base`."""

    def __init__(self, base: str) -> None:
        self.base, self.roots = base, []

    def from_uri(self, root):
        self.roots.append(root)
        return pafs.LocalFileSystem(), self.base


class Refusing:
    def __init__(self, refuse) -> None:
        self.from_uri = refuse


def test_one_filesystem_per_bucket_and_the_key_joined_to_its_base(monkeypatch):
    object_store.forget()
    opened = Opened("/base/")
    monkeypatch.setattr(pafs, "FileSystem", opened)
    try:
        fs, path = filesystem("gs://pictures/in/a.png")
        assert isinstance(fs, pafs.LocalFileSystem) and path == "/base/in/a.png"
        again, root = filesystem("gs://pictures")
        assert again is fs and root == "/base/"
        assert filesystem("gs://others/x")[1] == "/base/x"
        assert opened.roots == ["gs://pictures", "gs://others"]
        opened.base = "BOX"  # a base without its slash (the bucket's name), whatever letter ends it
        assert filesystem("gs://boxes")[1] == "BOX" and filesystem("gs://boxes/in/a.png")[1] == "BOX/in/a.png"
    finally:
        object_store.forget()


def test_forget_drops_the_filesystems_and_what_the_stores_said(monkeypatch):
    object_store.forget()
    opened = Opened("b")
    monkeypatch.setattr(pafs, "FileSystem", opened)
    filesystem("gs://pictures/a")
    object_store._answered.add("gs://pictures"), object_store._readable.add("gs://pictures")
    object_store.forget()
    filesystem("gs://pictures/a")
    assert opened.roots == ["gs://pictures", "gs://pictures"]
    assert not object_store._answered and not object_store._readable
    object_store.forget()


@pytest.mark.parametrize("error", [ValueError, OSError, ImportError], ids=["value", "os", "import"])
def test_a_bucket_pyarrow_cannot_open_is_a_location_problem_in_one_short_line(monkeypatch, error):
    object_store.forget()

    def refuse(root):
        raise error("Cannot open\n  the filesystem   (Request ID: 4F2A)  now\nDebug source:\n  Tree { deep }")

    monkeypatch.setattr(pafs, "FileSystem", Refusing(refuse))
    with pytest.raises(LocationProblem) as raised:
        filesystem("gs://pictures/a.png")
    assert str(raised.value) == "cannot open gs://pictures: Cannot open the filesystem now"
    assert raised.value.__cause__ is None and not raised.value.transient
    assert "gs://pictures" not in object_store._filesystems


@pytest.mark.parametrize(
    ("text", "short"),
    [
        ("one  two\tthree\n four", "one two three four"),
        ("refused (Request ID: ABC123) at the door", "refused at the door"),
        ("refused(Request ID: X)", "refused"),
        ("kept (request id: x) as it is", "kept (request id: x) as it is"),
        ("a\nDebug source:\nb Debug source: c", "a"),
        ("x" * 400, "x" * 300),
    ],
    ids=["spaces", "request-id", "request-id-no-space", "other-case", "debug-tree", "long"],
)
def test_a_clients_error_is_shortened_to_its_first_words(text, short):
    assert _short(OSError(text)) == short


def test_an_s3_filesystem_gets_the_modules_timeouts_and_tries_and_keeps_the_rest():
    given = pafs.S3FileSystem(region="eu-west-3", endpoint_override="http://127.0.0.1:9", anonymous=True)
    found = object_store._with_policy(given)
    options = found.__reduce__()[1][0]
    assert (options["connect_timeout"], options["request_timeout"]) == (2.0, 3.0)
    assert (options["region"], options["endpoint_override"], options["anonymous"]) == (
        "eu-west-3", "http://127.0.0.1:9", True,
    )  # fmt: skip
    assert isinstance(found, pafs.S3FileSystem) and found is not given


def test_a_filesystem_other_than_s3_is_kept_as_it_is():
    local = pafs.LocalFileSystem()
    assert object_store._with_policy(local) is local


def test_a_stamps_time_is_cut_to_the_second():
    assert object_store._seconds(1_796_657_298_999_999_999) == 1_796_657_298_000_000_000
    assert object_store._seconds(999_999_999) == 0


def test_an_oversize_keeps_its_size():
    assert object_store._Oversize(12).size == 12


def test_access_denied_by_its_http_status_too(bucket):
    """A 403 without S3's code (a gateway's answer) reads as access denied."""
    _, handler = bucket
    handler.fail = OSError("AWS Error UNKNOWN (HTTP status 403) during GetObject operation: Forbidden")
    with pytest.raises(ObjectStoreError) as raised:
        read_object(MEDIA, 10, io.BytesIO())
    assert str(raised.value) == f"media {MEDIA}: {words_of(DENIED, NAME)}"


def test_a_failure_met_reading_an_object_is_sorted_as_a_read_not_a_listing(bucket):
    """inputs/sources.py sorts a stream's failure itself: denied after a read of the bucket is
    that object's, as a read's is (a listing's would be the job's)."""
    store, _ = bucket
    put_object(store, "in/ok.png", b"ok")
    read_object(f"{ROOT}/in/ok.png", 10, io.BytesIO())
    found = object_store._classify(OSError(ACCESS_DENIED), MEDIA)
    assert type(found) is LocationProblem and str(found) == f"access denied: {MEDIA}"


def test_an_empty_objects_stamp_is_zero_bytes(bucket):
    store, _ = bucket
    put_object(store, "in/empty.png", b"")
    assert stamp(f"{ROOT}/in/empty.png").size == 0
