"""Every option that names a location takes a URI, or refuses one in a line (issue 56.3). The
commands' options are walked from the Typer app itself: each that names a table, a file or a
folder carries its decision (the marker of its callback, `cli/options.location`) and is fed an
s3:// URI on moto's server, so an option added later without a decision, or typed `Path` (which
folds `s3://b/k` into `s3:/b/k`), fails here. Then `clef review --records s3://bucket/prefix/`
end to end, the case that was broken."""

from __future__ import annotations

import json
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.cli.options import LOCAL_ONLY, TAKES_URI
from clef_cli.inputs import sources
from clef_cli.locations import object_store

from .support.helpers import TINY_MODEL, write_jsonl

runner = CliRunner()
BUCKET = "clef-uri-options"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
COMMON = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--hidden-states", "drop", "--device", "cpu"]
MANGLED = re.compile(r"s3:/(?!/)")
"""An s3:// URI folded by a `Path` into one slash."""

NOT_LOCATIONS = {
    "score": {"--revision", "--columns", "--state-columns", "--keep-columns", "--device", "--ray-address"}
    | {"--allowed-media-domains"},
    "inspect-spans": {"--revision", "--id", "--columns", "--state-columns", "--allowed-media-domains"},
    "eval": {"--gold-column", "--by"},
    "calibrate": {"--gold-column"},
    "train-head": {"--revision", "--device"},
    "review": {"--questions", "--url-prefix", "--media-url-prefix"},
}
"""The options typed as text that name no location (a revision, column names, hosts, ids): each
decided here, so a new text option without a decision fails `test_every_location_option_...`."""


def _base(annotation: object) -> object:
    """`Path` of `Path | None`, `str` of `list[str] | None`, and so on."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    if typing.get_origin(annotation) in (list, tuple):
        annotation = typing.get_args(annotation)[0]
    return annotation


def walked() -> list[tuple[str, str, object]]:
    """(command, option, click parameter) of every command, `checkpoint info` included; an option by
    its long name, an argument by its name in capitals."""
    found = []

    def walk(command: object, path: list[str]) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])
        if not hasattr(command, "commands"):
            for param in command.params:
                name = max(param.opts, key=len) if param.param_type_name == "option" else param.name.upper()
                found.append((" ".join(path), name, param))

    walk(typer.main.get_command(app), [])
    return found


def decision(param: object) -> str | None:
    return getattr(param.callback, "location", None)


def test_every_location_option_has_decided_whether_it_takes_a_uri():
    """No option is typed `Path`; each text option is a location with its decision (an option's
    metavar then says PATH|URI or DIR|URI exactly when it takes one) or listed as none."""
    undecided, typed_path, metavars = [], [], []
    for command, name, param in walked():
        base = _base(param.type_descriptor.annotation)
        kind = decision(param)
        if base is Path:
            typed_path.append(f"{command} {name}")
        elif kind is None and base is str and name not in NOT_LOCATIONS.get(command, set()):
            undecided.append(f"{command} {name}")
        uri_metavar = "URI" in (param.metavar or "")
        if kind is not None and param.param_type_name == "option" and uri_metavar != (kind == TAKES_URI):
            metavars.append(f"{command} {name}: {param.metavar} ({kind})")
    assert not typed_path, f"typed Path (s3://b/k would read as s3:/b/k): {typed_path}"
    assert not undecided, f"text options with no decision (cli/options.location) nor in NOT_LOCATIONS: {undecided}"
    assert not metavars, metavars
    assert len([1 for *_, param in walked() if decision(param)]) >= 40  # the walk reached every command


# ----------------------------------------------------------------------------- fed a URI


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    """The command, with `{uri}` where the option under test takes its s3:// URI; `{name}` for the
    local files (`made`) and `{out}` for a local output folder."""
    reads: str | None = None
    """The key of the object the option reads (in/NAME: the local file NAME, uploaded)."""
    writes: str | None = None
    """The key the option writes."""
    store: bool = False
    """A store in the bucket (s3://.../store/) is made first, by a `clef score --checkpoint`."""


IN, OUT, STORE = f"s3://{BUCKET}/in/", f"s3://{BUCKET}/out/", f"s3://{BUCKET}/store/"
SCORE = ("score", "{records}", "--questions", "{questions}", "-o", "{out}/o.parquet", *COMMON)
INSPECT = ("inspect-spans", "{records}", "--questions", "{questions}", "--model", str(TINY_MODEL))
EVAL = ("eval", "{scored}", "--gold", "{gold}")
CALIBRATE = ("calibrate", "{scored}", "--gold", "{gold}", "-o", "{out}/c.json", "--method", "global")
TRAIN = ("train-head", "{checkpoint}", "--gold", "{gold}", "-o", "{out}/head", "--records", "{records}")
TRAIN += ("--questions", "{questions}", "--quiet", "--force", "--folds", "2", "--epochs", "1", "--device", "cpu")
REVIEW = ("review", "{scored}", "-o", "{out}/r.json", "--format", "label-studio")
COMPARE = ("compare", "{scored}", "{scored}")


def swapped(argv: tuple[str, ...], old: str, new: str = "{uri}") -> tuple[str, ...]:
    assert old in argv, (argv, old)
    return tuple(new if part == old else part for part in argv)


CASES = {
    ("score", "INPUTS"): Case(swapped(SCORE, "{records}"), reads="in/records.jsonl"),
    ("score", "--output"): Case(
        (*swapped(SCORE, "{out}/o.parquet"), "--checkpoint", "{out}/ck"), writes="out/o.parquet"
    ),
    ("score", "--model"): Case((*SCORE, "--model", "{uri}")),
    ("score", "--questions"): Case(swapped(SCORE, "{questions}"), reads="in/questions.json"),
    ("score", "--checkpoint"): Case((*SCORE, "--checkpoint", STORE), writes="store/"),
    ("score", "--cache-dir"): Case((*SCORE, "--checkpoint", STORE, "--cache-dir", "{uri}")),
    ("score", "--rehead"): Case((*SCORE, "--checkpoint", "{checkpoint}", "--rehead", "{uri}")),
    ("score", "--calibration"): Case((*SCORE, "--calibration", "{uri}"), reads="in/cal.json"),
    ("score", "--stats-json"): Case((*SCORE, "--stats-json", "{uri}"), writes="out/stats.json"),
    ("score", "--media-root"): Case(
        (*swapped(SCORE, "{records}", IN + "records.jsonl"), "--media-root", IN), reads="in/records.jsonl"
    ),
    ("inspect-spans", "RECORD_FILE"): Case(swapped(INSPECT, "{records}"), reads="in/records.jsonl"),
    ("inspect-spans", "--model"): Case((*INSPECT, "--model", "{uri}")),
    ("inspect-spans", "--questions"): Case(swapped(INSPECT, "{questions}"), reads="in/questions.json"),
    ("inspect-spans", "--media-root"): Case(
        (*swapped(INSPECT, "{records}", IN + "records.jsonl"), "--media-root", IN), reads="in/records.jsonl"
    ),
    ("eval", "SCORED"): Case(swapped(EVAL, "{scored}"), reads="in/scored.parquet"),
    ("eval", "--gold"): Case(swapped(EVAL, "{gold}"), reads="in/gold.jsonl"),
    ("eval", "--json"): Case((*EVAL, "--json", "{uri}"), writes="out/metrics.json"),
    ("eval", "--report"): Case((*EVAL, "--report", "{uri}"), writes="out/report.html"),
    ("eval", "--calibration"): Case((*EVAL, "--calibration", "{uri}"), reads="in/cal.json"),
    ("calibrate", "SCORED"): Case(swapped(CALIBRATE, "{scored}"), reads="in/scored.parquet"),
    ("calibrate", "--output"): Case(swapped(CALIBRATE, "{out}/c.json"), writes="out/c.json"),
    ("calibrate", "--gold"): Case(swapped(CALIBRATE, "{gold}"), reads="in/gold.jsonl"),
    ("train-head", "CHECKPOINT"): Case(swapped(TRAIN, "{checkpoint}", STORE), store=True),
    ("train-head", "--gold"): Case(swapped(TRAIN, "{gold}"), reads="in/gold.jsonl"),
    ("train-head", "--output"): Case(swapped(TRAIN, "{out}/head")),
    ("train-head", "--model"): Case((*TRAIN, "--model", "{uri}")),
    ("train-head", "--base-head"): Case((*TRAIN, "--base-head", "{uri}")),
    ("train-head", "--scored"): Case((*TRAIN, "--scored", "{uri}"), reads="in/scored.parquet"),
    ("train-head", "--records"): Case(swapped(TRAIN, "{records}"), reads="in/records.jsonl"),
    ("train-head", "--questions"): Case(swapped(TRAIN, "{questions}"), reads="in/questions.json"),
    ("review", "SCORED"): Case(swapped(REVIEW, "{scored}"), reads="in/scored.parquet"),
    ("review", "--output"): Case(swapped(REVIEW, "{out}/r.json"), writes="out/r.json"),
    ("review", "--exclude"): Case((*REVIEW, "--exclude", "{uri}"), reads="in/gold.jsonl"),
    ("review", "--records"): Case((*REVIEW, "--records", f"s3://{BUCKET}/tickets/"), reads="tickets/part-0.jsonl"),
    ("review", "--document-root"): Case((*REVIEW, "--document-root", "{uri}")),
    ("review", "--media-root"): Case((*REVIEW, "--media-root", "{uri}")),
    ("review", "--config-out"): Case((*REVIEW, "--config-out", "{uri}"), writes="out/config.xml"),
    ("compare", "OLD"): Case(swapped(COMPARE, "{scored}", "{uri}"), reads="in/scored.parquet"),
    ("compare", "NEW"): Case(("compare", "{scored}", "{uri}"), reads="in/scored.parquet"),
    ("compare", "--json"): Case((*COMPARE, "--json", "{uri}"), writes="out/drift.json"),
    ("compare", "--report"): Case((*COMPARE, "--report", "{uri}"), writes="out/drift.html"),
    ("checkpoint info", "DIRECTORY"): Case(("checkpoint", "info", STORE), store=True),
    ("checkpoint info", "--cache-dir"): Case(("checkpoint", "info", "{checkpoint}", "--cache-dir", "{uri}")),
    ("checkpoint prune", "DIRECTORY"): Case(("checkpoint", "prune", STORE, "--keep-runs", "1"), store=True),
    ("checkpoint prune", "--cache-dir"): Case(
        ("checkpoint", "prune", "{checkpoint}", "--keep-runs", "1", "--cache-dir", "{uri}")
    ),
    ("checkpoint repair", "DIRECTORY"): Case(("checkpoint", "repair", STORE, "--dry-run"), store=True),
    ("checkpoint unclaim", "DIRECTORY"): Case(("checkpoint", "unclaim", STORE), store=True),
}
"""One run per location option; its expected outcome is the option's own decision."""

LOCATIONS = [(command, name, decision(param)) for command, name, param in walked() if decision(param)]


def state(number: int) -> str:
    return f"ticket {number}: the printer {'is on fire' if number % 2 else 'works'}"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Local inputs of every command, made once: 6 text records (their questions in a file), their
    scores with a local checkpoint, gold labels and a calibration fitted to them."""
    folder = tmp_path_factory.mktemp("made")
    records = [{"id": f"r{n}", "state": state(n)} for n in range(6)]
    files = {"records": write_jsonl(folder / "records.jsonl", records), "questions": folder / "questions.json"}
    files["questions"].write_text(json.dumps(QUESTIONS))
    files["scored"], files["checkpoint"] = folder / "scored.parquet", folder / "ckpt"
    argv = ["score", str(files["records"]), "--questions", str(files["questions"]), "-o", str(files["scored"])]
    scored = runner.invoke(app, [*argv, "--checkpoint", str(files["checkpoint"]), *COMMON])
    assert scored.exit_code == 0, scored.output
    gold = [{"id": f"r{n}", "labels": {"urgent": "true" if n % 2 else "false"}} for n in range(6)]
    files["gold"] = write_jsonl(folder / "gold.jsonl", gold)
    files["cal"] = folder / "cal.json"
    fitted = runner.invoke(
        app, ["calibrate", str(files["scored"]), "--gold", str(files["gold"]), "-o", str(files["cal"])]
    )
    assert fitted.exit_code == 0, fitted.output
    return files


@pytest.fixture
def s3(store_bucket, made, tmp_path, monkeypatch):
    """The bucket holding a copy of every local input under in/; a bucket store's cache in tmp_path."""
    object_store.forget()
    monkeypatch.setattr(sources, "_copies", {})  # each test reads its objects again
    monkeypatch.setattr(sources, "_copy_folder", [])
    monkeypatch.setenv("CLEF_CACHE_DIR", str(tmp_path / "cache"))
    for path in made.values():
        if path.is_file():
            store_bucket.upload_file(str(path), BUCKET, f"in/{path.name}")
    store_bucket.upload_file(str(made["records"]), BUCKET, "tickets/part-0.jsonl")  # a prefix of records only
    return store_bucket


def keys(client, prefix: str) -> list[str]:
    return [item["Key"] for item in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


@pytest.mark.parametrize(("command", "name", "kind"), LOCATIONS, ids=[f"{c} {n}" for c, n, _ in LOCATIONS])
def test_every_location_option_reads_a_uri_or_refuses_it_in_one_line(s3, proxy, made, tmp_path, command, name, kind):
    """Given an s3:// URI, an option that takes one does the thing (reads the object, or writes
    it); one that cannot refuses it: exit 2, one line naming the option and the URI as given.
    Never `s3:/` (a URI folded by a Path)."""
    case = CASES.get((command, name))
    assert case is not None, f"{command} {name} names a location: add its case to CASES"
    uri = f"s3://{BUCKET}/{case.reads or case.writes or 'elsewhere/x'}"
    local = {key: str(path) for key, path in made.items()}
    argv = [part.format(uri=uri, out=tmp_path, **local) for part in case.argv]
    if case.store:  # a store in the bucket, made by a scoring run as a night makes it
        first = (*SCORE[:4], "-o", str(tmp_path / "first.parquet"), *COMMON, "--checkpoint", STORE)
        made_store = runner.invoke(app, [part.format(out=tmp_path, **local) for part in first])
        assert made_store.exit_code == 0, made_store.output
    proxy.clear()
    result = runner.invoke(app, argv)
    said = result.stdout + result.stderr
    assert not MANGLED.search(said), said
    if kind == LOCAL_ONLY:
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1, (argv, result.output)
        assert name in lines[0] and uri in lines[0], lines
        return
    assert kind == TAKES_URI
    assert result.exit_code == 0, (argv, result.output)
    if case.reads:
        assert proxy.count("GET", f"/{BUCKET}/{case.reads}"), (argv, proxy.requests)
    if case.writes:
        assert keys(s3, case.writes), (argv, keys(s3, ""))


# ----------------------------------------------------------------------------- review --records


def review(scored: str, records: str, output: Path) -> str:
    result = runner.invoke(app, ["review", scored, "--records", records, "-o", str(output)])
    assert result.exit_code == 0, result.output
    assert "not found" not in result.stderr and "pass --records" not in result.stderr, result.stderr
    return output.read_text()


def test_review_reads_its_records_from_a_bucket_prefix_as_from_the_local_file(s3, made, tmp_path):
    """`clef review SCORED --records s3://bucket/prefix/ -o out.csv` (the scored file local or in
    the bucket) writes what the local records file gives, and a Label Studio file shows each
    record's text read from the bucket: the URI is neither folded into `s3:/` nor missed."""
    prefix = f"s3://{BUCKET}/tickets/"
    for name in ("review.csv", "review.json"):
        local = review(str(made["scored"]), str(made["records"]), tmp_path / f"local-{name}")
        for scored in (str(made["scored"]), f"{IN}scored.parquet"):
            assert review(scored, prefix, tmp_path / name) == local, (name, scored)
    states = {task["data"]["id"]: task["data"]["state"] for task in json.loads(local)}
    assert states == {f"r{n}": state(n) for n in range(6)}


# ----------------------------------------------------------------------------- read once


def test_a_run_lists_each_input_once_and_reads_its_questions_and_calibration_once(s3, proxy, made, tmp_path):
    """A run is planned once (job/plan.py): the bucket prefix it scores is listed once, into the
    list every stage reads (the first window, the columns, the records, the output's schema), and
    its --questions and --calibration objects are fetched and read once."""
    questions, calibration = f"s3://{BUCKET}/in/questions.json", f"s3://{BUCKET}/in/cal.json"
    output = tmp_path / "scored.parquet"
    argv = ["score", f"s3://{BUCKET}/tickets/", "--questions", questions, "--calibration", calibration]
    argv += ["-o", str(output)]
    refused = runner.invoke(app, [*argv, "--checkpoint", str(tmp_path / "ckpt"), "--keep-columns", "id", *COMMON])
    assert refused.exit_code == 2, refused.output  # id is clef's own column: refused before a request
    assert proxy.requests == [], proxy.requests
    result = runner.invoke(app, [*argv, "--checkpoint", str(tmp_path / "ckpt"), *COMMON])
    assert result.exit_code == 0, result.output
    listings = [path for method, path in proxy.requests if method == "GET" and "prefix=tickets/" in path]
    assert len([path for path in listings if "max-keys=1&" not in path]) == 1, proxy.requests  # 3 before
    probes = [path for method, path in proxy.requests if method == "HEAD" and path == f"/{BUCKET}/tickets"]
    assert len(listings) == 2 and len(probes) == 1, proxy.requests  # with what tells a folder: once
    assert proxy.count("GET", "/in/questions.json") == 1, proxy.requests
    assert proxy.count("GET", "/in/cal.json") == 1, proxy.requests
