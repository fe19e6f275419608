"""A location string's one check and one normal form (locations/uris.py), function by function:
the cases the fence and CLI tests do not reach (user info outside the credential schemes, keys
holding `://`, folders given where an object is meant, the messages' naming of a location)."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.errors import UsageError
from clef_cli.locations.uris import (
    CREDENTIALS,
    LocationProblem,
    bucket_root,
    is_object_uri,
    is_under,
    joined,
    local_path,
    location_problem,
    masked,
    normalized,
    object_uri,
    opened,
    option_location,
    shown,
)

runner = CliRunner()


def test_outside_the_credential_schemes_only_a_password_is_a_credential():
    """abfs's user info names the container and hdfs's the user: allowed and shown; a password
    after them is refused and masked, up to the last `@` whatever colons it holds."""
    assert location_problem("abfs://container@account.dfs.core.windows.net/media/a.png") is None
    assert location_problem("hdfs://alice@namenode:8020/media/a.png") is None
    assert location_problem("abfs://container:secret@account.dfs.core.windows.net/a.png") == CREDENTIALS
    assert masked("hdfs://alice@namenode/a.png") == "hdfs://alice@namenode/a.png"
    assert masked("abfs://container:se:cret@account/a.png") == "abfs://container:***@account/a.png"
    quoted = "copy s3://KEY:SECRET@b/x.png to abfs://box:pass@acct/y.png"
    assert masked(quoted) == "copy s3://***@b/x.png to abfs://box:***@acct/y.png"


def test_every_uri_of_a_message_is_masked_past_one_that_holds_none_or_one_inside_another():
    """A URI without credentials, or one met inside another's user info (`a://` in a secret), is
    passed over and the URIs after it are still read; a secret may hold a space only in a text
    that is one location."""
    assert masked("http://host/x s3://K:S@b/y") == "http://host/x s3://***@b/y"
    assert masked("see s3://K:a://b@bucket/k and gs://u:p@c/z") == "see s3://***@bucket/k and gs://***@c/z"
    assert location_problem("s3://KEY:se cret@bucket/a.png") == CREDENTIALS
    assert location_problem("a\udc80.png") == "a lone surrogate (text that is not Unicode) in a location is refused"


def test_a_normalised_folder_is_its_bucket_with_one_slash_and_a_climb_is_named():
    assert normalized("s3://b", folder=True) == "s3://b/"
    assert normalized("S3://b//x/.", folder=True) == "s3://b/x/"
    with pytest.raises(LocationProblem) as climbed:
        normalized("s3://b/../x")
    assert str(climbed.value) == "'s3://b/../x' climbs above its bucket"


def test_shown_escapes_what_could_hide_or_forge_a_line():
    assert shown("a\ud800b\x1bc\nd") == "a\\ud800b\\x1bc\\x0ad"


def test_a_key_may_hold_a_scheme_separator():
    assert bucket_root("s3://bucket/http://host/a.png") == "s3://bucket"
    assert is_object_uri("s3://bucket/http://host/a.png")


def test_a_folder_is_never_under_a_root_only_objects_are():
    assert is_under("s3://b/media/sub/a.png", "s3://b/media")
    assert not is_under("s3://b/media-x/a.png", "s3://b/media")
    assert not is_under("s3://b/media/sub/", "s3://b/media")


def test_a_relative_entry_joins_its_folder_with_or_without_the_trailing_slash():
    assert joined("s3://b/records", "img/a.png") == "s3://b/records/img/a.png"
    assert joined("s3://b/records/", "../media/a.png") == "s3://b/media/a.png"


def test_an_object_uri_refusal_names_the_option_and_the_text_as_given():
    """The one line says which option and which text, masked: a folder, a query string."""
    for text in ("s3://b/out/", "s3://b", "s3://KEY:SECRET@b/out.parquet?versionId=1"):
        with pytest.raises(UsageError) as refused:
            object_uri(text, "-o")
        message = str(refused.value)
        assert message.startswith(f"-o {shown(text)!r}: "), message
        assert "SECRET" not in message
    assert object_uri("S3://b/./out/../o.parquet", "-o") == "s3://b/o.parquet"


NUL_ROOT = "s3://b/in\x00/"


def test_an_option_refusal_names_the_option_and_the_location_escaped():
    with pytest.raises(UsageError) as refused:
        option_location(NUL_ROOT, "--media-root")
    assert str(refused.value) == f"--media-root s3://b/in\\x00/: {location_problem(NUL_ROOT)}"


def test_the_scheme_alone_says_a_location_is_remote():
    """No filesystem is opened to tell (one pyarrow cannot open is remote all the same), and the
    string passes the one check first."""
    assert local_path("nosuch://bucket/records.jsonl") is None
    assert local_path("s3://bucket/records.jsonl") is None
    assert str(local_path("file:///data/records.jsonl")) == "/data/records.jsonl"
    control = "records\x01.jsonl"
    with pytest.raises(UsageError) as refused:
        local_path(control)
    assert str(refused.value) == f"location {shown(control)}: {location_problem(control)}"


def test_a_uri_that_cannot_be_opened_is_a_usage_error_with_the_reason():
    with pytest.raises((ValueError, OSError)) as raw:
        pafs.FileSystem.from_uri("nosuch://bucket/key")
    with pytest.raises(UsageError) as refused:
        opened("nosuch://bucket/key")
    assert str(refused.value) == f"cannot open nosuch://bucket/key: {shown(str(raw.value))}"
    control = "file:///tmp/a\x01b"
    with pytest.raises(UsageError) as refused:
        opened(control)
    assert str(refused.value) == f"cannot open {shown(control)}: {location_problem(control)}"


@pytest.mark.parametrize("option", ["-o", "--checkpoint", "--media-root"])
def test_a_location_option_refused_on_the_command_line_names_its_option(option, tmp_path):
    records = tmp_path / "r.jsonl"
    records.write_text('{"id": "a", "state": "x"}\n')
    argv = ["score", str(records), "-o", str(tmp_path / "o.parquet")]
    argv += [option, str(tmp_path / "a\x01b")]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and option in line.split(":", 2)[1] and "a\\x01b" in line, line
    assert not list(tmp_path.glob("a*")) and not list(tmp_path.glob("*.parquet"))
