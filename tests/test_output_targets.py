"""Every file clef writes, against every kind of target: a regular file is replaced atomically
(its permission bits kept), a new path created, a symlink's target written with the link kept, a
named pipe and a character device streamed into (never replaced), `-` written to stdout, and a
missing or unwritable folder refused at start with exit 2, naming the option."""

from __future__ import annotations

import io
import json
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app

from .support.helpers import SAMPLE_DATA, TINY_MODEL

runner = CliRunner()
POSTS, QUESTIONS, GOLD = SAMPLE_DATA / "posts.jsonl", SAMPLE_DATA / "questions.json", SAMPLE_DATA / "posts_gold.jsonl"
RECORDS = sum(1 for line in POSTS.read_text().splitlines() if line.strip())
OLD = b"old content\n"


def score_arguments(output: str, checkpoint: Path, *extra: str) -> list[str]:
    """A rerun of the finished job: it writes from the checkpoint, without the model."""
    return [
        "score", str(POSTS), "--questions", str(QUESTIONS), "-o", output, "--checkpoint", str(checkpoint),
        "--model", str(TINY_MODEL), "--workers", "0", "--quiet", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("finished") / "out.parquet"
    result = runner.invoke(app, score_arguments(str(output), Path(f"{output}.ckpt")))
    assert result.exit_code == 0, result.output
    return output


def parquet_rows(data: bytes) -> None:
    assert pq.read_table(io.BytesIO(data)).num_rows == RECORDS


def stats_document(data: bytes) -> None:
    assert json.loads(data)["records"] == RECORDS


def metrics_document(data: bytes) -> None:
    assert json.loads(data)["records"] == RECORDS


def html_page(data: bytes) -> None:
    assert data.startswith(b"<!doctype html>") and data.rstrip().endswith(b"</html>")


def calibration_document(data: bytes) -> None:
    assert {"method", "temperatures"} <= set(json.loads(data))


def compare_document(data: bytes) -> None:
    assert json.loads(data)["flips"] == []  # a run compared with itself


def review_tasks(data: bytes) -> None:
    assert len(json.loads(data)) == RECORDS


def label_config(data: bytes) -> None:
    assert data.startswith(b"<View") and data.rstrip().endswith(b"</View>")


@dataclass(frozen=True)
class Writer:
    option: str
    """As the refusal names it."""
    suffix: str
    stdout: bool
    """Whether `-` means stdout (the JSON and report writers) or is refused."""
    arguments: Callable[[Path, Path, str], list[str]]
    """(finished output, a scratch folder, target) -> the command line."""
    check: Callable[[bytes], None]


WRITERS = {
    "score -o": Writer(
        "--output/-o", ".parquet", False, lambda done, scratch, target: score_arguments(target, Path(f"{done}.ckpt")),
        parquet_rows,
    ),
    "score --stats-json": Writer(
        "--stats-json", ".json", True,
        lambda done, scratch, target: score_arguments(
            str(scratch / "s.parquet"), Path(f"{done}.ckpt"), "--stats-json", target
        ),
        stats_document,
    ),
    "eval --json": Writer(
        "--json", ".json", True,
        lambda done, scratch, target: ["eval", str(done), "--gold", str(GOLD), "--json", target],
        metrics_document,
    ),
    "eval --report": Writer(
        "--report", ".html", True,
        lambda done, scratch, target: ["eval", str(done), "--gold", str(GOLD), "--report", target],
        html_page,
    ),
    "calibrate -o": Writer(
        "--output/-o", ".json", True,
        lambda done, scratch, target: ["calibrate", str(done), "--gold", str(GOLD), "-o", target],
        calibration_document,
    ),
    "compare --json": Writer(
        "--json", ".json", True, lambda done, scratch, target: ["compare", str(done), str(done), "--json", target],
        compare_document,
    ),
    "compare --report": Writer(
        "--report", ".html", True, lambda done, scratch, target: ["compare", str(done), str(done), "--report", target],
        html_page,
    ),
    "review -o": Writer(
        "--output/-o", ".json", True, lambda done, scratch, target: ["review", str(done), "-o", target],
        review_tasks,
    ),
    "review --config-out": Writer(
        "--config-out", ".xml", False,
        lambda done, scratch, target: ["review", str(done), "-o", str(scratch / "tasks.json"), "--config-out", target],
        label_config,
    ),
}  # fmt: skip


def writers(all_quick: bool = False) -> list:
    """Every writer; the report renders plots for seconds, so only where `all_quick` is it in
    the quick loop (it writes through the same writer as eval --json)."""
    slow = () if all_quick else pytest.mark.slow
    return [pytest.param(name, marks=slow if name.endswith("--report") else ()) for name in WRITERS]


class PipeReader:
    """A named pipe with a reader thread, as a downstream consumer would hold it."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        self.data = b""
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with open(self.path, "rb") as handle:
            self.data = handle.read()

    def received(self) -> bytes:
        self.thread.join(timeout=60)
        if self.thread.is_alive():  # the writer never opened the pipe: let the reader go
            os.close(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK))
            self.thread.join(timeout=10)
            pytest.fail("nothing was written into the named pipe")
        return self.data


def character_device(folder: Path, name: str) -> Path:
    """A node like /dev/null, of our own (root may make one), so that a failing test never
    replaces the machine's /dev/null; where mknod is not allowed, /dev/null itself."""
    path = folder / name
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except OSError:
        return Path("/dev/null")
    return path


def run(writer: Writer, finished: Path, folder: Path, target: str):
    return runner.invoke(app, writer.arguments(finished, folder, target))


def no_temporaries(folder: Path) -> None:
    assert not [path.name for path in folder.rglob("*.tmp")]


@pytest.mark.parametrize("name", writers(all_quick=True))
def test_a_regular_file_is_replaced_atomically_keeping_its_mode(name, finished, tmp_path):
    writer = WRITERS[name]
    target = tmp_path / f"out{writer.suffix}"
    target.write_bytes(OLD)
    target.chmod(0o640)
    result = run(writer, finished, tmp_path, str(target))
    assert result.exit_code == 0, result.output
    writer.check(target.read_bytes())
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    no_temporaries(tmp_path)


@pytest.mark.parametrize("name", writers())
@pytest.mark.parametrize("dangling", [False, True], ids=["to a file", "dangling"])
def test_a_symlink_stays_a_link_and_its_target_is_written(name, dangling, finished, tmp_path):
    writer = WRITERS[name]
    real = tmp_path / "real"
    real.mkdir()
    pointed = real / f"target{writer.suffix}"
    if not dangling:
        pointed.write_bytes(OLD)
    link = tmp_path / f"link{writer.suffix}"
    link.symlink_to(pointed)
    if name == "score -o":  # what a run killed mid-write left beside the target: cleaned up
        (real / f".{pointed.name}.1a2b3c4d.tmp").write_bytes(OLD)
    result = run(writer, finished, tmp_path, str(link))
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and os.readlink(link) == str(pointed)
    writer.check(pointed.read_bytes())
    no_temporaries(tmp_path)


@pytest.mark.parametrize("name", writers())
def test_a_named_pipe_is_streamed_into(name, finished, tmp_path):
    writer = WRITERS[name]
    pipe = PipeReader(tmp_path / f"pipe{writer.suffix}")
    result = run(writer, finished, tmp_path, str(pipe.path))
    data = pipe.received()
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(pipe.path.lstat().st_mode)
    writer.check(data)
    no_temporaries(tmp_path)


@pytest.mark.parametrize("name", writers())
def test_a_character_device_stays_one(name, finished, tmp_path):
    writer = WRITERS[name]
    device = character_device(tmp_path, f"null{writer.suffix}")
    result = run(writer, finished, tmp_path, str(device))
    assert result.exit_code == 0, result.output
    assert stat.S_ISCHR(device.lstat().st_mode)
    no_temporaries(tmp_path)


@pytest.mark.parametrize("name", writers())
def test_dash_is_stdout_for_the_json_and_report_writers(name, finished, tmp_path):
    writer = WRITERS[name]
    result = run(writer, finished, tmp_path, "-")
    if not writer.stdout:
        assert result.exit_code == 2 and f"{writer.option} cannot be - (stdout)" in result.stderr
        assert not (tmp_path / "-").exists()
        return
    assert result.exit_code == 0, result.output
    writer.check(result.stdout_bytes)  # the tables went to stderr
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("name", writers(all_quick=True))
@pytest.mark.parametrize("folder", ["missing", "a file"])
def test_an_unusable_folder_is_refused_before_any_work(name, folder, tmp_path):
    """What would be read does not exist either (eval's scored file, score's checkpoint, which
    without it would run the whole job): the refusal names the output, so it came first."""
    writer = WRITERS[name]
    parent = tmp_path / "parent"
    if folder == "a file":
        parent.write_bytes(OLD)
    target = parent / f"out{writer.suffix}"
    result = runner.invoke(app, writer.arguments(tmp_path / "nosuch.parquet", tmp_path, str(target)))
    assert result.exit_code == 2, result.output
    what = "does not exist" if folder == "missing" else "is not a folder"
    assert result.stderr == f"error: {writer.option} {target}: folder {parent} {what}\n"
    assert "Traceback" not in result.output
    assert parent.read_bytes() == OLD if folder == "a file" else not parent.exists()


def test_both_eval_outputs_on_stdout_are_refused(finished):
    result = runner.invoke(app, ["eval", str(finished), "--gold", str(GOLD), "--json", "-", "--report", "-"])
    assert result.exit_code == 2 and "cannot both be - (stdout)" in result.stderr


# ----------------------------------------------------------------------------- train-head's folder


def test_train_head_writes_through_a_symlinked_folder_and_files(tmp_path):
    """save_head is train-head's writer: a link to the folder and a link to its report both stay."""
    from clef_cli.model.head import load_joint_head
    from clef_cli.quality.train.job import REPORT_FILE, save_head
    from clef_cli.release import HEAD_CONFIG, HEAD_WEIGHTS

    real = tmp_path / "real-head"
    real.mkdir()
    link = tmp_path / "head"
    link.symlink_to(real)
    reports = tmp_path / "reports"
    reports.mkdir()
    (real / REPORT_FILE).symlink_to(reports / "latest.json")
    save_head(load_joint_head(TINY_MODEL), TINY_MODEL, link, {"gate": {"passed": True}})
    assert link.is_symlink() and (real / REPORT_FILE).is_symlink()
    assert json.loads((reports / "latest.json").read_text())["gate"] == {"passed": True}
    assert (real / HEAD_WEIGHTS).is_file()
    assert (real / HEAD_CONFIG).read_bytes() == (TINY_MODEL / HEAD_CONFIG).read_bytes()
    load_joint_head(link)
    no_temporaries(tmp_path)


@pytest.mark.parametrize(
    "kind, message",
    [
        ("missing", "folder {parent} does not exist"),
        ("parent is a file", "folder {parent} is not a folder"),
        ("a file", "is a file; give a folder"),
        ("a device", "is a file; give a folder"),
    ],
)
def test_train_head_refuses_an_unusable_output_before_any_work(kind, message, tmp_path):
    parent = tmp_path / "parent"
    target = parent / "head"
    if kind == "parent is a file":
        parent.write_bytes(OLD)
    elif kind == "a file":
        parent.mkdir()
        target.write_bytes(OLD)
    elif kind == "a device":
        parent.mkdir()
        target = character_device(parent, "head")
    arguments = ["train-head", str(tmp_path / "nosuch.ckpt"), "--gold", str(GOLD), "-o", str(target), "--quiet"]
    result = runner.invoke(app, arguments)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: --output/-o {target}")
    assert message.format(parent=parent) in result.stderr


def test_a_symlink_loop_is_refused_before_any_work(tmp_path):
    loop = tmp_path / "loop.json"
    loop.symlink_to(tmp_path / "other.json")
    (tmp_path / "other.json").symlink_to(loop)
    result = runner.invoke(app, ["eval", str(tmp_path / "nosuch.parquet"), "--gold", str(GOLD), "--json", str(loop)])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: --json {loop} is a symlink that points nowhere")
    assert loop.is_symlink()
