"""locations/uploads.py in the test's own process, against a bucket in memory
(tests/support/memory_bucket.py): an output put whole at its key (one request up to SINGLE_PUT_BYTES,
parts above), the output's preflight (a probe beside it, never on it), the store's probe (a
conditional put refused the second time, a listing, a delete) and the words of each refusal, as
test_bucket_errors.py and test_store_preflight.py expect them from moto, but quick enough for a
mutation run to try every planted bug."""

from __future__ import annotations

import io
import re

import obstore
import pytest
from obstore.store import MemoryStore

from clef_cli.errors import UsageError
from clef_cli.locations import buckets, object_store
from clef_cli.locations.failures import DENIED, FAILING, NO_BUCKET, ObjectStoreError, words_of
from clef_cli.locations.object_store import NoSuchBucket
from clef_cli.locations.uploads import ConditionIgnored, WriteRefused, check_writable, probe_writes, upload_whole
from clef_cli.locations.uris import LocationProblem

from .support.memory_bucket import (
    NAME,
    ROOT,
    Refusals,
    denied,
    forget_served,
    keys_in,
    no_such_bucket,
    odd,
    put_object,
    served,
    slow_down,
)

OUTPUT = f"{ROOT}/out/o.parquet"
PROBE_KEY = re.compile(r"out/\.o\.parquet\.clef-probe-[0-9a-f]{12}")
NOT_UPLOADED = "; the output was not uploaded: rerun to upload it again"
OTHER = "the object store refused the request (run `clef -v ...` for its answer)"


@pytest.fixture
def bucket(monkeypatch):
    store, handler = served(monkeypatch)
    yield store, handler, Refusals(monkeypatch)
    forget_served(ROOT)


def local_file(tmp_path, data: bytes):
    path = tmp_path / "o.parquet"
    path.write_bytes(data)
    return path


# --------------------------------------------------------------------------- upload_whole


def test_an_output_lands_whole_at_its_key(bucket, tmp_path):
    """The file's bytes, at the key the URI names, nothing else made (no temporary key, no folder
    marker); a path given as text is a path too."""
    store, _, refusals = bucket
    upload_whole(str(local_file(tmp_path, b"PAR1 rows PAR1")), OUTPUT)
    assert keys_in(store) == {"out/o.parquet": b"PAR1 rows PAR1"}
    assert refusals.calls == [
        ("put", "out/o.parquet", {"use_multipart": False, "chunk_size": 16 << 20, "max_concurrency": 4})
    ]


def test_a_file_goes_through_the_client_without_the_read_timeout(bucket, tmp_path):
    """reqwest's read timeout counts the body's upload: even a small file is put through
    `Bucket.uploads` (test_bucket_errors.py shows a slow one cut on the other client)."""
    store, _, _ = bucket
    client = buckets.bucket(OUTPUT)
    client.uploads = MemoryStore()
    upload_whole(local_file(tmp_path, b"x" * 10), OUTPUT)
    assert keys_in(client.uploads) == {"out/o.parquet": b"x" * 10} and keys_in(store) == {}


@pytest.mark.parametrize(
    ("extra", "multipart"), [(0, False), (1, True)], ids=["at-the-single-put-limit", "one-byte-over"]
)
def test_one_request_up_to_64_mib_and_16_mib_parts_above(bucket, tmp_path, extra, multipart):
    """A PUT up to 64 MiB (whole or nothing); one byte over, a multipart upload in 16 MiB parts,
    four at once. The object is the file either way."""
    store, _, refusals = bucket
    path = tmp_path / "big.parquet"
    with open(path, "wb") as handle:
        handle.truncate((64 << 20) + extra)  # sparse: quick to make
        handle.seek(0)
        handle.write(b"head")
    upload_whole(path, OUTPUT)
    assert refusals.calls == [
        ("put", "out/o.parquet", {"use_multipart": multipart, "chunk_size": 16 << 20, "max_concurrency": 4})
    ]
    head = obstore.head(store, "out/o.parquet")
    assert head["size"] == (64 << 20) + extra
    assert bytes(obstore.get_range(store, "out/o.parquet", start=0, end=6)) == b"head\0\0"


@pytest.mark.parametrize(
    ("error", "failure", "words", "detail"),
    [
        (denied, DENIED, words_of(DENIED, NAME), "<Code>AccessDenied</Code>"),
        (slow_down, FAILING, words_of(FAILING, NAME), f"the store kept failing for {OUTPUT}: "),
        (odd, "other", OTHER, f"cannot read {OUTPUT}: "),
        (no_such_bucket, NO_BUCKET, words_of(NO_BUCKET, NAME), "<Code>NoSuchBucket</Code>"),
    ],
    ids=["denied", "throttled", "unknown-answer", "no-bucket"],
)
def test_a_refused_upload_is_one_line_naming_the_output_and_leaves_nothing(
    bucket, tmp_path, error, failure, words, detail
):
    """At the job's end every refusal is exit 1 (work was done: a rerun uploads it), named by
    `-o` and the output's URI, the cause's words and the rerun hint; the server's answer kept for
    `-v`; the bucket as it was."""
    store, _, refusals = bucket
    refusals.refuse("put", error)
    with pytest.raises(ObjectStoreError) as raised:
        upload_whole(local_file(tmp_path, b"rows"), OUTPUT)
    assert type(raised.value) is ObjectStoreError  # not a usage error, even for the bucket
    assert str(raised.value) == f"-o {OUTPUT}: {words}{NOT_UPLOADED}"
    assert (raised.value.failure, raised.value.words) == (failure, words)
    assert detail in raised.value.detail
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    assert keys_in(store) == {}


def test_an_upload_to_a_place_no_store_holds_is_a_usage_error(bucket, tmp_path):
    with pytest.raises(UsageError) as raised:
        upload_whole(local_file(tmp_path, b"x"), "https://example.invalid/o.parquet")
    assert (
        str(raised.value)
        == "-o 'https://example.invalid/o.parquet': not an object store's URI (s3://bucket/key, gs://..., abfs://...)"
    )
    assert keys_in(bucket[0]) == {}


# --------------------------------------------------------------------------- check_writable


def test_the_output_preflight_puts_an_empty_probe_beside_the_output_and_removes_it(bucket):
    store, _, refusals = bucket
    put_object(store, "out/o.parquet", b"yesterday")
    check_writable(OUTPUT, "-o")
    assert keys_in(store) == {"out/o.parquet": b"yesterday"}  # never written over
    (put, key, options), (delete, deleted, _) = refusals.calls
    assert (put, delete) == ("put", "delete") and PROBE_KEY.fullmatch(key) and deleted == key
    assert options == {"mode": "overwrite"}


def test_an_output_that_is_a_folder_is_refused_before_any_write(bucket):
    store, _, refusals = bucket
    put_object(store, "out/o.parquet/part-0", b"x")
    with pytest.raises(UsageError) as raised:
        check_writable(OUTPUT, "--output")
    assert str(raised.value) == (
        f"--output {OUTPUT} is a folder in the store (objects lie under it); give an object's URI"
    )
    assert refusals.calls == []


def test_an_output_not_in_a_store_is_refused_naming_its_option(bucket):
    with pytest.raises(UsageError) as raised:
        check_writable("http://h/o.parquet", "--output")
    assert (
        str(raised.value)
        == "--output 'http://h/o.parquet': not an object store's URI (s3://bucket/key, gs://..., abfs://...)"
    )


def test_a_probe_the_bucket_may_not_delete_is_left_and_the_output_passes(bucket):
    """An output is never deleted, so a role that may put but not delete may write one."""
    store, _, refusals = bucket
    refusals.refuse("delete", denied)
    check_writable(OUTPUT, "-o")
    ((key, body),) = keys_in(store).items()
    assert PROBE_KEY.fullmatch(key) and body == b""


@pytest.mark.parametrize(
    ("error", "kind", "words"),
    [
        (denied, ObjectStoreError, words_of(DENIED, NAME)),
        (no_such_bucket, NoSuchBucket, words_of(NO_BUCKET, NAME)),
        (slow_down, ObjectStoreError, words_of(FAILING, NAME)),
        (odd, ObjectStoreError, OTHER),
    ],
    ids=["denied", "no-bucket", "throttled", "unknown-answer"],
)
def test_a_refused_probe_names_the_output_never_the_probe(bucket, error, kind, words):
    """Each cause's words after `OPTION URI: ` (test_bucket_errors.py's reading), the probe's
    key nowhere; a missing bucket a usage error (exit 2). Before: a throttled or unknown refusal
    of the probe ended in a TypeError (`named` rebuilt a `WriteRefused` with the wrong arguments)."""
    store, _, refusals = bucket
    refusals.refuse("put", error)
    with pytest.raises(ObjectStoreError) as raised:
        check_writable(OUTPUT, "-o")
    assert type(raised.value) is kind
    assert str(raised.value) == f"-o {OUTPUT}: {words}"
    assert raised.value.__cause__ is None
    assert keys_in(store) == {}


def test_a_bucket_pyarrow_cannot_list_is_named_by_the_probe(bucket):
    """pyarrow reads a missing bucket's 404 as a missing object; the probe's put says which."""
    _, handler, refusals = bucket
    handler.fail = FileNotFoundError("Path does not exist 'clef-memory/out/o.parquet'")
    refusals.refuse("put", no_such_bucket)
    with pytest.raises(NoSuchBucket) as raised:
        check_writable(OUTPUT, "-o")
    assert str(raised.value) == f"-o {OUTPUT}: {words_of(NO_BUCKET, NAME)}"
    assert refusals.kinds() == ["put"]


@pytest.mark.parametrize(
    ("text", "failure", "words", "detail"),
    [
        ("AWS Error ACCESS_DENIED during HeadObject operation: No response body.", DENIED, words_of(DENIED, NAME), ""),
        ("AWS Error SLOW_DOWN during HeadObject operation: Please reduce your request rate.", FAILING,
         words_of(FAILING, NAME), f"the store kept failing for {OUTPUT}: "),
        ("AWS Error UNKNOWN (HTTP status 400) during HeadObject operation: odd", "other", OTHER,
         f"cannot read {OUTPUT}: "),
    ],
    ids=["denied", "throttled", "unknown-answer"],
)  # fmt: skip
def test_a_refused_look_at_the_output_is_named_by_the_option(bucket, text, failure, words, detail):
    """pyarrow's HEAD of the output: the job's error for the credentials, the store's failing
    as one, and no probe put; what the store said kept for `-v`."""
    _, handler, refusals = bucket
    handler.fail = OSError(text)
    with pytest.raises(ObjectStoreError) as raised:
        check_writable(OUTPUT, "-o")
    assert str(raised.value) == f"-o {OUTPUT}: {words}"
    assert raised.value.failure == failure and raised.value.detail == detail + text
    assert raised.value.__cause__ is None
    assert refusals.calls == []


@pytest.mark.parametrize(
    ("given", "why"),
    [(f"{OUTPUT}?versionId=1", "not a usable object URI"), (f"{ROOT}/out/", "give an object's URI, not a folder")],
    ids=["query", "folder"],
)
def test_an_output_uri_that_names_no_object_is_refused_naming_its_option(bucket, given, why):
    with pytest.raises(UsageError) as raised:
        check_writable(given, "--output")
    assert str(raised.value).startswith(f"--output {given!r}: {why}")


# --------------------------------------------------------------------------- probe_writes


def probe(conditional=True, listed=True, strict=True) -> None:
    """The store's probe (store/remote/store.py), standing for the store's URI."""
    probe_writes(f"{ROOT}/nightly/.clef-probe-0123456789ab", f"{ROOT}/nightly/", conditional, listed, strict)


PROBE = "nightly/.clef-probe-0123456789ab"
STORE = f"{ROOT}/nightly/"


def test_the_stores_probe_asks_each_write_a_job_makes_and_leaves_nothing(bucket):
    store, _, refusals = bucket
    probe()
    assert [(kind, key) for kind, key, _ in refusals.calls] == [
        ("put", PROBE), ("put", PROBE), ("list", PROBE), ("delete", PROBE),
    ]  # fmt: skip
    assert [options.get("mode") for _, _, options in refusals.calls[:2]] == ["create", "create"]
    assert keys_in(store) == {}


def test_the_simple_probe_is_one_put_and_a_delete(bucket):
    store, _, refusals = bucket
    probe(conditional=False, listed=False, strict=False)
    assert [(kind, key, options.get("mode")) for kind, key, options in refusals.calls] == [
        ("put", PROBE, "overwrite"), ("delete", PROBE, None),
    ]  # fmt: skip
    assert keys_in(store) == {}


def ignoring_the_condition(monkeypatch):
    """A bucket (an old MinIO, some gateways) that writes over what `If-None-Match: *` spares."""
    real = obstore.put

    def put(store, key, body, mode="overwrite", **options):
        return real(store, key, body, **options)

    monkeypatch.setattr(obstore, "put", put)


@pytest.mark.parametrize("delete_refused", [False, True], ids=["deleted", "delete-refused"])
def test_a_bucket_that_ignores_the_condition_is_refused_for_the_store(bucket, monkeypatch, delete_refused):
    store, _, refusals = bucket
    if delete_refused:
        refusals.refuse("delete", denied)
    ignoring_the_condition(monkeypatch)
    with pytest.raises(ConditionIgnored) as raised:
        probe()
    assert str(raised.value) == (
        "the bucket ignores conditional writes (If-None-Match: *), on which the store's commits rely"
    )
    assert keys_in(store) == ({PROBE: b""} if delete_refused else {})  # an empty probe, whichever put wrote it


@pytest.mark.parametrize(
    ("refused", "conditional", "step"),
    [
        ("put", True, "a conditional write"),
        ("put", False, "a write"),
        ("list", True, "a listing"),
        ("delete", True, "a delete"),
    ],
    ids=["conditional-put", "put", "listing", "delete"],
)
def test_a_refused_step_is_named_with_the_stores_uri(bucket, refused, conditional, step):
    """The step the role lacks, the cause in a few words, and the URI the probe stands for."""
    store, _, refusals = bucket
    refusals.refuse(refused, denied)
    with pytest.raises(WriteRefused) as raised:
        probe(conditional=conditional)
    assert raised.value.step == step and raised.value.cause == "access denied"
    assert str(raised.value) == f"{STORE}: {words_of(DENIED, NAME)}"
    assert (raised.value.failure, raised.value.words) == (DENIED, words_of(DENIED, NAME))
    assert "<Code>AccessDenied</Code>" in raised.value.detail
    assert list(keys_in(store)) == ([PROBE] if refused == "delete" else [])


def test_a_refused_second_conditional_put_is_that_steps_refusal_and_the_probe_is_removed(bucket):
    store, _, refusals = bucket
    puts = []
    refusals.refuse("put", denied, when=lambda key: puts.append(key) or len(puts) > 1)
    with pytest.raises(WriteRefused) as raised:
        probe()
    assert raised.value.step == "a conditional write"
    assert keys_in(store) == {} and refusals.kinds() == ["put", "put", "delete"]


def test_the_first_refusal_is_the_one_told(bucket):
    """A listing refused, then the delete too: the listing's refusal, the probe left."""
    store, _, refusals = bucket
    refusals.refuse("list", denied)
    refusals.refuse("delete", odd)
    with pytest.raises(WriteRefused) as raised:
        probe()
    assert raised.value.step == "a listing"
    assert list(keys_in(store)) == [PROBE]


def test_a_delete_refused_passes_unless_strict(bucket):
    store, _, refusals = bucket
    refusals.refuse("delete", denied)
    probe(strict=False)
    assert keys_in(store) == {PROBE: b""}


def test_a_missing_bucket_is_no_refused_step(bucket):
    """A usage error naming the URI given (its bucket is wrong), not a role's missing right."""
    _, _, refusals = bucket
    refusals.refuse("put", no_such_bucket)
    with pytest.raises(NoSuchBucket) as raised:
        probe()
    assert not isinstance(raised.value, WriteRefused)
    assert str(raised.value) == f"{STORE}: {words_of(NO_BUCKET, NAME)}"


def test_a_throttled_step_is_refused_with_the_stores_failing(bucket):
    _, _, refusals = bucket
    refusals.refuse("list", slow_down)
    with pytest.raises(WriteRefused) as raised:
        probe()
    assert raised.value.step == "a listing" and raised.value.failure == FAILING
    assert raised.value.cause == str(raised.value)
    assert str(raised.value).startswith(f"the store kept failing for {STORE}: ")


# --------------------------------------------------------------------------- WriteRefused


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("the server said: access denied for this key", "access denied"),
        ("ACCESS DENIED", "access denied"),
        ("<Code>AccessDenied</Code>", "access denied"),
        ("status 403 Forbidden", "access denied"),
        ("status 4031 odd", "status 4031 odd"),
        ("no such upload", "no such upload"),
    ],
    ids=["words", "capitals", "code", "status", "longer-number", "other"],
)
def test_a_refusals_cause_is_access_denied_or_its_text(text, cause):
    assert WriteRefused("a write", LocationProblem(text)).cause == cause


def test_a_refusal_keeps_the_sorted_failure():
    """An `ObjectStoreError` keeps its text, the server's answer, its cause and words; any other
    failure keeps its text, sorted as failing (transient) or other, its text the detail."""
    error = ObjectStoreError("s3://b/k: access denied", detail="<Code>AccessDenied</Code>", failure=DENIED, words="w")
    refused = WriteRefused("a delete", error)
    assert (str(refused), refused.detail, refused.failure, refused.words, refused.step) == (
        "s3://b/k: access denied", "<Code>AccessDenied</Code>", DENIED, "w", "a delete",
    )  # fmt: skip
    transient = WriteRefused("a write", LocationProblem("the store kept failing for s3://b/k: 503", transient=True))
    assert (str(transient), transient.failure, transient.detail, transient.step) == (
        "the store kept failing for s3://b/k: 503", FAILING, "the store kept failing for s3://b/k: 503", "a write",
    )  # fmt: skip
    other = WriteRefused("a listing", LocationProblem("cannot read s3://b/k: odd"))
    assert (other.failure, other.detail, other.words) == ("other", "cannot read s3://b/k: odd", str(other))


def read_from(store) -> None:
    """A record's media read from the bucket first: access denied there would be that object's."""
    put_object(store, "in/a.png", b"png")
    object_store.read_object(f"{ROOT}/in/a.png", 100, io.BytesIO())


def test_a_refused_upload_after_a_read_from_the_bucket_is_still_access_denied(bucket, tmp_path):
    """An output's put is the job's, however many objects of the bucket were read before."""
    store, _, refusals = bucket
    read_from(store)
    refusals.refuse("put", denied)
    with pytest.raises(ObjectStoreError) as raised:
        upload_whole(local_file(tmp_path, b"rows"), OUTPUT)
    assert str(raised.value) == f"-o {OUTPUT}: {words_of(DENIED, NAME)}{NOT_UPLOADED}"


@pytest.mark.parametrize("where", ["head", "probe"], ids=["head", "probe"])
def test_a_refused_preflight_after_a_read_from_the_bucket_is_still_access_denied(bucket, where):
    store, handler, refusals = bucket
    read_from(store)
    if where == "head":
        handler.fail = OSError("AWS Error ACCESS_DENIED during HeadObject operation: No response body.")
    else:
        refusals.refuse("put", denied)
    with pytest.raises(ObjectStoreError) as raised:
        check_writable(OUTPUT, "-o")
    assert str(raised.value) == f"-o {OUTPUT}: {words_of(DENIED, NAME)}"


def test_the_output_is_put_by_the_patient_client_and_probed_by_the_quick_one(monkeypatch, tmp_path):
    """The preflight is a job's first request (ATTEMPTS tries, then the job ends); the upload at
    its end retries for longer, through the client without the read timeout."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "clef-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "clef-test-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never reached: every put is refused here
    monkeypatch.setattr(object_store, "RETRY_DELAYS", ())
    buckets.forget()
    refusals = Refusals(monkeypatch)
    refusals.refuse("put", denied)
    try:
        with pytest.raises(ObjectStoreError):
            upload_whole(local_file(tmp_path, b"rows"), "s3://clef-env/out/o.parquet")
        with pytest.raises(WriteRefused):
            probe_writes("s3://clef-env/out/.o.parquet.clef-probe-0", "s3://clef-env/out/o.parquet")
    finally:
        buckets.forget()
        object_store.forget()
    upload, probed = refusals.stores
    assert upload.retry_config["max_retries"] == 10 and "read_timeout" not in upload.client_options
    assert probed.retry_config["max_retries"] == 2 and probed.client_options["read_timeout"] == "3s"
