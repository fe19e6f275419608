"""Every guard fails closed (issue 36): a narrowing option (--allowed-media-domains, --media-root,
the media limits) whose value could not narrow, because it is empty, a bare separator, a URL or
host:port, a missing folder or a limit of zero, exits 2 with one line naming the fix, before
anything is read, fetched or written. `MediaLimits` (and `FetchPolicy`) refuse the same values,
so no library caller can build limits that let more through than they say."""

from __future__ import annotations

import ipaddress
import json
import math
import pickle
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.cli.media_options import MEDIA_LIMIT_OPTIONS, media_limits
from clef_cli.encoding.media_limits import KEY_FIELDS, MediaLimits, key_limits
from clef_cli.errors import UsageError
from clef_cli.locations.remote_fetch import FetchError, FetchPolicy, checked_hop

from .support.helpers import MEDIA, SAMPLE_DATA, TINY_MODEL, write_jsonl
from .support.media_server import body, media_server

runner = CliRunner()
REMOTE = ["--allow-remote-media", "--allow-private-media-hosts"]


def score(tmp_path: Path, *options: str, records: Path = SAMPLE_DATA / "records.jsonl"):
    """`clef score` in `tmp_path` (which then holds only what the job wrote)."""
    args = ["score", str(records), "-o", str(tmp_path / "out.parquet"), "--model", str(TINY_MODEL), "--workers", "0"]
    return runner.invoke(app, [*args, "--quiet", *options])


def one_line_refusal(result, option: str) -> str:
    """The refusal's line, after checking it is exit 2, one line and names `option`."""
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in result.output, result.output
    assert line.startswith(f"error: {option}: "), line
    return line


DOMAINS = [
    ("", "'' is empty; give host names, like example.com"),
    (",", "',' has an empty entry; give host names"),
    (" ", "' ' is empty"),
    (" , ", "has an empty entry"),
    ("example.com,", "'example.com,' has an empty entry"),
    (",example.com", "has an empty entry"),
    ("example.com,,cdn.example", "has an empty entry"),
    ("example.com:8080", "'example.com:8080' has a port; give host names only, like example.com"),
    ("http://example.com", "'http://example.com' has a scheme; give host names only, like example.com"),
    ("https://cdn.example:443/media", "has a scheme; give host names only, like cdn.example"),
    ("example.com/media", "'example.com/media' has a path; give host names only, like example.com"),
    ("user@example.com", "has a user name; give host names only, like example.com"),
    ("[::1]", "has brackets"),
    ("*", "write subdomains as *.example.com"),
    ("*.", "a wildcard without a domain"),
    ("cdn.*.example", "write subdomains as *.example.com"),
    ("a..b", "is not a valid host name"),
    ("0x7f.1", "non-standard spelling of the IPv4 address 127.0.0.1"),
]


@pytest.mark.parametrize(("value", "message"), DOMAINS, ids=[repr(value) for value, _ in DOMAINS])
def test_a_malformed_allow_list_exits_2_and_names_the_fix(tmp_path, value, message):
    result = score(tmp_path, *REMOTE, "--allowed-media-domains", value)
    assert message in one_line_refusal(result, "--allowed-media-domains")
    assert list(tmp_path.iterdir()) == []  # no output, no checkpoint


def test_an_empty_allow_list_from_an_unset_variable_fetches_nothing(tmp_path):
    """The issue's crontab: `--allowed-media-domains "$ALLOWED"` with $ALLOWED unset, beside
    --allow-private-media-hosts. It applied no list and fetched 127.0.0.1; now nothing is asked."""
    with media_server(routes={"/a.png": body((MEDIA / "image_a.png").read_bytes(), "image/png")}) as server:
        records = [
            {"id": "remote", "state": "s", "questions": {"q": {"type": "noul"}}, "images": [server.url("/a.png")]}
        ]
        inputs = write_jsonl(tmp_path / "in.jsonl", records)
        for value in ("", ","):
            result = score(tmp_path, *REMOTE, "--allowed-media-domains", value, records=inputs)
            one_line_refusal(result, "--allowed-media-domains")
        assert server.requests == []
    assert [path.name for path in tmp_path.iterdir()] == ["in.jsonl"]


def cli_limits(**values) -> MediaLimits:
    """`media_limits` on the options' defaults, as `with_media_limits` calls it, with `values`."""
    defaults = {name: default for name, (_, default, _) in MEDIA_LIMIT_OPTIONS.items()}
    return media_limits({**defaults, **values})


def test_a_valid_allow_list_still_passes_and_narrows():
    """No connection: the hops are only checked (the address is public, no test connects to it)."""
    public = [ipaddress.ip_address("93.184.216.34")]
    limits = cli_limits(allow_remote=True, allowed_media_domains=["Media.Example, *.cdn.example", "127.0.0.1"])
    assert limits.allowed_media_domains == ("Media.Example", "*.cdn.example", "127.0.0.1")
    policy = limits.fetch_policy()
    assert checked_hop("http://media.example/a.png", policy, lambda host, port: public).host == "media.example"
    with pytest.raises(FetchError, match="not in --allowed-media-domains"):
        checked_hop("http://elsewhere.example/a.png", policy, lambda host, port: public)


@pytest.mark.parametrize("value", [value for value, _ in DOMAINS])
def test_an_allow_list_option_given_never_yields_limits_that_allow_every_host(value):
    """Library level: from the option's parsing to `MediaLimits`, a malformed value raises; it can
    never come out as the empty tuple (any host) nor as a list the fetcher could not honour."""
    with pytest.raises(UsageError, match=r"^--allowed-media-domains: "):
        cli_limits(allow_remote=True, allow_private_media_hosts=True, allowed_media_domains=[value])
    with pytest.raises(UsageError, match=r"^--allowed-media-domains: "):
        cli_limits(allow_remote=True, allowed_media_domains=["example.com", value])


MALFORMED_LISTS = [
    "",  # one string: falsy, so it would mean "any host"
    "example.com",  # one string: its characters would be the entries
    ("",),
    (" ",),
    (",",),
    ("example.com,cdn.example",),
    ("example.com", ""),
    ("http://example.com",),
    ("example.com:8080",),
    ("example.com/x",),
    ("*",),
    (None,),
    None,
]


@pytest.mark.parametrize("domains", MALFORMED_LISTS, ids=repr)
def test_media_limits_refuse_an_allow_list_that_could_fail_open(domains):
    with pytest.raises(UsageError, match=r"^--allowed-media-domains: "):
        MediaLimits(allow_remote=True, allowed_media_domains=domains)
    with pytest.raises(ValueError, match="allowed_domains"):
        FetchPolicy(max_bytes=1 << 20, allowed_domains=domains)
    with pytest.raises(UsageError):  # nor through replace() (how the job sets its spool)
        replace(MediaLimits(allow_remote=True), allowed_media_domains=domains)


UNLISTED = "http://zzz.zz/a.png"
"""A host no generated entry can name (no `z` in their alphabet): it must stay refused."""
RAW = st.text(alphabet="ab.-*:/,@[] \t09x", max_size=12)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(RAW, min_size=1, max_size=3))
def test_no_option_value_widens_the_allow_list(values):
    """Whatever --allowed-media-domains is given (each value as typed), parsing either refuses it
    (exit 2) or keeps a non-empty list that still refuses a host it does not name."""
    try:
        limits = cli_limits(allow_remote=True, allow_private_media_hosts=True, allowed_media_domains=values)
    except UsageError as refused:
        assert str(refused).startswith("--allowed-media-domains: ")
        return
    assert limits.allowed_media_domains
    with pytest.raises(FetchError, match="not in --allowed-media-domains"):
        checked_hop(UNLISTED, limits.fetch_policy(), lambda host, port: [ipaddress.ip_address("127.0.0.1")])


def test_only_the_empty_tuple_means_any_host():
    """The one spelling of "no restriction" left is the explicit default; a list (from JSON)
    becomes a tuple, so what is checked is what is kept."""
    assert MediaLimits(allow_remote=True).fetch_policy().allowed_domains == ()
    listed = MediaLimits(allow_remote=True, allowed_media_domains=["media.example"])
    assert listed.allowed_media_domains == ("media.example",)
    assert FetchPolicy(max_bytes=1, allowed_domains=["media.example"]).allowed_domains == ("media.example",)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "'' is empty; give a folder"),  # as a path it was the working folder
        (" ", "' ' is empty; give a folder"),
        ("{tmp}/nowhere", "does not exist; give an existing folder"),
        ("{tmp}/a-file.png", "is not a folder; give the folder that holds the media"),
    ],
)
def test_a_malformed_media_root_exits_2(tmp_path, value, message):
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "a-file.png").write_bytes((MEDIA / "image_a.png").read_bytes())
    result = score(work, "--media-root", value.format(tmp=tmp_path))
    assert message in one_line_refusal(result, "--media-root")
    assert list(work.iterdir()) == []


def test_media_limits_refuse_roots_that_could_not_fence(tmp_path):
    (tmp_path / "file").write_text("x")
    for roots, message in (
        ((Path(""),), "is not an absolute path"),  # Path("") is ".", the working folder
        ((Path("relative"),), "is not an absolute path"),
        ((tmp_path / "missing",), "does not exist"),
        ((tmp_path / "file",), "is not a folder"),
        (("",), "is empty"),
        (tmp_path, "is not a list of folders"),
        (str(tmp_path), "is not a list of folders"),
    ):
        with pytest.raises(UsageError, match=r"^--media-root: ") as refused:
            MediaLimits(media_roots=roots)
        assert message in str(refused.value)
    assert MediaLimits(media_roots=[str(tmp_path)]).media_roots == (tmp_path,)


LIMITS = [
    ("--max-image-pixels", "0"),
    ("--max-image-pixels", "-1"),
    ("--max-file-bytes", "0"),
    ("--max-file-bytes", "-1"),
    ("--max-file-bytes", "-1M"),
    ("--max-file-bytes", "0.0001K"),  # rounds down to 0 bytes
    ("--max-file-bytes", ""),
    ("--max-file-bytes", "lots"),
    ("--max-audio-seconds", "0"),
    ("--max-audio-seconds", "-5"),
    ("--max-audio-seconds", "nan"),
    ("--max-audio-seconds", "inf"),
    ("--max-video-seconds", "0"),
    ("--max-video-seconds", "-5"),
    ("--max-video-seconds", "nan"),
    ("--max-video-seconds", "inf"),
]


@pytest.mark.parametrize(("option", "value"), LIMITS, ids=[f"{o} {v!r}" for o, v in LIMITS])
def test_a_limit_that_is_not_a_positive_number_exits_2(tmp_path, option, value):
    """Typer's own range checks answer some (a usage box, exit 2); the rest are `MediaLimits`'s."""
    result = score(tmp_path, f"{option}={value}")
    assert result.exit_code == 2, result.output
    assert option in result.stderr and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "field",
    [("max_image_pixels", 0), ("max_image_pixels", 2.5), ("max_image_pixels", True), ("max_file_bytes", 0),
     ("max_file_bytes", -1), ("max_audio_seconds", 0.0), ("max_audio_seconds", math.nan),
     ("max_video_seconds", -1.0), ("max_video_seconds", math.inf), ("remote_timeout_seconds", 0),
     ("remote_timeout_seconds", math.nan), ("max_audio_seconds", "30")],
    ids=repr,
)  # fmt: skip
def test_media_limits_refuse_limits_that_are_not_positive_numbers(field):
    """NaN compares false with every duration, so a NaN limit would let every medium through."""
    name, value = field
    with pytest.raises(UsageError, match="is not a"):
        MediaLimits(**{name: value})


def test_the_record_keys_fields_are_unchanged_and_the_metadata_names_the_allow_list():
    """`as_dict` feeds every record key (store/record_key.py): the same five fields, the same
    values. `as_metadata` adds where media may come from, which `key_limits` leaves out again."""
    limits = MediaLimits(allow_remote=True, allowed_media_domains=("media.example",), allow_private_media_hosts=True)
    assert limits.as_dict() == {
        "max_image_pixels": 40_000_000,
        "max_audio_seconds": 1800.0,
        "max_video_seconds": 300.0,
        "max_file_bytes": 256 * 1024 * 1024,
        "allow_remote": True,
    }
    assert tuple(limits.as_dict()) == KEY_FIELDS
    stored = json.loads(json.dumps(limits.as_metadata()))
    assert stored["allowed_media_domains"] == ["media.example"] and stored["allow_private_media_hosts"] is True
    assert key_limits(stored) == limits.as_dict()
    assert MediaLimits(**key_limits(stored)).as_dict() == limits.as_dict()
    assert pickle.loads(pickle.dumps(limits)) == limits  # workers get exactly these limits
