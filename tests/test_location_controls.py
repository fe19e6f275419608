"""The fences of issue 57.6: a secret holding a `/` (`s3://KEY:se/cret@bucket/...`, about half of
AWS secret keys) is found as user info, refused (exit 2) and masked everywhere, while a key that
merely holds an `@` still works; C1 controls and U+2028/U+2029 are refused in every location and
escaped wherever text is shown, as C0 and DEL are; nothing the job writes or reads beside its
store (an output, an input, a media root, --stats-json) lies inside the store's folder. The checks
in process over many spellings first, then the command line (against moto behind the counting
proxy: no request reaches the bucket), then a scoring run whose records' error cells say it."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.errors import UsageError
from clef_cli.locations.overlap import refuse_inside_store
from clef_cli.locations.uris import CREDENTIALS, LocationProblem, location_problem, masked, normalized, shown

from .support.helpers import TINY_MODEL, write_jsonl

runner = CliRunner()
BUCKET = "clef-fences"
COMMON = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--hidden-states", "drop", "--max-length", "4096"]
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"}}

# ----------------------------------------------------------------------------- user info

SECRET = "wJalrXUt/K7MDENG+bPx@RfiCY/zEXAMPLE"
"""An AWS-shaped secret with `/` and an `@`; no fragment of it between the `/`s may be shown."""
FRAGMENTS = ("wJalrXUt", "K7MDENG", "RfiCY", "zEXAMPLE")
WITH_SECRETS = [
    "s3://AKIAEXAMPLE:Sk3yQ/Zw9vX@bucket/records/a.png",
    "s3://AKIAEXAMPLE:Sk3yQ/Zw9vX@bucket",
    "s3://AKIAEXAMPLE:Sk3yQ/Zw9vX@bucket/",
    "S3://AKIAEXAMPLE:Sk3yQ/Zw9vX@Bucket/a.png",
    "s3a://AKIAEXAMPLE:Sk3yQ//Zw9vX@bucket/a.png",
    "gs://AKIAEXAMPLE:Sk3yQ/Zw9vX/Hq2Lm@bucket/a.png",
    "gcs://AKIAEXAMPLE:1234/Zw9vX@bucket/a.png",  # digits before the `/`: a bucket has no port
    "s3://AKIAEXAMPLE:Sk3yQ/Zw9vX@bucket/photos/me@home.jpg",  # the key holds an `@` too
    "s3://AKIAEXAMPLE:Sk3yQ@Hq2Lm/Zw9vX@bucket/a.png",  # `@` and `/` in one secret
    "s3://AKIAEXAMPLE:Sk3yQ?Hq2Lm#Zw9vX@bucket/a.png",  # a `?` or `#` in the secret
    "s3://AKIAEXAMPLE:Sk3yQ/Zw9vX@bucket/a.png?versionId=1",
    "https://user:Sk3yQ/Zw9vX@host.example/a.png",
    "https://user:Sk3yQ/Zw9vX@host.example:8443/a.png",
    "abfs://container:Sk3yQ/Zw9vX@account.dfs.core.windows.net/a.png",
    "hdfs://alice:Sk3yQ/Zw9vX@namenode:8020/a.png",
    "s3://AKIAEXAMPLE:Sk3yQZw9vX@bucket/a.png",  # the plain forms still refused
    "s3://AKIAEXAMPLE@bucket/a.png",
    "s3://AKIAEXAMPLE:Sk3yQ@Zw9vX@bucket/a.png",
]
WITHOUT_SECRETS = [
    "s3://bucket/path/a@b.jpg",
    "s3://bucket/a@b",
    "s3://bucket/user@example.com/avatar.png",
    "s3://bucket/a:b/c@d.jpg",  # a `:` in the key, not in the authority
    "s3://bucket/x:y@z/a.png",
    "gs://bucket/2024-01-01T00:00:00@utc/a.png",
    "https://host.example:8080/a@b.jpg",  # a port
    "https://[::1]:8080/a@b.jpg",
    "https://host.example/search:x@y/a.png",
    "hdfs://alice@namenode:8020/media/x@y.png",  # hdfs's user name is no credential
    "abfs://container@account.dfs.core.windows.net/a@b:c.png",
    "file:///data/a:b@c.png",
    "/data/a:b@c.png",
]


@pytest.mark.parametrize("uri", WITH_SECRETS)
def test_user_info_is_found_wherever_an_at_stands_in_the_authority(uri):
    """`uris.py` stopped the user info at the first `/`: `s3://KEY:se/cret@bucket/...` passed the
    fence, unmasked, and its secret went to the endpoint in the request path."""
    assert location_problem(uri) == CREDENTIALS, uri
    with pytest.raises(LocationProblem) as refused:
        normalized(uri)
    hidden = ("Sk3yQ", "Zw9vX", "Hq2Lm", "1234") if "AKIAEXAMPLE:" in uri else ("AKIAEXAMPLE",)
    for text in (masked(uri), shown(uri), str(refused.value), masked(f"cannot read {uri}: gone"), masked(f"'{uri}'")):
        assert "***@" in text and not any(piece in text for piece in hidden), (uri, text)


@pytest.mark.parametrize("uri", WITHOUT_SECRETS)
def test_a_key_holding_an_at_or_a_colon_is_no_user_info(uri):
    assert location_problem(uri) is None, uri
    assert masked(uri) == uri and masked(f"read {uri} twice") == f"read {uri} twice"
    if uri.startswith(("s3://", "gs://")):
        assert "@" in normalized(uri)


def test_an_aws_shaped_secret_is_masked_in_every_message_that_quotes_it():
    """A message may quote several locations, in quotes or not; what follows the URI stays."""
    uri = f"s3://AKIAIOSFODNN7EXAMPLE:{SECRET}@bucket/night/"
    for text in (
        masked(f"error: --checkpoint {uri}: refused"),
        masked(f"copy {uri!r} to 's3://bucket/b@c.png'"),
        masked(uri),
        shown(uri),
        masked(f"{uri} and s3://K:x/y@other/z"),
    ):
        assert not any(fragment in text for fragment in FRAGMENTS) and "AKIAIOSFODNN7EXAMPLE" not in text, text
    assert masked(f"error: --checkpoint {uri}: refused") == "error: --checkpoint s3://***@bucket/night/: refused"
    assert masked(f"copy {uri!r} to 's3://bucket/b@c.png'") == "copy 's3://***@bucket/night/' to 's3://bucket/b@c.png'"


# ----------------------------------------------------------------------------- C1 and line separators

C1_AND_SEPARATORS = [chr(code) for code in (*range(0x80, 0xA0), 0x2028, 0x2029)]
IDS = [f"U+{ord(character):04X}" for character in C1_AND_SEPARATORS]


@pytest.mark.parametrize("character", C1_AND_SEPARATORS, ids=IDS)
def test_c1_and_the_line_separators_are_refused_and_escaped(character, tmp_path):
    """U+0085 (NEL) ends a line to many log viewers and U+009B (CSI) starts a terminal's escape:
    they passed the fence, were sent as keys and written raw into error cells."""
    for location in (f"s3://store/a{character}b/", f"media/a{character}.png", str(tmp_path / f"a{character}.png")):
        assert location_problem(location) == "a control character in a location is refused", location
    with pytest.raises(LocationProblem) as refused:
        normalized(f"s3://store/a{character}b/")
    code = ord(character)
    escape = f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    assert str(refused.value).endswith(f"s3://store/a{escape}b/")
    assert shown(f"a{character}b") == f"a{escape}b" and character not in str(refused.value)


def test_printable_unicode_still_passes():
    """Only controls and separators: Latin-1's letters and other scripts name objects as written."""
    for text in ("s3://b/caf\u00e9.png", "s3://b/\u00a0nbsp.png", "s3://b/\u00ff.png", "s3://b/\u4e2d.png"):
        assert location_problem(text) is None and shown(text) == text


# ----------------------------------------------------------------------------- inside the store

STORE = "s3://store/ovs/"
INSIDE_STORE = [
    "s3://store/ovs/media/",
    "s3://store/ovs/segments/",
    "s3://store/ovs",
    "S3://STORE//ovs/./media",
    "s3://store/x/../ovs/segments/stats.json",
    "s3://store/ovs/a%20b/",
]
OUTSIDE_STORE = ["s3://store/ovs-media/", "s3://store/", "s3://other/ovs/media/", "gs://store/ovs/media/"]


@pytest.mark.parametrize("location", INSIDE_STORE)
def test_a_media_root_or_stats_file_inside_the_store_is_refused(location):
    with pytest.raises(UsageError, match=r"^--media-root .* the store --checkpoint s3://store/ovs/: the store's"):
        refuse_inside_store("--media-root", [None, location], STORE)


@pytest.mark.parametrize("location", OUTSIDE_STORE)
def test_a_media_root_beside_or_above_the_store_is_not(location):
    """A media root holding the store (a whole bucket) is allowed: it writes nothing there."""
    refuse_inside_store("--media-root", [location], STORE)
    refuse_inside_store("--media-root", [location], None)


def test_a_local_media_root_inside_a_local_store_is_refused(tmp_path):
    store = tmp_path / "store"
    (store / "media").mkdir(parents=True)
    (tmp_path / "link").symlink_to(store / "media")
    for location in (store / "media", tmp_path / "link", f"file://{store}/media", store):
        with pytest.raises(UsageError, match="the store's folder is its own"):
            refuse_inside_store("--media-root", [location], store)
    refuse_inside_store("--media-root", [tmp_path / "media"], store)


def test_the_refusal_says_whether_the_location_is_the_store_or_lies_inside_it(tmp_path, monkeypatch):
    """The whole line, naming the option, the location as given and the store; and an empty
    --checkpoint (none given) fences nothing, not the working folder."""
    with pytest.raises(UsageError) as same:
        refuse_inside_store("--stats-json", ["s3://store/ovs"], STORE)
    assert str(same.value) == (
        "--stats-json s3://store/ovs is the store --checkpoint s3://store/ovs/: the store's folder is its own "
        "(a prune deletes what it does not name); give --stats-json a location outside it"
    )
    with pytest.raises(UsageError, match=r"^--media-root s3://store/ovs/media/ lies inside the store --checkpoint "):
        refuse_inside_store("--media-root", ["s3://store/ovs/media/"], STORE)
    monkeypatch.chdir(tmp_path)
    refuse_inside_store("--media-root", [tmp_path / "media", tmp_path], "")
    refuse_inside_store("--media-root", [tmp_path / "media"], "  ")


# ----------------------------------------------------------------------------- the command line


@pytest.fixture
def records(tmp_path) -> Path:
    return write_jsonl(tmp_path / "r.jsonl", [{"id": "a", "state": "x", "questions": QUESTIONS}])


SECRET_CASES = [
    ("--checkpoint", ["-o", "{tmp}/o.parquet", "--checkpoint", "s3://AKIAEXAMPLE:{secret}@{bucket}/store/"]),
    ("-o", ["-o", "s3://AKIAEXAMPLE:{secret}@{bucket}/out.parquet"]),
    ("INPUTS", ["s3://AKIAEXAMPLE:{secret}@{bucket}/in/r.jsonl", "-o", "{tmp}/o.parquet"]),
    ("--media-root", ["-o", "{tmp}/o.parquet", "--media-root", "s3://AKIAEXAMPLE:{secret}@{bucket}/media/"]),
]


@pytest.mark.parametrize(("option", "argv"), SECRET_CASES, ids=[case[0] for case in SECRET_CASES])
def test_a_secret_with_a_slash_is_refused_on_the_command_line_and_never_shown(
    store_bucket, proxy, records, tmp_path, option, argv
):
    """Exit 2 (it was 1, after requests whose path held the secret), one line naming the option,
    the URI masked, and not one request to the bucket."""
    given = [part.format(tmp=tmp_path, secret=SECRET, bucket=BUCKET) for part in argv]
    inputs = [] if option == "INPUTS" else [str(records)]
    proxy.clear()
    result = runner.invoke(app, ["score", *inputs, *given, *COMMON])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    named = line.split(" ")[1]  # `--output/-o` for -o
    assert line.startswith("error: ") and named.endswith(option) and "put credentials in the environment" in line, line
    assert f"s3://***@{BUCKET}/" in line, line
    assert not any(fragment in result.output for fragment in FRAGMENTS), result.output
    assert proxy.requests == [], proxy.requests
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("character", ["\x85", "\x9b", "\u2028", "\u2029"], ids=["NEL", "CSI", "LS", "PS"])
def test_a_c1_store_uri_is_refused_and_named_escaped(store_bucket, proxy, records, tmp_path, character):
    """`--checkpoint $'s3://store/a\\u0085b/'` was a valid store whose name printed without it."""
    proxy.clear()
    store = f"s3://{BUCKET}/a{character}b/"
    output = str(tmp_path / "o.parquet")
    result = runner.invoke(app, ["score", str(records), "-o", output, "--checkpoint", store, *COMMON])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: --checkpoint ") and "control character" in line, line
    assert shown(store) in line and character not in result.output, line
    assert proxy.requests == [], proxy.requests


LOCAL_OUT = ["-o", "{tmp}/o.parquet"]
STORE_CASES = [
    ("-o", ["-o", "{b}/ovs/segments/out.parquet", "--checkpoint", "{b}/ovs/"], "holds the output"),
    ("--media-root", [*LOCAL_OUT, "--checkpoint", "{b}/ovs/", "--media-root", "{b}/ovs/media/"], "lies"),
    ("--stats-json", [*LOCAL_OUT, "--checkpoint", "{tmp}/store", "--stats-json", "{tmp}/store/s.json"], "lies"),
    ("local --media-root", [*LOCAL_OUT, "--checkpoint", "{tmp}/store", "--media-root", "{tmp}/store"], "is"),
]


@pytest.mark.parametrize(("what", "argv", "said"), STORE_CASES, ids=[case[0] for case in STORE_CASES])
def test_what_lies_inside_the_store_is_refused_on_the_command_line(
    store_bucket, proxy, records, tmp_path, what, argv, said
):
    """Defect 9: `-o s3://store/ovs/segments/out.parquet --checkpoint s3://store/ovs/` was taken
    and a later prune deleted the scored file; a media root or --stats-json inside the store's
    folder alike. Exit 2, one line, before any request."""
    (tmp_path / "store").mkdir()
    given = [part.format(tmp=tmp_path, b=f"s3://{BUCKET}") for part in argv]
    proxy.clear()
    result = runner.invoke(app, ["score", str(records), *given, *COMMON])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    option = what.split()[-1]
    first = "--checkpoint" if option == "-o" else option
    assert line.startswith(f"error: {first} ") and f" {said} " in line, line
    assert "the store's folder is its own" in line or option == "-o", line
    assert proxy.requests == [], proxy.requests
    assert not (tmp_path / "o.parquet").exists() and list((tmp_path / "store").iterdir()) == []


# ----------------------------------------------------------------------------- a record's error cell


def test_a_record_path_with_c1_or_a_slashed_secret_is_that_records_error_escaped_and_masked(tmp_path):
    """Each record naming such a location fails alone (exit 3): its error cell says why with the
    character escaped and the secret masked, and neither reaches the output file or stderr."""
    entries = {
        "nel": "a\x85b.png",
        "csi": "a\x9b[2Jb.png",
        "ls": "a\u2028b.png",
        "secret": f"s3://AKIAEXAMPLE:{SECRET}@{BUCKET}/media/a.png",
    }
    rows = [{"id": "ok", "state": "fine", "questions": QUESTIONS}]
    rows += [{"id": name, "state": "s", "questions": QUESTIONS, "images": [entry]} for name, entry in entries.items()]
    records = write_jsonl(tmp_path / "r.jsonl", rows)
    output = tmp_path / "o.parquet"
    result = runner.invoke(app, ["score", str(records), "-o", str(output), *COMMON])
    assert result.exit_code == 3, result.output
    cells = {row["id"]: row for row in pq.read_table(output).to_pylist()}
    assert cells["ok"]["error"] is None
    for name, escape in (("nel", "a\\x85b.png"), ("csi", "a\\x9b[2Jb.png"), ("ls", "a\\u2028b.png")):
        error = cells[name]["error"]
        assert cells[name]["error_kind"] == "media" and "control character" in error and escape in error, error
    assert "put credentials in the environment" in cells["secret"]["error"]
    assert f"s3://***@{BUCKET}/media/a.png" in cells["secret"]["error"], cells["secret"]["error"]
    texts = [value for row in cells.values() for value in row.values() if isinstance(value, str)]
    for raw in ("\x85", "\x9b", "\u2028", *FRAGMENTS):
        assert not any(raw in text for text in [*texts, result.output]), raw


def test_a_library_caller_gets_the_media_root_refusal_too(tmp_path):
    """The media root inside the store is refused by the run's plan (`job/plan.refuse_overlaps`),
    not only by the CLI."""
    from clef_cli.encoding.media import MediaLimits
    from clef_cli.job.plan import refuse_overlaps
    from clef_cli.job.settings import ScoreSettings

    store = tmp_path / "store"
    (store / "m").mkdir(parents=True)
    (tmp_path / "media").mkdir()
    records = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "state": "x"}])
    inside = ScoreSettings(
        [records], tmp_path / "o.parquet", checkpoint=store, limits=MediaLimits(media_roots=(store / "m",))
    )
    with pytest.raises(UsageError, match=r"--media-root .* lies inside the store --checkpoint"):
        refuse_overlaps(inside)
    beside = MediaLimits(media_roots=(tmp_path / "media",))
    refuse_overlaps(ScoreSettings([records], tmp_path / "o.parquet", checkpoint=store, limits=beside))
