"""locations/failures.py's `named`: an error met on a URI clef made (a manifest, a probe) renamed
by the option and the URI the user gave, its cause, words and server's answer kept, so a caller
(upload_whole's rerun hint, the store's probe) can rename it again."""

from __future__ import annotations

from clef_cli.locations.failures import (
    DENIED,
    FAILING,
    NO_BUCKET,
    NO_CREDENTIALS,
    SILENT,
    UNREACHABLE,
    NoSuchBucket,
    ObjectStoreError,
    named,
    words_of,
)
from clef_cli.locations.uploads import ConditionIgnored

GIVEN = "s3://night/out/o.parquet"
OTHER = "the object store refused the request (run `clef -v ...` for its answer)"


def test_an_error_of_its_own_words_keeps_them_and_its_kind():
    """No cause and no server's answer (the store's probe's `ConditionIgnored`): its own words."""
    error = ConditionIgnored("the bucket ignores conditional writes")
    found = named(error, "--checkpoint", GIVEN)
    assert type(found) is ConditionIgnored
    assert str(found) == f"--checkpoint {GIVEN}: the bucket ignores conditional writes"
    assert (found.failure, found.words, found.detail) == ("other", "the bucket ignores conditional writes", "")


def test_a_cause_without_an_answer_is_the_causes_words():
    error = ObjectStoreError("s3://night/m/1.json: access denied", failure=DENIED, words="access denied")
    found = named(error, "-o", GIVEN)
    assert str(found) == f"-o {GIVEN}: {words_of(DENIED, 'night')}"
    assert (found.failure, found.words, found.detail) == (DENIED, words_of(DENIED, "night"), "")


def test_an_unsorted_refusal_with_the_servers_answer_says_to_look_at_it():
    error = ObjectStoreError("s3://night/probe: odd", detail="<Code>Odd</Code>", failure="other", words="odd")
    found = named(error, "-o", GIVEN)
    assert str(found) == f"-o {GIVEN}: {OTHER}"
    assert (found.failure, found.words, found.detail) == ("other", OTHER, "<Code>Odd</Code>")


def test_a_missing_bucket_stays_a_usage_error():
    error = ObjectStoreError("x", detail="<Code>NoSuchBucket</Code>", failure=NO_BUCKET)
    found = named(error, "input", "s3://gone/in.jsonl")
    assert isinstance(found, NoSuchBucket)
    assert str(found) == f"input s3://gone/in.jsonl: {words_of(NO_BUCKET, 'gone')}"


def test_each_causes_words_are_the_documented_ones(monkeypatch):
    """The words every option's message ends with (docs/scoring.md, "Data in object stores")."""
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    assert [words_of(failure, "night") for failure in (NO_BUCKET, DENIED, NO_CREDENTIALS, UNREACHABLE, SILENT)] == [
        "the bucket night does not exist (check the URI's bucket name)",
        "access denied (check the job's credentials and what they may do in the bucket)",
        "no credentials (none in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or an AWS_PROFILE, and no instance or pod "
        "role the store accepts)",
        "cannot connect to the store's endpoint (check AWS_ENDPOINT_URL and the host)",
        "the store's endpoint did not answer in 10 s (check AWS_ENDPOINT_URL and the network)",
    ]
    assert words_of(FAILING, "night") == "the object store kept failing (throttling or server errors): rerun later"
    assert words_of("other", "night") == OTHER


def test_the_endpoint_named_is_the_s3_one_first_without_its_slash(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://any.local:9000/")
    assert (
        words_of(UNREACHABLE, "b")
        == "cannot connect to the endpoint http://any.local:9000 (check AWS_ENDPOINT_URL and the host)"
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3.local/")
    assert words_of(SILENT, "b").startswith("the endpoint http://s3.local did not answer in 10 s")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://proxy.local/X/")
    assert words_of(SILENT, "b").startswith("the endpoint http://proxy.local/X did not answer")


def test_a_job_error_keeps_its_cause_and_masks_what_it_shows():
    """A credential in a URI never shows (uris.masked), in the message nor the server's answer."""
    error = ObjectStoreError("s3://AKEY:secret@night/k: odd", detail="s3://AKEY:secret@night/k said no", failure=DENIED)
    assert "secret" not in str(error) and "secret" not in error.detail
    assert (error.failure, error.words) == (DENIED, str(error))
    assert (ObjectStoreError("m").failure, ObjectStoreError("m").detail, ObjectStoreError("m", words="w").words) == (
        "other", "", "w",
    )  # fmt: skip
