"""locations/failures.py's `classify`, case by case: each word a client's failure may carry
(pyarrow's AWS error codes, obstore's S3 answers, curl's and reqwest's timeouts) sorted into the
job's error (its cause), a transient problem (retried, then the next run's), a missing object or
the record's own problem, by what this process met of the store (answered, read) and whether
the job has credentials. Each case against its reading in the module's note."""

from __future__ import annotations

import pytest

from clef_cli.locations.failures import (
    DENIED,
    NO_BUCKET,
    NO_CREDENTIALS,
    SILENT,
    UNREACHABLE,
    MissingObject,
    NoSuchBucket,
    ObjectStoreError,
    classify,
    words_of,
)
from clef_cli.locations.uris import LocationProblem

URI = "s3://night/in/a.png"


@pytest.fixture
def keys(monkeypatch, tmp_path):
    """The job has keys in its environment."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s-env")


@pytest.fixture
def no_keys(monkeypatch, tmp_path):
    """No key anywhere, no web identity, no container: only an instance's role could serve."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))


def job(error, failure: str, uri: str = URI):
    assert type(error) is (NoSuchBucket if failure == NO_BUCKET else ObjectStoreError), error
    assert error.failure == failure and str(error) == f"{uri}: {words_of(failure, uri.split('/')[2])}"
    return error


def sort(text: str, answered=True, readable=True, listing=False, uri=URI, kind=OSError):
    return classify(kind(text), uri, answered, readable, listing)


@pytest.mark.parametrize("mark", ["NO_SUCH_BUCKET", "NoSuchBucket"], ids=["pyarrow", "obstore"])
def test_a_missing_bucket_is_the_jobs_usage_error_whatever_else_is_said(keys, mark):
    found = job(
        sort(f"AWS Error {mark} during HeadObject: 404 timed out AccessDenied", kind=FileNotFoundError), NO_BUCKET
    )
    assert found.detail == f"AWS Error {mark} during HeadObject: 404 timed out AccessDenied"


def test_a_missing_object_is_missing(keys):
    found = sort("Path does not exist 'night/in/a.png'", kind=FileNotFoundError)
    assert type(found) is MissingObject and str(found) == f"object not found: {URI}"


CREDENTIALS = [
    "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "EXPIRED_TOKEN", "MISSING_AUTHENTICATION",
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "MissingAuthentication",
    "InvalidToken", "INVALID_TOKEN",
]  # fmt: skip


@pytest.mark.parametrize("mark", CREDENTIALS, ids=CREDENTIALS)
def test_refused_credentials_are_access_denied_even_after_a_read(keys, mark):
    """The job's keys refused: every request fails alike, whatever was read before."""
    job(sort(f"error code {mark} from the server", answered=True, readable=True), DENIED)


@pytest.mark.parametrize("mark", CREDENTIALS[:2], ids=CREDENTIALS[:2])
def test_refused_credentials_without_keys_are_no_credentials(no_keys, mark):
    job(sort(f"error code {mark}"), NO_CREDENTIALS)


DENIALS = [
    "AWS Error ACCESS_DENIED during GetObject",
    "<Code>AccessDenied</Code>",
    "HTTP status 403 during GetObject",
    "403 Forbidden",
    "The operation lacked the necessary privileges to complete for path in/a.png",
]


@pytest.mark.parametrize("text", DENIALS, ids=["pyarrow", "obstore-code", "status", "forbidden", "privileges"])
def test_access_denied_is_the_jobs_before_a_read_or_in_a_listing_else_the_objects(keys, text):
    job(sort(text, readable=False), DENIED)
    job(sort(text, readable=True, listing=True), DENIED)
    found = sort(text, readable=True, listing=False)
    assert type(found) is LocationProblem and str(found) == f"access denied: {URI}" and not found.transient


@pytest.mark.parametrize("text", DENIALS[:2], ids=["pyarrow", "obstore-code"])
def test_access_denied_without_keys_is_no_credentials_in_s3_only(no_keys, text):
    job(sort(text), NO_CREDENTIALS)
    job(sort(text, uri="s3a://night/in/a.png"), NO_CREDENTIALS, "s3a://night/in/a.png")
    job(sort(text, readable=False, uri="gs://night/in/a.png"), DENIED, "gs://night/in/a.png")


def test_a_number_with_403_in_it_is_no_denial(keys):
    found = sort("request 14031 failed oddly")
    assert type(found) is LocationProblem and str(found).startswith("cannot read ")


@pytest.mark.parametrize(
    "text",
    [
        "error sending request for url (http://169.254.169.254/latest/api/token)",
        "GET http://169.254.170.2/v2/credentials failed",
        "http://[fd00:ec2::254]/latest/meta-data/iam failed",
        "failed to fetch /latest/meta-data/iam/security-credentials",
    ],
    ids=["imds", "container", "imds-v6", "path"],
)
def test_the_instances_credential_endpoint_met_without_keys_is_no_credentials(no_keys, text):
    job(sort(text, answered=False), NO_CREDENTIALS)


def test_the_instances_endpoint_with_keys_is_the_endpoint_unreachable(keys):
    job(sort("error sending request for url (http://169.254.169.254/latest/api/token)", answered=False), UNREACHABLE)


TIMEOUTS = [
    "curlCode: 28, Timeout was reached",
    "operation timed out",
    "Timeout was reached",
    "error kind TimedOut",
    "reqwest::Error { kind: Timeout }",
]


@pytest.mark.parametrize("text", TIMEOUTS, ids=["curl", "timed-out", "reached", "timedout", "reqwest"])
def test_a_timeout_is_the_endpoints_before_it_answered_and_the_moments_after(keys, text):
    job(sort(text, answered=False), SILENT)
    found = sort(text, answered=True)
    assert type(found) is LocationProblem and found.transient


def test_a_retry_timeout_setting_is_no_timeout(keys):
    """obstore prints its `retry_timeout:` setting in every error it gives up on."""
    found = sort("Generic S3 error: weird, retry_timeout: 10s", answered=False)
    assert type(found) is LocationProblem and not found.transient


UNREACHABLE_TEXTS = [
    "curlCode: 6, Couldn't resolve host name",
    "curlCode: 7, Couldn't connect to server",
    "Could not connect to the endpoint",
    "Could not resolve the host",
    "error sending request for url (http://127.0.0.1:9/b)",
    "dns error: failed to lookup",
    "Connection refused (os error 111)",
]


@pytest.mark.parametrize(
    "text", UNREACHABLE_TEXTS, ids=["curl-6", "curl-7", "connect", "resolve", "sending", "dns", "refused"]
)
def test_an_endpoint_that_cannot_be_reached_is_the_jobs_answered_or_not(keys, text):
    job(sort(text, answered=False), UNREACHABLE)


def test_an_endpoint_that_answered_and_then_fails_to_connect_is_still_unreachable(keys):
    job(sort("Connection refused (os error 111)", answered=True), UNREACHABLE)


def test_curl_codes_past_seven_are_no_connection_failure(keys):
    found = sort("curlCode: 60, SSL peer certificate", answered=False)
    assert type(found) is LocationProblem and str(found).startswith("cannot read ")


TRANSIENT = [
    "AWS Error SLOW_DOWN during GetObject",
    "AWS Error THROTTLING during GetObject",
    "AWS Error SERVICE_UNAVAILABLE during GetObject",
    "AWS Error INTERNAL_FAILURE during GetObject",
    "AWS Error REQUEST_TIMEOUT during GetObject",
    "<Code>SlowDown</Code>",
    "<Code>Throttling</Code>",
    "<Code>ServiceUnavailable</Code>",
    "<Code>InternalError</Code>",
    "<Code>RequestTimeout</Code>",
    "HTTP status 503 during GetObject",
    "HTTP response code: 500",
    "http status: 429",
    "Server returned non-2xx status code: 502 Bad Gateway",
]
TRANSIENT_IDS = ["slow", "throttl", "unavailable", "internal", "request-timeout", "SlowDown", "Throttl",
                 "Unavailable", "InternalError", "RequestTimeout", "status-503", "response-code-500", "status-429",
                 "status-code-502"]  # fmt: skip


@pytest.mark.parametrize("text", TRANSIENT, ids=TRANSIENT_IDS)
def test_throttling_and_server_errors_are_transient(keys, text):
    found = sort(text, answered=False)
    assert type(found) is LocationProblem and found.transient
    assert str(found) == f"the store kept failing for {URI}: {text}"


def test_a_client_error_status_is_not_transient(keys):
    found = sort("HTTP status 404 during GetObject")
    assert type(found) is LocationProblem and not found.transient


def test_what_no_rule_knows_is_the_records_problem_cut_short(keys):
    text = "odd " * 100 + "\nDebug source:\n  Tree { NoSuchBucketDeep }"
    found = sort(text)
    assert type(found) is NoSuchBucket  # a mark anywhere in the whole failure counts
    found = sort("odd " * 100 + "\nDebug source:\n  Tree { nothing }")
    assert type(found) is LocationProblem and not found.transient
    assert str(found) == f"cannot read {URI}: {('odd ' * 100).strip()[:200]}"


def test_the_servers_answer_is_kept_up_to_two_thousand_characters(keys):
    text = "AccessDenied " + "x" * 3000 + "\nDebug source: tree"
    found = sort(text, readable=False)
    assert found.detail == ("AccessDenied " + "x" * 3000)[:2000]


def test_an_unreachable_endpoint_that_answered_and_now_throttles_is_the_moments(keys):
    """A retry's text carries the connection error and the server's 503: once the store has
    answered this process, the throttling is what counts (retried, then transient)."""
    found = sort("Generic S3 error: error sending request after 10 retries: <Code>SlowDown</Code>", answered=True)
    assert type(found) is LocationProblem and found.transient


def test_a_transient_failures_text_is_cut_to_200_characters(keys):
    text = "SlowDown " + "y" * 400
    found = sort(text)
    assert str(found) == f"the store kept failing for {URI}: {text[:200]}"


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("refused\nDebug source:\n  Tree { AccessDenied }", "refused"),
        ("AccessDenied a Debug source: b Debug source: c", "AccessDenied a"),
        ("AccessDenied, debug source: and DEBUG SOURCE: kept", "AccessDenied, debug source: and DEBUG SOURCE: kept"),
    ],
    ids=["tree", "two-trees", "other-case"],
)
def test_the_servers_answer_stops_at_obstores_debug_tree(keys, text, detail):
    """obstore appends its error's whole tree after `Debug source:`; the answer shown is before it
    (a mark inside the tree still sorts the failure)."""
    assert sort(text, readable=False).detail == detail
