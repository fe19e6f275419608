"""One reading of an object store's failures, whichever client met them (pyarrow's S3 filesystem
for reads, obstore for writes and the store in a bucket) and whichever option named the bucket
(an input, a record's media, `-o`, `--checkpoint`, `checkpoint info|prune`'s store): the same
cause gives the same exit code and the same words, and the message names the option and the URI
given, never an object clef made (a manifest, a probe). The server's answer is kept as the
error's `detail`, shown only under `clef -v` (cli/errors.py).

The causes and their exit codes (docs/scoring.md, "Data in object stores"): what the command line
must change is a usage error, exit 2 (a bucket that does not exist: its name is the URI's); what
the machine's environment or the store must change is exit 1 (access denied or refused
credentials, no credentials at all, an endpoint that refuses or is unknown, one that never
answers), since that can also happen after the job has done work.
"""

from __future__ import annotations

import configparser
import os
import re

from clef_cli.errors import ClefError, UsageError
from clef_cli.locations.uris import LocationProblem, masked

NO_BUCKET, DENIED, NO_CREDENTIALS, UNREACHABLE, SILENT, FAILING = (
    "no-bucket", "denied", "no-credentials", "unreachable", "silent", "failing",
)  # fmt: skip
GIVE_UP_SECONDS = 10.0
"""About how long one request to an endpoint that never answers is tried (every client: pyarrow's
through `object_store.ATTEMPTS` × `REQUEST_SECONDS`, obstore's through its retry timeout) before
the job ends; the message quotes it (`object_store.GIVE_UP_SECONDS`)."""
DETAIL_CHARS = 2000
"""The most of the server's answer `-v` shows."""


class ObjectStoreError(ClefError):
    """The store refuses the job, not a record (credentials, the endpoint): exit 1. `failure`:
    one of the module's causes (or "other"); `words`: the message after the named URI; `detail`:
    the client's whole failure (the server's answer), for `clef -v`."""

    def __init__(self, message: str, detail: str = "", failure: str = "other", words: str = "") -> None:
        super().__init__(masked(message))
        self.detail = masked(detail)
        self.failure = failure
        self.words = words or str(self)


class NoSuchBucket(ObjectStoreError, UsageError):
    """The bucket does not exist: the URI given must change, so a usage error (exit 2) wherever
    it is met (the bucket is asked before the job does anything: inputs, output, store, media keying)."""


class MissingObject(LocationProblem):
    """The object is not there (404): a record's error, for a listing an empty folder, for the
    remote store a fact to act on."""


def _endpoint() -> str:
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return f"the endpoint {endpoint.rstrip('/')}" if endpoint else "the store's endpoint"


def words_of(failure: str, bucket: str) -> str:
    """What a cause reads, after `OPTION URI: `: the same for every option and client."""
    return {
        NO_BUCKET: f"the bucket {bucket} does not exist (check the URI's bucket name)",
        DENIED: "access denied (check the job's credentials and what they may do in the bucket)",
        NO_CREDENTIALS: (
            "no credentials (none in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or an AWS_PROFILE, and no instance or "
            "pod role the store accepts)"
        ),
        UNREACHABLE: f"cannot connect to {_endpoint()} (check AWS_ENDPOINT_URL and the host)",
        SILENT: f"{_endpoint()} did not answer in {GIVE_UP_SECONDS:g} s (check AWS_ENDPOINT_URL and the network)",
        FAILING: "the object store kept failing (throttling or server errors): rerun later",
    }.get(failure, "the object store refused the request (run `clef -v ...` for its answer)")


def failure_of(failure: str, what: str, given: str, detail: str = "") -> ObjectStoreError:
    """The job's error for `failure` met on `given` (a URI), named by `what` (an option)."""
    from clef_cli.locations.uris import bucket_root

    try:
        bucket = bucket_root(given).partition("://")[2]
    except (ValueError, LocationProblem):
        bucket = given
    words = words_of(failure, bucket)
    kind = NoSuchBucket if failure == NO_BUCKET else ObjectStoreError
    return kind(f"{what} {given}: {words}".strip(), detail=detail, failure=failure, words=words)


def named(error: ObjectStoreError, what: str, given: str) -> ObjectStoreError:
    """`error` as the option `what` and the URI `given` name it (the store's URI, not its
    manifest's; the output's, not its probe's)."""
    if error.failure == "other" and not error.detail:
        return type(error)(f"{what} {given}: {error.words}", failure="other", words=error.words)
    return failure_of(error.failure, what, given, error.detail)


_TRANSIENT = ("SLOW_DOWN", "THROTTL", "SERVICE_UNAVAILABLE", "INTERNAL_FAILURE", "REQUEST_TIMEOUT")
_TRANSIENT += ("SlowDown", "Throttl", "ServiceUnavailable", "InternalError", "RequestTimeout")
_TRANSIENT_STATUS = re.compile(r"HTTP (status|response code):? (5\d\d|429)|status code: (5\d\d|429)", re.I)
_TIMED_OUT = re.compile(r"curlCode: 28|\btimed out\b|Timeout was reached|\bTimedOut\b|kind: Timeout\b", re.I)
"""pyarrow's (curl's) and obstore's (reqwest's) timeouts; not obstore's `retry_timeout:` setting."""
_CREDENTIALS = ("INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "EXPIRED_TOKEN", "MISSING_AUTHENTICATION")
_CREDENTIALS += ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "MissingAuthentication")
_CREDENTIALS += ("InvalidToken", "INVALID_TOKEN")
_DENIED = re.compile(r"ACCESS_DENIED|AccessDenied|\b403\b|Forbidden|lacked the necessary privileges")
_UNREACHABLE = ("curlCode: 6,", "curlCode: 7,", "Could not connect", "Could not resolve")
_UNREACHABLE += ("error sending request", "dns error", "Connection refused")
_NO_BUCKET = ("NO_SUCH_BUCKET", "NoSuchBucket")
_METADATA = re.compile(r"/latest/(api/token|meta-data)|169\.254\.169\.254|169\.254\.170\.2|fd00:ec2::254")
"""An instance's or a container's credential endpoint: met only where no other credentials were."""


def _profile_value(files: tuple[str, ...], sections: tuple[str, ...], name: str) -> str | None:
    """`name` from the first of `sections` that has it in the first of `files` that has it."""
    for file in files:
        parser = configparser.RawConfigParser()
        try:
            parser.read(os.path.expanduser(file), encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError):
            continue
        for section in sections:
            if parser.has_option(section, name):
                return parser.get(section, name).strip()
    return None


def _no_credentials() -> bool:
    """No key in the environment or the profile's files (as `buckets.aws_config` reads them) and
    no web identity or container credentials: the job can have only an instance's role, or none."""
    env = os.environ
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return False
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    named_sections = (profile, f"profile {profile}") if profile != "default" else ("default",)
    files = (
        env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials",
        env.get("AWS_CONFIG_FILE") or "~/.aws/config",
    )
    if any(_profile_value((file,), named_sections, "aws_access_key_id") for file in files):
        return False
    others = ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
    others += ("AWS_CONTAINER_CREDENTIALS_FULL_URI",)
    return not any(env.get(name) for name in others)


def whole_text(error: BaseException) -> str:
    return " ".join(str(error).split("Debug source:", 1)[0].split())


def classify(error: BaseException, uri: str, answered: bool, readable: bool, listing: bool) -> BaseException:
    """What a store's failure for `uri` becomes (object_store's note): the job's
    `ObjectStoreError` (one of the causes), a transient `LocationProblem` (retry later), a
    `MissingObject`, or a record's `LocationProblem`. `answered`: the store has answered this
    process (a timeout is then the moment's); `readable`: an object of the bucket was read
    (access denied is then that object's); `listing`: a folder's listing (denied there is the job's)."""
    whole = " ".join(str(error).split())
    detail = whole_text(error)[:DETAIL_CHARS]
    s3 = uri.partition("://")[0] in ("s3", "s3a")

    def job(failure: str) -> ObjectStoreError:
        return failure_of(failure, "", uri, detail)

    if any(mark in whole for mark in _NO_BUCKET):
        return job(NO_BUCKET)
    if isinstance(error, FileNotFoundError):
        return MissingObject(f"object not found: {uri}")
    credentials = any(mark in whole for mark in _CREDENTIALS)
    denied = credentials or bool(_DENIED.search(whole))
    if s3 and (_METADATA.search(whole) or denied) and _no_credentials():
        return job(NO_CREDENTIALS)
    if credentials:
        return job(DENIED)
    timed_out = bool(_TIMED_OUT.search(whole))
    if timed_out and not answered:
        return job(SILENT)
    if any(mark in whole for mark in _UNREACHABLE) and not answered:
        return job(UNREACHABLE)
    if any(mark in whole for mark in _TRANSIENT) or _TRANSIENT_STATUS.search(whole) or timed_out:
        return LocationProblem(f"the store kept failing for {uri}: {detail[:200]}", transient=True)
    if any(mark in whole for mark in _UNREACHABLE):
        return job(UNREACHABLE)
    if denied:
        if listing or not readable:  # the folder or the bucket: every record in it would fail alike
            return job(DENIED)
        return LocationProblem(f"access denied: {uri}")
    return LocationProblem(f"cannot read {uri}: {detail[:200]}")
