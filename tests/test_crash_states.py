"""The checkpoint states a kill can leave between the steps of a commit, built by hand (a SIGKILL
lands on a commit boundary far more often than inside one), and a commit that fails for lack of
disk space in the middle of a run. Each must resume to the uninterrupted job's output."""

from __future__ import annotations

import errno
import json
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.store import checkpoint as checkpoint_module
from clef_cli.store.atomic import write_file

from .helpers import TINY_MODEL, assert_same_rows, write_jsonl

runner = CliRunner()
SUMMARY = re.compile(r"(\d+) run through the model, (\d+) from the checkpoint")
RECORDS = [
    {"id": f"c{i:02d}", "state": "ticket " + "word " * (2 + (i * 5) % 17), "questions": {"ok": {"type": "noul"}}}
    for i in range(12)
]


def score(inputs: Path, output: Path):
    return runner.invoke(
        app,
        [
            "score",
            str(inputs),
            "-o",
            str(output),
            "--model",
            str(TINY_MODEL),
            "--workers",
            "0",
            "--quiet",
            "--max-batch-size",
            "2",
        ],
    )


def forwards(result) -> tuple[int, int]:
    match = SUMMARY.search(result.stderr)
    assert match, result.output
    return int(match.group(1)), int(match.group(2))


def journal(checkpoint: Path) -> list[str]:
    return (checkpoint / "journal.jsonl").read_text().splitlines()


def shard_files(checkpoint: Path) -> set[str]:
    return {path.name for path in (checkpoint / "shards").iterdir()}


def journaled_files(checkpoint: Path) -> set[str]:
    return {described["name"] for line in journal(checkpoint) for described in json.loads(line)["files"].values()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One uninterrupted run: its output and its complete checkpoint (6 shards of 2 records)."""
    folder = tmp_path_factory.mktemp("finished")
    inputs = write_jsonl(folder / "in.jsonl", RECORDS)
    result = score(inputs, folder / "out.parquet")
    assert result.exit_code == 0, result.output
    assert forwards(result) == (12, 0)
    checkpoint = folder / "out.parquet.ckpt"
    assert len(journal(checkpoint)) == 6
    return folder, pq.read_table(folder / "out.parquet").to_pylist()


@pytest.fixture
def crashed(finished, tmp_path):
    """A copy of the finished job without its output, as a killed run leaves it."""
    source, _ = finished
    shutil.copy(source / "in.jsonl", tmp_path / "in.jsonl")
    shutil.copytree(source / "out.parquet.ckpt", tmp_path / "out.parquet.ckpt")
    return tmp_path / "in.jsonl", tmp_path / "out.parquet", tmp_path / "out.parquet.ckpt"


def resume_and_check(inputs: Path, output: Path, checkpoint: Path, want_forwarded: int, rows: list[dict]) -> None:
    result = score(inputs, output)
    assert result.exit_code == 0, result.output
    assert forwards(result) == (want_forwarded, 12 - want_forwarded)
    assert_same_rows(pq.read_table(output).to_pylist(), rows)
    assert shard_files(checkpoint) == journaled_files(checkpoint)  # nothing stale or orphaned is left
    assert all(json.loads(line)["records"] == 2 for line in journal(checkpoint))
    again = score(inputs, output)  # the repaired journal is sound: nothing is computed twice
    assert again.exit_code == 0 and forwards(again) == (0, 12)


def test_shard_files_renamed_into_place_without_their_journal_line(finished, crashed):
    inputs, output, checkpoint = crashed
    lines = journal(checkpoint)
    (checkpoint / "journal.jsonl").write_text("".join(line + "\n" for line in lines[:4]))
    orphans = {d["name"] for line in lines[4:] for d in json.loads(line)["files"].values()}
    assert orphans and orphans <= shard_files(checkpoint)  # files durable, commit not recorded
    resume_and_check(inputs, output, checkpoint, 4, finished[1])


def test_a_journal_line_cut_short(finished, crashed):
    inputs, output, checkpoint = crashed
    lines = journal(checkpoint)
    cut = lines[5][: len(lines[5]) // 2]  # the kill landed inside the last write: no newline
    (checkpoint / "journal.jsonl").write_text("".join(line + "\n" for line in lines[:5]) + cut)
    resume_and_check(inputs, output, checkpoint, 2, finished[1])


def test_an_orphan_temporary_file(finished, crashed):
    inputs, output, checkpoint = crashed
    lines = journal(checkpoint)
    (checkpoint / "journal.jsonl").write_text("".join(line + "\n" for line in lines[:3]))
    for line in lines[3:]:
        for described in json.loads(line)["files"].values():
            (checkpoint / "shards" / described["name"]).unlink()
    # a shard file killed before its rename, and a journal rewrite killed the same way
    (checkpoint / "shards" / ".00000004.results.arrow.1a2b3c4d.tmp").write_bytes(b"ARROW1\x00\x00 half")
    (checkpoint / ".journal.jsonl.5e6f7a8b.tmp").write_text('{"name": "00000004"')
    resume_and_check(inputs, output, checkpoint, 6, finished[1])
    assert not list(checkpoint.glob(".*.tmp"))


def test_a_full_disk_mid_run_stops_cleanly_and_the_rerun_finishes(finished, tmp_path, monkeypatch):
    inputs = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    output, checkpoint = tmp_path / "out.parquet", tmp_path / "out.parquet.ckpt"
    real = checkpoint_module.write_bytes
    results_written: list[str] = []

    def disk_fills_at_the_fourth_shard(path: Path, data: bytes) -> None:
        if path.name.endswith(".results.arrow"):
            results_written.append(path.name)
            if len(results_written) == 4:

                def partial(handle) -> None:
                    handle.write(b"ARROW1 partial")
                    raise OSError(errno.ENOSPC, "No space left on device", str(path))

                return write_file(path, partial)
        return real(path, data)

    monkeypatch.setattr(checkpoint_module, "write_bytes", disk_fills_at_the_fourth_shard)
    failed = score(inputs, output)
    assert failed.exit_code == 1, failed.output
    assert failed.stderr == (
        f"error: could not commit to the checkpoint {checkpoint}: No space left on device; the 6 records "
        "committed before are kept: make room and rerun the same command to continue\n"
    )
    assert "Traceback" not in failed.output
    assert not output.exists()
    assert len(journal(checkpoint)) == 3  # every batch before the failed one is committed
    assert not [name for name in shard_files(checkpoint) if name.endswith(".tmp")]
    assert not list(tmp_path.glob("*.lock"))
    monkeypatch.setattr(checkpoint_module, "write_bytes", real)
    resume_and_check(inputs, output, checkpoint, 6, finished[1])
