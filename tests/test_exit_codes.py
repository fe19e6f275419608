"""Every command's exit codes are the README's: its table is parsed here and each command's error
paths are run through the CLI, so the table and the code cannot drift apart. A reader that closes
the pipe early (`| head -1`) ends a command quietly with 0."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.cli import errors as cli_errors

from .support.helpers import FIXTURES, SAMPLE_DATA, TINY_MODEL, write_jsonl
from .support.scored_files import random_records, write_scored

runner = CliRunner()
README = Path(__file__).parent.parent / "README.md"
MEANINGS = {
    "success": "success",
    "fatal": "fatal error",
    "usage": "usage error",
    "records_failed": "some records failed",
    "gate": "gate refused",
    "drift": "PSI exceeded",
    "interrupted": "interrupted",
}
"""A short name for each row of the table -> words its meaning holds."""


def readme_codes() -> dict[str, int]:
    """The README's exit-code table (under "Exit codes, the same for every command"), by meaning."""
    text = README.read_text(encoding="utf-8").split("Exit codes, the same for every command", 1)[1]
    rows = re.findall(r"^\| `(\d+)` \| (.+?) \|$", text.split("\n\n", 2)[1], flags=re.MULTILINE)
    assert rows, "the README's exit-code table was not found"
    codes: dict[str, int] = {}
    for name, words in MEANINGS.items():
        found = [int(code) for code, meaning in rows if words in meaning]
        assert len(found) == 1, f"the README's table has {len(found)} rows saying {words!r}"
        codes[name] = found[0]
    assert sorted(codes.values()) == sorted(int(code) for code, _ in rows), "a row of the table has no test"
    return codes


CODES = readme_codes()


def test_the_table_is_the_error_boundarys_and_the_help_says_the_same():
    assert CODES == {
        "success": cli_errors.EXIT_OK,
        "fatal": cli_errors.EXIT_FATAL,
        "usage": cli_errors.EXIT_USAGE,
        "records_failed": cli_errors.EXIT_RECORDS_FAILED,
        "gate": cli_errors.EXIT_GATE_REFUSED,  # train-head's refusal: tests/test_train_head.py runs it
        "drift": cli_errors.EXIT_DRIFT,
        "interrupted": cli_errors.EXIT_INTERRUPTED,
    }
    shown = " ".join(runner.invoke(app, ["--help"]).stdout.split())
    for code in CODES.values():
        assert re.search(rf"\b{code} [a-z]", shown), f"clef --help does not list exit code {code}"


def can_write_in(folder: Path) -> bool:
    probe = folder / f".probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.touch()
    except OSError:
        return False
    probe.unlink()
    return True


def unwritable_folder(folder: Path) -> Path:
    """A folder no file can be made in: one without write permission, or where that does not stop
    root, a filesystem root cannot write in either (sysfs)."""
    folder.mkdir()
    folder.chmod(0o555)
    if not can_write_in(folder):
        return folder
    if Path("/sys").is_dir() and not can_write_in(Path("/sys")):
        return Path("/sys")
    pytest.skip("no folder here refuses this user a new file")


def character_device(folder: Path) -> Path:
    """A node like /dev/null, of our own where root may make one (a failing run never replaces the
    machine's), else /dev/null itself."""
    path = folder / "null-device"
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except OSError:
        return Path("/dev/null")
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("exit-codes")
    (folder / "not-a-checkpoint").mkdir()
    (folder / "not.parquet").write_text('{"id": "a"}\n')
    (folder / "empty-head").mkdir()
    store = folder / "store.ckpt"  # a checkpoint with no shards: enough to open
    store.mkdir()
    (store / "manifest.json").write_text(json.dumps({"format_version": 2, "model": {"id": "x"}, "settings": {}}))
    records = [json.loads(line) for line in Path(RECORDS).read_text().splitlines()[:2]]
    dropped = folder / "dropped.parquet"  # a real store of two records, kept without hidden states
    made = runner.invoke(app, ["score", RECORDS, "-o", str(dropped), "--model", MODEL, "--limit", "2",
                               "--workers", "0", "--hidden-states", "drop", "--quiet"])  # fmt: skip
    assert made.exit_code == 0, made.output
    return {
        "folder": folder,
        "invalid": write_jsonl(folder / "invalid.jsonl", [{"id": "x"}, {"id": "y", "state": "s", "questions": {}}]),
        "old": write_scored(folder / "old.parquet", random_records(1, 200)),
        "new": write_scored(folder / "new.parquet", random_records(2, 200)),
        "store": store,
        "not_checkpoint": folder / "not-a-checkpoint",
        "empty": folder / "empty-head",
        "kept": write_jsonl(folder / "kept.jsonl", [record | {"source": "web"} for record in records]),
        "dropped": Path(f"{dropped}.ckpt"),
        "device": character_device(folder),
    }


RECORDS = str(SAMPLE_DATA / "records.jsonl")
MODEL = str(TINY_MODEL)
DENSE = str(FIXTURES / "tiny-clef-dense")
GOLD = str(SAMPLE_DATA / "posts_gold.jsonl")
CASES = [
    # (what goes wrong, the command line with {placeholders}, the table's row)
    ("an unknown option", ["score", RECORDS, "-o", "{out}", "--nope"], "usage"),
    ("a bad choice", ["score", RECORDS, "-o", "{out}", "--layout", "tall"], "usage"),
    ("an output that is not Parquet", ["score", RECORDS, "-o", "{folder}/o.csv"], "usage"),
    ("a missing input", ["score", "{folder}/missing.jsonl", "-o", "{out}", "--model", MODEL], "usage"),
    ("--rehead at a file", ["score", RECORDS, "-o", "{out}", "--rehead", "{old}"], "usage"),
    ("--rehead at an empty folder", ["score", RECORDS, "-o", "{out}", "--rehead", "{empty}"], "usage"),
    ("--rehead without a store", ["score", RECORDS, "-o", "{out}", "--rehead", MODEL], "usage"),
    ("a model that is not there", ["score", RECORDS, "-o", "{out}", "--model", "{folder}/no"], "usage"),
    ("a missing questions file", ["score", RECORDS, "-o", "{out}", "--model", MODEL, "--questions", "{folder}/q.json"],
     "usage"),
    ("--engine vllm without vLLM", ["score", RECORDS, "-o", "{out}", "--model", MODEL, "--engine", "vllm"], "usage"),
    ("--engine vllm without vLLM, dry run", ["score", RECORDS, "-o", "{out}", "--model", MODEL, "--engine", "vllm",
     "--dry-run"], "usage"),
    ("a fractional KV cache", ["score", RECORDS, "-o", "{out}", "--model", MODEL, "--engine", "vllm",
     "--cpu-kv-cache-gib", "1.5"], "usage"),
    ("a negative --max-model-len", ["score", RECORDS, "-o", "{out}", "--model", MODEL, "--engine", "vllm",
     "--max-model-len", "0"], "usage"),
    ("every record invalid", ["score", "{invalid}", "-o", "{out}", "--model", MODEL, "--workers", "0"],
     "records_failed"),
    # refusals that used to run first (issue 45.4): each one line, nothing written
    ("--keep-columns naming a column twice", ["score", "{kept}", "-o", "{out}", "--model", MODEL, "--workers", "0",
     "--keep-columns", "source,source"], "usage"),
    ("--checkpoint at a bucket URI without a bucket", ["score", RECORDS, "-o", "{out}", "--model", MODEL, "--limit",
     "1", "--workers", "0", "--checkpoint", "s3:///ck"], "usage"),
    ("--checkpoint in a missing folder", ["score", RECORDS, "-o", "{out}", "--model", MODEL, "--limit", "1",
     "--workers", "0", "--checkpoint", "{folder}/nodir/sub/ck"], "usage"),
    ("--checkpoint in a folder that cannot be written", ["score", RECORDS, "-o", "{out}", "--model", MODEL,
     "--checkpoint", "{unwritable}/ck"], "usage"),
    ("--checkpoint at a file", ["score", RECORDS, "-o", "{out}", "--model", MODEL,
     "--checkpoint", "{folder}/not.parquet"], "usage"),
    # issue 51.4: an unset variable in a cron line (was exit 1, or a folder named ' ')
    ("--checkpoint ''", ["score", RECORDS, "-o", "{out}", "--model", MODEL, "--checkpoint", ""], "usage"),
    ("--checkpoint ' '", ["score", RECORDS, "-o", "{out}", "--model", MODEL, "--checkpoint", " "], "usage"),
    ("a store made with another model", ["score", RECORDS, "-o", "{out}", "--model", DENSE,
     "--checkpoint", "{dropped}"], "usage"),
    ("a GPU this machine lacks", ["score", RECORDS, "-o", "{out}", "--model", MODEL, "--device", "cuda:99"], "usage"),
    ("an empty --model folder", ["score", RECORDS, "-o", "{out}", "--model", "{empty}"], "usage"),
    ("-o a character device, no --checkpoint", ["score", RECORDS, "-o", "{device}", "--model", MODEL], "usage"),
    ("-o a character device", ["score", RECORDS, "-o", "{device}", "--checkpoint", "{dropped}", "--model", MODEL,
     "--limit", "2", "--hidden-states", "drop", "--workers", "0", "--quiet"], "success"),  # from the store
    ("-o a character device, --checkpoint a file: URI", ["score", RECORDS, "-o", "{device}", "--checkpoint",
     "file://{dropped}", "--model", MODEL, "--limit", "2", "--hidden-states", "drop", "--workers", "0", "--quiet"],
     "success"),  # the store's own folder (was a local folder `file:` made where clef ran)
    ("a missing record file", ["inspect-spans", "{folder}/missing.jsonl"], "usage"),
    ("a scored file that is not Parquet", ["eval", "{folder}/not.parquet", "--gold", GOLD], "usage"),
    ("no gold", ["eval", "{old}"], "usage"),
    ("a missing scored file", ["calibrate", "{folder}/no.parquet", "--gold", GOLD, "-o", "{folder}/c.json"], "usage"),
    ("a scored file that is not Parquet", ["review", "{folder}/not.parquet", "-o", "{folder}/r.csv"], "usage"),
    ("a missing scored file", ["compare", "{folder}/missing.parquet", "{old}"], "usage"),
    ("drift above the limit", ["compare", "{old}", "{new}", "--fail-above-psi", "0"], "drift"),
    ("no drift limit passed", ["compare", "{old}", "{old}"], "success"),
    ("not a checkpoint", ["train-head", "{not_checkpoint}", "--gold", GOLD, "-o", "{folder}/head"], "usage"),
    ("a store without hidden states, no --records", ["train-head", "{dropped}", "--gold", GOLD, "-o", "{folder}/head"],
     "usage"),
    ("not a checkpoint", ["checkpoint", "info", "{not_checkpoint}"], "usage"),
    ("a missing checkpoint", ["checkpoint", "info", "{folder}/missing.ckpt"], "usage"),
    ("not a checkpoint", ["checkpoint", "prune", "{not_checkpoint}", "--keep-runs", "1"], "usage"),
    ("--keep-runs 0", ["checkpoint", "prune", "{store}", "--keep-runs", "0"], "usage"),
    ("--older-than 0", ["checkpoint", "prune", "{store}", "--older-than", "0"], "usage"),
    ("an empty store", ["checkpoint", "info", "{store}"], "success"),
    ("an unknown command", ["nosuchcommand"], "usage"),
]  # fmt: skip


def tree(*folders: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under `folders`, a file with its size and modification time (what a
    write changes; a folder's own time moves with the output's writability probe, which leaves
    nothing behind)."""
    found = {}
    for folder in folders:
        for path in [folder, *folder.rglob("*")]:
            stat = path.lstat()
            found[str(path)] = (stat.st_size, stat.st_mtime_ns) if path.is_file() else (0, 0)
    return found


@pytest.mark.parametrize(("what", "command", "row"), CASES, ids=[f"{case[1][0]}: {case[0]}" for case in CASES])
def test_each_commands_error_paths_exit_as_the_readme_says(files, tmp_path, monkeypatch, what, command, row):
    """A refused run (exit 2) leaves the filesystem as it was: no checkpoint, lock, output or log
    beside the output, the inputs or the store it was pointed at (issue 36.2), nor in the folder it
    ran from; and says why in one line (click's own usage errors have their usage block)."""
    monkeypatch.delenv("CLEF_VLLM_PYTHON", raising=False)  # these cases are the runs without vLLM
    monkeypatch.chdir(tmp_path)  # a relative path made by the run shows here
    placeholders = {**files, "out": tmp_path / "o.parquet"}
    if "{unwritable}" in " ".join(command):
        placeholders["unwritable"] = unwritable_folder(files["folder"] / f"read-only-{uuid.uuid4().hex[:6]}")
    args = [part.format(**placeholders) for part in command]
    before = tree(files["folder"], tmp_path, SAMPLE_DATA)
    result = runner.invoke(app, args)
    assert result.exit_code == CODES[row], f"{what}: {result.output}"
    assert "Traceback" not in result.output
    if row == "usage":  # nothing was done: no output, no checkpoint, nothing changed anywhere
        lines = result.stderr.splitlines()
        if lines[0].startswith("Usage: "):  # click's parser: usage, hint, a blank line, the error
            assert len(lines) == 4 and lines[-1].startswith("Error: "), result.stderr
        else:
            assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert list(tmp_path.iterdir()) == []
        assert tree(files["folder"], tmp_path, SAMPLE_DATA) == before
    if "{device}" in command:  # streamed into, never replaced, nothing made beside it
        assert stat.S_ISCHR(files["device"].lstat().st_mode)
        assert list(tmp_path.iterdir()) == []
        assert not list(files["device"].parent.glob(f"{files['device'].name}?*"))


def test_a_store_made_with_another_model_is_refused_in_words(files, tmp_path):
    """Not ~900 characters of hashes offering --restart first (which would wipe a shared nightly
    store): what differs in words, the model that made the store, another folder before --restart."""
    store = files["dropped"]
    result = runner.invoke(app, ["score", RECORDS, "-o", str(tmp_path / "o.parquet"), "--model", DENSE,
                                 "--checkpoint", str(store)])  # fmt: skip
    assert result.exit_code == CODES["usage"]
    (line,) = result.stderr.splitlines()
    made_with = str(TINY_MODEL.resolve())
    assert line.startswith(f"error: checkpoint {store} was scored with {made_with}; this run differs in ")
    for word in ("family (omni there, dense here)", "config", "weights", "head"):
        assert word in line
    assert line.index("--checkpoint to give this run another folder") < line.index("--restart")
    assert not re.search(r"[0-9a-f]{16}", line), "a hash is no word"
    assert len(line) - len(str(store)) - len(made_with) <= 3 * 80 - 2 * 20  # 3 lines, with paths of 20


def test_the_engine_and_the_dtype_are_named_with_their_values():
    from clef_cli.store.manifest import differing_fields, mismatch_message

    stored = {"model": {"id": "a", "path": "/models/a", "weights": "w"}, "settings": {"dtype": "bfloat16"}}
    current = {"model": {"id": "b", "path": "/elsewhere/a", "weights": "w"}, "settings": {"dtype": "float32",
               "engine": "vllm"}}  # fmt: skip
    assert differing_fields(stored, current) == ["dtype (bfloat16 there, float32 here)", "engine (hf there, vllm here)"]
    message = mismatch_message(Path("ck"), stored, current)
    assert "/models/a" in message and "/elsewhere" not in message  # the path is for display: never a difference
    assert message.index("--engine hf") < message.index("--checkpoint") < message.index("--restart")


@pytest.mark.parametrize("columns", [("source", "source"), ("source", "record_key")], ids=["twice", "clef's own"])
def test_kept_columns_the_output_cannot_hold_are_refused_by_the_settings(tmp_path, columns):
    """The library's settings refuse them before any record is scored (a Parquet file has one
    column by each name), as the CLI does."""
    from clef_cli.errors import UsageError
    from clef_cli.job.settings import ScoreSettings

    settings = ScoreSettings([RECORDS], tmp_path / "o.parquet", model=MODEL, keep_columns=columns)
    with pytest.raises(UsageError, match="--keep-columns"):
        settings.validate()
    assert list(tmp_path.iterdir()) == []


def test_a_named_pipe_is_streamed_into_whatever_its_name(files, tmp_path):
    """docs/scoring.md: a named pipe is streamed into (no .parquet needed: it is no file), never
    replaced, with nothing left beside it."""
    import threading

    import pyarrow.parquet as pq

    pipe = tmp_path / "results"
    os.mkfifo(pipe)
    received: dict[str, bytes] = {}
    reader = threading.Thread(target=lambda: received.update(data=pipe.read_bytes()), daemon=True)
    reader.start()
    result = runner.invoke(
        app,
        [
            "score",
            RECORDS,
            "-o",
            str(pipe),
            "--checkpoint",
            str(files["dropped"]),
            "--model",
            MODEL,
            "--limit",
            "2",
            "--hidden-states",
            "drop",
            "--workers",
            "0",
            "--quiet",
        ],
    )  # fmt: skip, from the store: no model run
    if reader.is_alive() and result.exit_code != 0:  # nothing opened the pipe: let the reader go
        os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
    reader.join(timeout=60)
    assert result.exit_code == CODES["success"], result.output
    assert stat.S_ISFIFO(pipe.lstat().st_mode)
    assert pq.read_table(io.BytesIO(received["data"])).num_rows == 2
    assert [path.name for path in tmp_path.iterdir()] == ["results"]


def test_an_interrupt_exits_as_the_readme_says(files, monkeypatch):
    from clef_cli.store.checkpoint import Checkpoint

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Checkpoint, "info", interrupted)
    result = runner.invoke(app, ["checkpoint", "info", str(files["store"])])
    assert result.exit_code == CODES["interrupted"] and result.stderr.strip() == "interrupted"


PIPED = [["checkpoint", "info", "{store}"], ["checkpoint", "info", "{store}", "--json"], ["compare", "{old}", "{new}"]]


@pytest.mark.parametrize("command", PIPED)
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly_with_0(files, command):
    """`clef ... | head -1` under `set -o pipefail`: clef must not fail the pipeline (rich exited
    1, and with no word said). The pipe's reader is gone before clef writes its first byte."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "clef_cli", *(part.format(**files) for part in command)],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
        )  # fmt: skip
    finally:
        os.close(write)
    assert done.returncode == CODES["success"], done.stderr
    assert done.stderr == ""


def test_a_refusal_that_needs_the_open_store_removes_the_store_it_made(tmp_path):
    """Ray's fit and its nodes' view of the store can only be checked once the job is open: a
    UsageError then removes a store the run made with nothing committed, and keeps one that was
    there before."""
    from clef_cli.errors import UsageError
    from clef_cli.job.lifecycle import open_job
    from clef_cli.job.plan import plan_job
    from clef_cli.progress import Progress
    from tests.support.helpers import settings_for

    plan = plan_job(settings_for(tmp_path, limit=2, hidden_states="drop"))
    with pytest.raises(UsageError), open_job(plan, Progress(), "float32"):
        raise UsageError("the cluster cannot place this plan")
    assert sorted(path.name for path in tmp_path.iterdir()) == []
    plan.store.folder.mkdir()  # a store from before (empty: it is made on open)
    with open_job(plan, Progress(), "float32"):
        pass
    with pytest.raises(UsageError), open_job(plan, Progress(), "float32"):
        raise UsageError("the cluster cannot place this plan")
    assert plan.store.folder.is_dir()


# ----------------------------------------------------------------------------- mistakes of the whole job
# (issue 45: caught once from the first records, before the output or the store is made)


def whole_job_inputs(folder: Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    questions = json.dumps({"q": {"type": "noul"}})
    no_state = pa.table({"id": ["a", "b"], "text": ["s", "t"], "questions": [questions] * 2})
    pq.write_table(no_state, folder / "ns.parquet")
    pq.write_table(
        pa.table({"id": ["a"], "state": ["s"], "questions": [questions], "image": [["x.png"]]}), folder / "img.parquet"
    )
    rows = [{"id": "a", "state": {"text": "s"}}, {"id": "b", "state": {"n": 1}}]  # every row misses a key
    pq.write_table(pa.Table.from_pylist([row | {"questions": questions} for row in rows]), folder / "struct.parquet")
    quoted = '"' + questions.replace('"', '""') + '"'  # a CSV cell holding the questions' JSON
    return {
        "noq": write_jsonl(folder / "noq.jsonl", [{"id": "a", "state": "s"}, {"id": "b", "state": "t"}]),
        "nearq": write_jsonl(folder / "nearq.jsonl", [{"id": "a", "state": "s", "question": {"q": {"type": "noul"}}}]),
        "nostate": folder / "ns.parquet",
        "image": folder / "img.parquet",
        "struct": folder / "struct.parquet",
        "csv": _csv(folder / "tickets.csv", ["ticket_id,body,questions", "T-1,hello," + quoted]),
        **_damaged(folder),
        "tsv": _csv(folder / "tickets.tsv", ["ticket_id\tbody\tquestions", "T-1\thello\t" + quoted]),
    }  # fmt: skip


def _damaged(folder: Path) -> dict[str, Path]:
    """Compressed inputs a broken export leaves: cut short, not compressed at all, and cut short
    after more than the first window (found while the job keys its records, the store open)."""
    import base64
    import gzip

    def line(n: int, size: int) -> bytes:
        text = base64.b64encode(os.urandom(size)).decode()  # incompressible: the cut lands late
        return (json.dumps({"id": f"r{n}", "state": text, "questions": {"q": {"type": "noul"}}}) + "\n").encode()

    whole = gzip.compress(b"".join(line(n, 60) for n in range(4)))
    (folder / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (folder / "plain.jsonl.zst").write_bytes(b'{"id": "a"}\n')
    late = gzip.compress(b"".join(line(n, 15_000) for n in range(200)))  # 4 MB of JSON
    (folder / "late.jsonl.gz").write_bytes(late[: len(late) * 9 // 10])
    return {name: folder / f"{name}.jsonl.{kind}" for name, kind in (("cut", "gz"), ("plain", "zst"), ("late", "gz"))}


def _csv(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


WHOLE_JOB = [
    ("noq", [], "error: no questions: no 'questions' field in the first 2 records; give them in the records, "
     "or one schema for all with --questions FILE"),
    ("noq", ["--dry-run"], "error: no questions: no 'questions' field in the first 2 records"),
    ("nearq", [], "error: no questions: no 'questions' field in the first record (but 'question': did you mean "
     "'questions'?)"),
    ("nostate", [], "ns.parquet has no 'state' column (its columns: id, text, questions)"),
    ("image", [], "img.parquet: column 'image' is not a record field (did you mean 'images'?); rename it, map it "
     "(--columns images=image), or name it in --keep-columns"),
    ("struct", [], "struct.parquet: the Parquet struct column 'state' has nulls in the first 2 records (first "
     "state.n): a struct column gives every row the keys of every record"),
    ("csv", [], "tickets.csv has no 'state' column (its columns: ticket_id, body, questions)"),
    ("tsv", [], "tickets.tsv has no 'state' column (its columns: ticket_id, body, questions)"),
    ("csv", ["--columns", "state=text"], "/tickets.csv (mapped by --columns/--state-columns); its "
     "columns: ticket_id, body, questions"),  # named by its path as given
    ("csv", ["--columns", ""], "error: --columns '' names no column; give them, like --columns id=ticket_id"),
    ("csv", ["--state-columns", ","], "error: --state-columns ',' names no column"),
    # issue 51.4: a bare `OSError` (exit 1) that named no file
    ("cut", [], "cut.jsonl.gz is not a readable gzip file: "),
    ("plain", [], "plain.jsonl.zst is not a readable zstd file: "),
    ("late", [], "late.jsonl.gz is not a readable gzip file: "),
]  # fmt: skip


@pytest.mark.parametrize(("name", "extra", "message"), WHOLE_JOB, ids=[f"{c[0]}{' '.join(c[1])}" for c in WHOLE_JOB])
def test_a_mistake_of_the_whole_job_is_refused_once_before_anything_is_written(tmp_path, name, extra, message):
    """Each of these failed every record with the same message (or a 4-line one per row), after
    the output and the store were made; now: exit 2, one line, nothing written."""
    inputs = whole_job_inputs(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    result = runner.invoke(app, ["score", str(inputs[name]), "-o", str(run / "o.parquet"), "--model", MODEL,
                                 "--workers", "0", "--hidden-states", "drop", *extra])  # fmt: skip
    assert result.exit_code == CODES["usage"], result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr
    assert list(run.iterdir()) == []


def test_review_refuses_a_format_its_file_name_contradicts(files, tmp_path):
    """`clef review -o x.csv` wrote Label Studio JSON into x.csv; --format csv -o x.json the reverse."""
    for out, form in (("x.csv", "label-studio"), ("x.json", "csv"), ("x.jsonl", "argilla")):
        result = runner.invoke(app, ["review", str(files["old"]), "-o", str(tmp_path / out), "--format", form])
        assert result.exit_code == CODES["usage"], result.output
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert f"--format {form} writes a" in result.stderr and out in result.stderr
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- empty inputs (issue 51.1)


def empty_inputs(folder: Path) -> dict[str, Path]:
    """Each form an export that failed upstream takes: no record, whatever the format."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (folder / "zero.jsonl").write_bytes(b"")
    (folder / "blank.jsonl").write_text("\n  \n\n", encoding="utf-8")
    (folder / "header.csv").write_text("id,state,questions\n", encoding="utf-8")
    (folder / "zero.csv").write_bytes(b"")
    (folder / "none.json").write_text("[]\n", encoding="utf-8")
    empty = pa.table({"id": pa.array([], pa.string()), "state": pa.array([], pa.string())})
    pq.write_table(empty, folder / "none.parquet")
    return {name: folder / name for name in EMPTY}


EMPTY = ("zero.jsonl", "blank.jsonl", "header.csv", "zero.csv", "none.json", "none.parquet")


@pytest.mark.parametrize("name", EMPTY)
def test_an_empty_input_is_refused_and_yesterdays_output_stays(tmp_path, name):
    """A cron job whose export step failed silently wrote a 0-row output over yesterday's table
    (exit 0). Now: exit 2, one line naming the input as given, the old output untouched and no
    store made; `--allow-empty` writes the 0-row output for a job that means it."""
    import pyarrow.parquet as pq

    source = empty_inputs(tmp_path)[name]
    run = tmp_path / "run"
    run.mkdir()
    output = write_scored(run / "o.parquet", random_records(3, 5))
    before = tree(run)
    base = ["score", str(source), "-o", str(output), "--model", MODEL, "--workers", "0", "--hidden-states", "drop"]
    for extra in ([], ["--dry-run"]):
        result = runner.invoke(app, [*base, *extra])
        assert result.exit_code == CODES["usage"], result.output
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"error: no records in {source}: ") and "--allow-empty" in line, line
        assert tree(run) == before
    allowed = runner.invoke(app, [*base, "--allow-empty", "--quiet"])
    assert allowed.exit_code == CODES["success"], allowed.output
    assert pq.read_table(output).num_rows == 0


def test_a_hub_model_missing_from_the_cache_is_a_model_this_run_cannot_use(tmp_path, monkeypatch):
    """README's table: a `--model` this run cannot use is exit 2 (it was exit 1), one line,
    nothing written."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    run = tmp_path / "run"
    run.mkdir()
    result = runner.invoke(app, ["score", RECORDS, "-o", str(run / "o.parquet"), "--model", "nobody/clef-missing"])
    assert result.exit_code == CODES["usage"], result.output
    (line,) = result.stderr.strip().splitlines()
    assert "'nobody/clef-missing' is not in the local HF cache" in line
    assert list(run.iterdir()) == []
