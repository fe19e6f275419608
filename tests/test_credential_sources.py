"""Whether a job has credentials of its own (`failures._no_credentials`): the environment's keys,
a profile's keys in the shared files, a web identity or a container's credentials. What it says
decides the words of a refused request ("no credentials" or "access denied"), so each source is
checked against a direct reading of the case (issue 56.11: mutation survivors of failures.py)."""

from __future__ import annotations

import pytest

from clef_cli.locations import failures
from clef_cli.locations.failures import ObjectStoreError, failure_of, named

SOURCES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


@pytest.fixture
def bare(monkeypatch, tmp_path):
    """No credential anywhere: no variable, and HOME without an ~/.aws folder."""
    for name in SOURCES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_nothing_anywhere_is_no_credentials(bare):
    assert failures._no_credentials() is True


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s"}, False),
        ({"AWS_ACCESS_KEY_ID": "AKIA1"}, True),  # a key id without its secret signs nothing
        ({"AWS_SECRET_ACCESS_KEY": "s"}, True),
        ({"AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/token"}, False),
        ({"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/credentials"}, False),
        ({"AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://127.0.0.1/creds"}, False),
    ],
    ids=["both-keys", "key-id-alone", "secret-alone", "web-identity", "container-relative", "container-full"],
)
def test_the_environments_sources(bare, monkeypatch, variables, expected):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert failures._no_credentials() is expected


def write(path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("file", "text", "profile", "expected"),
    [
        ("credentials", "[default]\naws_access_key_id = AKIA2\n", None, False),
        ("config", "[default]\naws_access_key_id = AKIA2\n", None, False),
        ("credentials", "[dev]\naws_access_key_id = AKIA2\n", "dev", False),
        ("config", "[profile dev]\naws_access_key_id = AKIA2\n", "dev", False),
        ("credentials", "[dev]\naws_access_key_id = AKIA2\n", None, True),  # another profile's key
        ("credentials", "[default]\naws_access_key_id = AKIA2\n", "dev", True),
        ("credentials", "[default]\nregion = eu-west-1\n", None, True),  # a section without a key
        ("credentials", "not an ini file [[\n", None, True),
    ],
    ids=["default", "config-default", "named", "config-profile", "other-profile", "default-for-named", "no-key", "bad"],
)
def test_a_profiles_keys_in_the_shared_files(bare, monkeypatch, file, text, profile, expected):
    home = bare / "home" / ".aws"
    write(home / file, text)
    if profile:
        monkeypatch.setenv("AWS_PROFILE", profile)
    assert failures._no_credentials() is expected


def test_the_files_named_by_the_environment_and_the_default_profile_variable(bare, monkeypatch):
    creds = write(bare / "elsewhere" / "creds", "[ops]\naws_access_key_id = K\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", creds)
    assert failures._no_credentials() is True  # the default profile has no key there
    monkeypatch.setenv("AWS_DEFAULT_PROFILE", "ops")
    assert failures._no_credentials() is False
    monkeypatch.delenv("AWS_SHARED_CREDENTIALS_FILE")
    assert failures._no_credentials() is True  # ~/.aws/credentials has none
    config = write(bare / "elsewhere" / "config", "[profile ops]\naws_access_key_id = K\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", config)
    assert failures._no_credentials() is False


def test_the_first_file_with_the_section_gives_the_value(bare):
    one = write(bare / "one.ini", "[dev]\nregion = x\n")
    two = write(bare / "two.ini", "[dev]\naws_access_key_id =  AKIA3 \n")
    assert failures._profile_value((str(bare / "missing.ini"), one, two), ("dev",), "aws_access_key_id") == "AKIA3"
    assert failures._profile_value((one,), ("dev",), "region") == "x"
    assert failures._profile_value((one, two), ("nope", "dev"), "region") == "x"
    assert failures._profile_value((one, two), ("nope",), "region") is None


def test_named_says_the_option_and_the_uri_given_and_keeps_the_cause():
    inner = failure_of(failures.DENIED, "", "s3://bucket/store/manifests/0000000001.json", "the server's reply")
    shown = named(inner, "--checkpoint", "s3://bucket/store/")
    assert isinstance(shown, ObjectStoreError)
    assert str(shown) == f"--checkpoint s3://bucket/store/: {inner.words}"
    assert (shown.failure, shown.detail, shown.words) == (failures.DENIED, "the server's reply", inner.words)
    other = ObjectStoreError("something else", failure="other", words="it broke")
    again = named(other, "-o", "s3://bucket/out.parquet")
    assert str(again) == "-o s3://bucket/out.parquet: it broke" and again.failure == "other"


def test_a_file_that_cannot_be_parsed_is_passed_over_for_the_next(bare):
    """A shared file with no section header or in another encoding is skipped, never the end."""
    broken = write(bare / "broken.ini", "aws_access_key_id = no section above\n")
    latin = bare / "latin.ini"
    latin.write_bytes("[dev]\nregion = caf\xe9\n".encode("latin-1"))
    two = write(bare / "two.ini", "[dev]\naws_access_key_id = AKIA4\n")
    assert failures._profile_value((broken, str(latin), two), ("dev",), "aws_access_key_id") == "AKIA4"


def test_temporary_credentials_reach_the_bucket_client_as_its_session_token(bare, monkeypatch):
    from clef_cli.locations.buckets import _make_store

    for name, value in {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_SESSION_TOKEN": "TOK"}.items():
        monkeypatch.setenv(name, value)
    config = _make_store("s3://clef-b", quick=False).config
    assert (config["access_key_id"], config["session_token"]) == ("AK", "TOK") and "token" not in config
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    assert "session_token" not in _make_store("s3://clef-b", quick=False).config
