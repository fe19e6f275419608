"""An output never replaces an input (issue 56.1): `-o` equal to an input, however spelled, or
inside an input's folder, prefix or glob, is refused before anything runs (exit 2, one line naming
the option and both locations), for every input kind, local and in a bucket; the same for the
store (--checkpoint) and for review's and the quality commands' outputs. The check itself
(`locations/overlap.py`) first, in process, over many spellings; then the commands, with the
input left byte for byte as it was."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.errors import UsageError
from clef_cli.job.settings import ScoreSettings
from clef_cli.locations import object_store
from clef_cli.locations.overlap import refuse_overlap, relation

from .support.helpers import TINY_MODEL
from .support.scored_files import random_records, write_scored

runner = CliRunner()
BUCKET = "clef-overlap"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
COMMON = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--hidden-states", "drop"]

# ----------------------------------------------------------------------------- the check

SAME = [
    ("s3://b/in/r.parquet", "s3://b/in/r.parquet"),
    ("S3://b/in/r.parquet", "s3://b/in/r.parquet"),
    ("s3://B/in/r.parquet", "s3://b/in/r.parquet"),
    ("s3://b//in/r.parquet", "s3://b/in/r.parquet"),
    ("s3://b/in//r.parquet", "s3://b/in/r.parquet"),
    ("s3://b/in/./r.parquet", "s3://b/in/r.parquet"),
    ("s3://b/x/../in/r.parquet", "s3://b/in/r.parquet"),
    ("s3://b/in/r.parquet/", "s3://b/in/r.parquet"),
    ("s3://b/in/a%20b.parquet", "s3://b/in/a b.parquet"),  # pyarrow sends the key percent-decoded
    ("s3://b/in/r.parquet", "s3://b/in/r.parquet/"),
    ("gs://b/in/r.parquet", "gs://b/in/r.parquet"),
]
INSIDE = [
    ("s3://b/in/scores.parquet", "s3://b/in/"),
    ("s3://b/in/scores.parquet", "s3://b/in"),  # a prefix given without its slash
    ("s3://b/in/scores.parquet", "s3://b/in//"),
    ("s3://b/in/lang=en/scores.parquet", "s3://b/in/"),  # inside a Hive partition of a folder input
    ("s3://b/a/b/c/scores.parquet", "s3://b/a/"),
    ("s3://b/scores.parquet", "s3://b/"),  # a whole bucket is read
    ("s3://b/scores.parquet", "s3://b"),
]
MATCHED = [
    ("s3://b/in/scores.parquet", "s3://b/in/*.parquet"),
    ("s3://b/in/part-9.parquet", "s3://b/in/part-?.parquet"),
    ("s3://b/in/lang=en/x.parquet", "s3://b/in/*/x.parquet"),
    ("s3://b/in/p1.parquet", "s3://b/in/p[0-9].parquet"),
    ("s3://b//in/./scores.parquet", "s3://b/in/*.parquet"),
]
APART = [
    ("s3://b/inside/scores.parquet", "s3://b/in"),  # a prefix is compared by whole segments
    ("s3://b/in.parquet", "s3://b/in"),
    ("s3://c/in/r.parquet", "s3://b/in/r.parquet"),  # another bucket
    ("gs://b/in/r.parquet", "s3://b/in/r.parquet"),  # another store
    ("s3://b/out/r.parquet", "s3://b/in/r.parquet"),
    ("s3://b/in/scores.parquet", "s3://b/in/*.jsonl"),  # a glob reads only what it matches
    ("s3://b/in/sub/x.parquet", "s3://b/in/*.parquet"),  # `*` stays within a folder
    ("s3://b/in/r.parquet", "-"),  # stdin: nothing to overwrite
    ("/b/in/r.parquet", "s3://b/in/r.parquet"),  # a local path is not an object
]


@pytest.mark.parametrize(("written", "read"), SAME)
def test_an_object_output_is_its_input_however_either_is_spelled(written, read):
    assert relation(written, read) == "is"


@pytest.mark.parametrize(("written", "read"), INSIDE)
def test_an_output_inside_an_input_prefix_or_folder_is_found(written, read):
    assert relation(written, read) == "lies inside"


@pytest.mark.parametrize(("written", "read"), MATCHED)
def test_an_output_a_glob_input_matches_is_found(written, read):
    assert relation(written, read) == "matches"


@pytest.mark.parametrize(("written", "read"), APART)
def test_locations_apart_are_apart(written, read):
    assert relation(written, read) is None
    assert relation(written, read, folder=True) is None


def test_local_spellings_of_one_file_are_one_location(tmp_path, monkeypatch):
    """Relative and absolute, `.`/`..`/doubled slashes, file: and local: URIs (percent-encoded),
    a symbolic link to the file and one to a folder above it: all the same file."""
    folder = tmp_path / "in put"
    folder.mkdir()
    target = folder / "records.jsonl"
    target.write_text("{}\n")
    (tmp_path / "link.jsonl").symlink_to(target)
    (tmp_path / "folder-link").symlink_to(folder)
    monkeypatch.chdir(tmp_path)
    spellings = [
        "in put/records.jsonl",
        "./in put/./records.jsonl",
        "in put/../in put/records.jsonl",
        f"{tmp_path}//in put/records.jsonl",
        f"file://{tmp_path}/in%20put/records.jsonl",
        f"file:{tmp_path}/in%20put/records.jsonl",
        f"local://{tmp_path}/in%20put/records.jsonl",
        "link.jsonl",
        "folder-link/records.jsonl",
        target,
    ]
    for spelling in spellings:
        assert relation(spelling, target) == "is", spelling
        assert relation(target, spelling) == "is", spelling
    assert relation(tmp_path / "records.jsonl", target) is None


def test_local_folders_globs_and_links_into_them(tmp_path):
    """An output inside a folder input (also through a link to it, or a Hive partition of it),
    matched by a glob input (the glob's fixed folders through their links too), found; one
    beside them not."""
    data = tmp_path / "data"
    (data / "lang=en").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(data)
    assert relation(data / "scores.parquet", data) == "lies inside"
    assert relation(data / "lang=en" / "scores.parquet", f"{data}/") == "lies inside"
    assert relation(tmp_path / "alias" / "scores.parquet", data) == "lies inside"
    assert relation(data / "scores.parquet", f"file://{tmp_path}/alias/") == "lies inside"
    assert relation(data / "scores.parquet", f"{tmp_path}/alias/*.parquet") == "matches"
    assert relation(data / "lang=en" / "x.parquet", f"{data}/*/x.parquet") == "matches"
    assert relation(data / "scores.parquet", f"{data}/*.jsonl") is None
    assert relation(tmp_path / "data-2" / "scores.parquet", data) is None
    assert relation(tmp_path / "scores.parquet", data) is None


def test_one_form_for_every_spelling_and_no_two_places_taken_for_one(tmp_path):
    """A key holding `://` is split at the scheme's, not its own; two trees whose paths differ only
    in their first folder are apart; a glob at the root is still a glob; a file written is never
    taken for a folder that holds what a glob reads (only a store is: `folder`)."""
    assert relation("s3://b/k://x", "s3://b/k:/x") == "is"
    assert relation("/tmp/clef-x/o.parquet", "/var/clef-x/o.parquet") is None
    assert relation("/o.jsonl", "/*.jsonl") == "matches"
    data = tmp_path / "d"
    assert relation(data, f"{data}/*.jsonl") is None
    assert relation(data, f"{data}/*.jsonl", folder=True) == "holds"
    assert relation(data / "x", f"{data}/*/a.jsonl") is None
    assert relation(data / "x", f"{data}/*/a.jsonl", folder=True) == "holds files matched by"
    refuse_overlap("-o", data, [f"{data}/*.jsonl"])  # a file is not a folder unless the caller says so


STORES = [
    ("s3://b/in/", "s3://b/in/r.jsonl", "holds"),  # the store's prefix holds the input
    ("s3://b/", "s3://b/in/r.jsonl", "holds"),
    ("s3://b/in", "s3://b/in/", "is"),
    ("s3://b/in/store/", "s3://b/in/", "lies inside"),  # the input folder holds the store
    ("s3://b/in/store/", "s3://b/in/*/*.parquet", "holds files matched by"),
    ("s3://b/in/", "s3://b/in/*/*.parquet", "holds"),  # the glob's base
    ("s3://b/", "s3://b/in/*.parquet", "holds"),
    ("s3://b/in/store/", "s3://b/in/*.parquet", None),  # `*` stays within in/
    ("s3://b/store/", "s3://b/in/", None),
    ("s3://b/in-store/", "s3://b/in/r.jsonl", None),
]


@pytest.mark.parametrize(("store", "read", "found"), STORES)
def test_a_store_meets_an_input_it_holds_or_that_holds_it(store, read, found):
    assert relation(store, read, folder=True) == found


def test_the_refusal_is_one_line_naming_the_option_and_both_locations():
    with pytest.raises(UsageError) as refused:
        refuse_overlap("-o", "s3://b//in/r.parquet", [None, "s3://b/other.jsonl", "s3://b/in/r.parquet"])
    (line,) = str(refused.value).splitlines()
    assert line.startswith("-o s3://b//in/r.parquet is the input s3://b/in/r.parquet: writing would replace it")
    with pytest.raises(UsageError, match=r"^--checkpoint s3://b/ holds the output s3://b/o\.parquet: their files"):
        refuse_overlap("--checkpoint", "s3://b/", ["s3://b/o.parquet"], folder=True, what="output")
    refuse_overlap("-o", None, ["s3://b/in/r.parquet"])
    refuse_overlap("-o", "-", ["-"])


def test_a_library_caller_is_refused_too_and_a_stream_or_a_neighbour_is_not(tmp_path):
    """The plan of a run (`job/plan.refuse_overlaps`, what `ScoreJob(...).run()` plans for a
    library caller too) refuses an output over an input, a --questions file or a store holding
    the input; an output beside a glob's matches, /dev/null or an input through stdin is no
    overlap."""
    from clef_cli.job.plan import refuse_overlaps

    records = tmp_path / "in" / "records.jsonl"
    records.parent.mkdir()
    records.write_text(json.dumps({"id": "a", "state": "x", "questions": QUESTIONS}) + "\n")

    def settings(output, inputs=(records,), **more) -> ScoreSettings:
        return ScoreSettings(inputs=list(inputs), output=Path(output), model=str(TINY_MODEL), **more)

    for refused, inputs, more in [
        (records.with_suffix(".parquet"), [f"{records.parent}/*.parquet"], {}),
        (tmp_path / "in" / "q.parquet", [records], {"questions": tmp_path / "in" / "q.parquet"}),
        (tmp_path / "out.parquet", [records], {"checkpoint": str(tmp_path / "in")}),
        (tmp_path / "out.parquet", [records], {"checkpoint": tmp_path}),
    ]:
        with pytest.raises(UsageError, match=r"^(-o|--checkpoint) "):
            refuse_overlaps(settings(refused, inputs, **more))
    refuse_overlaps(settings(tmp_path / "in" / "scores.parquet", [f"{records.parent}/*.jsonl"]))
    refuse_overlaps(settings(os.devnull, [records], checkpoint=tmp_path / "store"))
    refuse_overlaps(settings(tmp_path / "out.parquet", ["-"]))


# ----------------------------------------------------------------------------- clef score, in a bucket


def _parquet_bytes() -> bytes:
    sink = pa.BufferOutputStream()
    table = pa.table({"id": ["a", "b"], "state": ["x", "y"], "questions": [json.dumps(QUESTIONS)] * 2})
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


@pytest.fixture
def s3(store_bucket):
    """The bucket holding one input of each kind under in/, and last night's output under out/."""
    jsonl = "".join(json.dumps({"id": n, "state": "x", "questions": QUESTIONS}) + "\n" for n in "ab")
    bodies = {
        "in/records.jsonl": jsonl.encode(),
        "in/records.parquet": _parquet_bytes(),
        "in/records.csv": b"id,state\na,x\nb,y\n",
        "parts/lang=en/part-0.jsonl": jsonl.encode(),
        "out/night.parquet": _parquet_bytes(),
    }
    for key, body in bodies.items():
        store_bucket.put_object(Bucket=BUCKET, Key=key, Body=body)
    object_store.forget()
    return store_bucket


def bucket_contents(client) -> dict[str, bytes]:
    listed = client.list_objects_v2(Bucket=BUCKET).get("Contents", [])
    return {item["Key"]: client.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read() for item in listed}


B = f"s3://{BUCKET}"
BUCKET_CASES = [
    ("the issue's Parquet object", [f"{B}/in/records.parquet"], ["-o", f"{B}/in/records.parquet"], "is"),
    ("JSONL, spelled otherwise", [f"{B}/in/records.jsonl"], ["-o", f"S3://{BUCKET}//in/./records.jsonl"], "is"),
    ("CSV", [f"{B}/in/records.csv"], ["-o", f"{B}/in/records.csv"], "is"),
    ("a prefix", [f"{B}/in/"], ["-o", f"{B}/in/scores.parquet"], "lies inside"),
    ("a Hive folder", [f"{B}/parts"], ["-o", f"{B}/parts/lang=en/scores.parquet"], "lies inside"),
    ("a glob", [f"{B}/in/*.parquet"], ["-o", f"{B}/in/scores.parquet"], "matches"),
    ("the second input", [f"{B}/in/records.csv", f"{B}/out/night.parquet"], ["-o", f"{B}/out/night.parquet"], "is"),
    ("a store holding the input", [f"{B}/in/records.jsonl"], ["--checkpoint", f"{B}/in/"], "holds"),
    ("a store inside the input", [f"{B}/in/"], ["--checkpoint", f"{B}/in/store/"], "lies inside"),
    ("a store holding the output", [f"{B}/in/records.jsonl"], ["--checkpoint", f"{B}/out/"], "holds the output"),
]


@pytest.mark.parametrize(("what", "inputs", "options", "said"), BUCKET_CASES, ids=[case[0] for case in BUCKET_CASES])
def test_an_output_or_store_over_a_bucket_input_is_refused_before_any_request(
    s3, proxy, tmp_path, what, inputs, options, said
):
    """`clef score s3://b/in/records.parquet -o s3://b/in/records.parquet` replaced the input
    object with the scores (exit 3). Now: exit 2, one line naming the option and both
    locations, not one request to the bucket, every object as it was."""
    before = bucket_contents(s3)
    proxy.clear()
    given = dict(zip(options[::2], options[1::2], strict=True))
    output = given.get("-o", f"{B}/out/night.parquet")
    store = given.get("--checkpoint", str(tmp_path / "store"))
    result = runner.invoke(app, ["score", *inputs, "-o", output, "--checkpoint", store, *COMMON])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    option = options[0]
    assert line.startswith(f"error: {option} ") and f" {said} " in line, line
    assert proxy.requests == [], proxy.requests  # refused before the output's probe, before any read
    assert bucket_contents(s3) == before
    assert list(tmp_path.iterdir()) == []  # no store, no stage


def test_compare_never_writes_its_json_over_a_bucket_input(s3, tmp_path):
    """`clef compare s3://b/old s3://b/new --json s3://b/new` would have put the JSON over NEW."""
    old, new = write_scored(tmp_path / "old.parquet", random_records(1, 20)), tmp_path / "new.parquet"
    write_scored(new, random_records(2, 20))
    for path in (old, new):
        s3.put_object(Bucket=BUCKET, Key=f"scored/{path.name}", Body=path.read_bytes())
    before = bucket_contents(s3)
    args = ["compare", f"{B}/scored/old.parquet", f"{B}/scored/new.parquet", "--json", f"{B}//scored/new.parquet"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: --json {B}//scored/new.parquet is the input {B}/scored/new.parquet"), line
    assert bucket_contents(s3) == before


# ----------------------------------------------------------------------------- clef score, local


def _local_inputs(folder: Path) -> dict[str, Path]:
    records = [{"id": n, "state": "x", "questions": QUESTIONS} for n in "ab"]
    jsonl = folder / "records.jsonl"
    jsonl.write_text("".join(json.dumps(record) + "\n" for record in records))
    table = folder / "records.parquet"
    pq.write_table(pa.table({"id": ["a"], "state": ["x"], "questions": [json.dumps(QUESTIONS)]}), table)
    csv = folder / "records.csv"
    csv.write_text("id,state\na,x\n")
    hive = folder / "parts" / "lang=en"
    hive.mkdir(parents=True)
    (hive / "part-0.jsonl").write_text(jsonl.read_text())
    return {"jsonl": jsonl, "parquet": table, "csv": csv, "folder": folder / "parts"}


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


LOCAL_CASES = [
    ("JSONL, through a file: URI", ["{jsonl}"], ["-o", "file://{jsonl}"], "is"),
    ("Parquet, through ./..", ["{parquet}"], ["-o", "{folder}/../records.parquet"], "is"),
    ("CSV, through a link", ["{csv}"], ["-o", "{link}"], "is"),
    ("a Hive folder", ["{folder}"], ["-o", "{folder}/lang=en/scores.parquet"], "lies inside"),
    ("a folder given with a slash", ["{folder}/"], ["-o", "{folder}/scores.parquet"], "lies inside"),
    ("a glob", ["{root}/*.parquet"], ["-o", "{root}/scores.parquet"], "matches"),
    ("a store holding the input", ["{jsonl}"], ["--checkpoint", "{root}"], "holds"),
    ("a store in a folder input", ["{folder}"], ["--checkpoint", "{folder}/store"], "lies inside"),
    ("--stats-json over the input", ["{jsonl}"], ["--stats-json", "{jsonl}"], "is"),
]


@pytest.mark.parametrize(("what", "inputs", "options", "said"), LOCAL_CASES, ids=[case[0] for case in LOCAL_CASES])
def test_an_output_or_store_over_a_local_input_is_refused_and_the_input_kept(tmp_path, what, inputs, options, said):
    """The local refusal held only for the same resolved file; now also for an output inside a
    folder input, one a glob input matches, a store holding an input, and --stats-json."""
    root = tmp_path / "in"
    root.mkdir()
    places = {name: str(path) for name, path in _local_inputs(root).items()}
    os.symlink(places["csv"], tmp_path / "link.csv")
    places.update(root=str(root), link=str(tmp_path / "link.csv"))
    before = _tree(root)
    given = [text.format(**places) for text in options]
    output = [] if "-o" in given else ["-o", str(tmp_path / "out" / "scores.parquet")]
    (tmp_path / "out").mkdir()
    args = ["score", *(text.format(**places) for text in inputs), *output, *given, *COMMON]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {given[0]} ") and f" {said} the input " in line, line
    assert _tree(root) == before
    assert list((tmp_path / "out").iterdir()) == []


# ----------------------------------------------------------------------------- review and the quality commands


@pytest.fixture
def scored_files(tmp_path) -> dict[str, str]:
    old = write_scored(tmp_path / "old.parquet", random_records(1, 20))
    new = write_scored(tmp_path / "new.parquet", random_records(2, 20))
    gold = tmp_path / "gold.jsonl"
    gold.write_text(json.dumps({"id": "r0", "labels": {"urgent": "true"}}) + "\n")
    records = tmp_path / "records"
    records.mkdir()
    (records / "part-0.jsonl").write_text(json.dumps({"id": "r0", "state": "x"}) + "\n")
    store = tmp_path / "store"
    store.mkdir()
    return {"old": str(old), "new": str(new), "gold": str(gold), "records": str(records), "store": str(store)}


QUALITY_CASES = [
    ("review -o over the scored file", ["review", "{old}", "-o", "{old}"], "-o", "is"),
    ("review -o inside --records", ["review", "{old}", "--records", "{records}", "-o", "{records}/r.jsonl"], "-o",
     "lies inside"),
    ("review --config-out over --exclude", ["review", "{old}", "-o", "{new}.json", "--exclude", "{gold}",
                                            "--config-out", "{gold}"], "--config-out", "is"),
    ("calibrate -o over --gold", ["calibrate", "{old}", "--gold", "{gold}", "-o", "{gold}"], "-o", "is"),
    ("eval --json over --gold", ["eval", "{old}", "--gold", "{gold}", "--json", "{records}/../gold.jsonl"], "--json",
     "is"),
    ("eval --report over the scored file", ["eval", "{old}", "--gold", "{gold}", "--report", "{old}"], "--report",
     "is"),
    ("compare --json over NEW", ["compare", "{old}", "{new}", "--json", "{new}"], "--json", "is"),
    ("compare --report over OLD", ["compare", "{old}", "{new}", "--report", "{old}"], "--report", "is"),
    ("train-head -o inside the store", ["train-head", "{store}", "--gold", "{gold}", "-o", "{store}/head"], "-o",
     "lies inside"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "args", "option", "said"), QUALITY_CASES, ids=[case[0] for case in QUALITY_CASES])
def test_review_and_the_quality_commands_never_write_over_their_inputs(
    tmp_path, scored_files, what, args, option, said
):
    before = _tree(tmp_path)
    result = runner.invoke(app, [arg.format(**scored_files) for arg in args])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {option} ") and f" {said} the input " in line, line
    assert _tree(tmp_path) == before


def test_a_review_beside_its_input_is_written(tmp_path, scored_files):
    """The refusal is no wider than an overlap: a review file beside the scored file is written."""
    out = tmp_path / "review.jsonl"
    result = runner.invoke(app, ["review", scored_files["old"], "-o", str(out), "--limit", "2"])
    assert result.exit_code == 0, result.output
    assert out.exists()
