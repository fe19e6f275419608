"""The checkpoint states a kill can leave between the steps of a commit, built by hand (a SIGKILL
lands on a commit boundary far more often than inside one), and a commit that fails for lack of
disk space in the middle of a run. Each must resume to the uninterrupted job's output."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.store import durable
from clef_cli.store import prune as prune_module
from clef_cli.store.key_index import KeyIndex

from .support.helpers import TINY_MODEL, assert_same_rows, write_jsonl

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


def score_into(inputs: Path, output: Path, store: Path):
    """A run on a shared store (`--checkpoint`), results only."""
    return runner.invoke(
        app,
        ["score", str(inputs), "-o", str(output), "--checkpoint", str(store), "--model", str(TINY_MODEL),
         "--workers", "0", "--quiet", "--hidden-states", "drop"],
    )  # fmt: skip


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


@pytest.mark.slow  # the quick loop's budget (issue 36.12): CI's whole run has it
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


FULL_DISK_AT = {
    # where the disk fills, as the seam (clef_cli/store/durable.py) sees it: the 4th shard's ...
    "results shard write": ("write", ".results.arrow."),
    "hidden-state shard write": ("write", ".hidden.safetensors."),
    "journal append": ("write", "journal.jsonl"),
    "index update": ("sqlite_txn", "keys.sqlite"),
}


def fills_the_disk_at_the_fourth(operation: str, name_part: str):
    """A seam observer raising ENOSPC at the 4th matching operation made by the committer."""
    seen: list[Path] = []

    def observer(kind: str, path: Path, details: dict) -> None:
        if kind == operation and name_part in path.name and threading.current_thread().name == "clef-commit":
            seen.append(path)
            if len(seen) == 4:
                raise OSError(errno.ENOSPC, "No space left on device", str(path))

    return observer


@pytest.mark.parametrize(
    "where",  # one seam in the quick loop; the others in CI's whole run (issue 36.12)
    [seam if seam == "results shard write" else pytest.param(seam, marks=pytest.mark.slow) for seam in FULL_DISK_AT],
)
def test_a_full_disk_mid_run_stops_cleanly_and_the_rerun_finishes(finished, tmp_path, where):
    inputs = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    output, checkpoint = tmp_path / "out.parquet", tmp_path / "out.parquet.ckpt"
    with durable.observe(fills_the_disk_at_the_fourth(*FULL_DISK_AT[where])):
        failed = score(inputs, output)
    kept = 8 if where == "index update" else 6  # the journal line came first: that shard counts
    assert failed.exit_code == 1, failed.output
    assert failed.stderr == (
        f"error: could not commit to the checkpoint {checkpoint}: No space left on device; the {kept} records "
        "committed before are kept: make room and rerun the same command to continue\n"
    )
    assert "Traceback" not in failed.output
    assert not output.exists()
    assert len(journal(checkpoint)) == kept // 2  # every batch before the failed one is committed
    assert not [name for name in shard_files(checkpoint) if name.endswith(".tmp")]
    assert not list(tmp_path.glob("*.lock"))
    resume_and_check(inputs, output, checkpoint, 12 - kept, finished[1])


def test_sqlite_s_own_full_disk_is_the_os_error_a_commit_reports(tmp_path):
    index = KeyIndex(tmp_path / "keys.sqlite")
    pages = index.db.execute("PRAGMA page_count").fetchone()[0]
    index.db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full: no page more
    with pytest.raises(OSError) as raised:
        index.begin_run("r1", inputs=[f"/data/{n}-" + "x" * 4000 for n in range(16)])
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(tmp_path / "keys.sqlite")
    index.close()


@pytest.mark.slow  # the quick loop's budget (issue 36.12): CI's whole run has it
def test_a_run_that_starts_while_a_prune_holds_the_store_is_refused_like_a_second_cron_run(
    finished, tmp_path, monkeypatch
):
    inputs = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    output, checkpoint = tmp_path / "out.parquet", tmp_path / "out.parquet.ckpt"
    assert score(inputs, output).exit_code == 0
    real, during = prune_module._prune, []

    def prune_that_sees_a_cron_run(*args, **kwargs):
        during.append(score(inputs, tmp_path / "other.parquet" if during else output))
        return real(*args, **kwargs)

    monkeypatch.setattr(prune_module, "_prune", prune_that_sees_a_cron_run)
    pruned = runner.invoke(app, ["checkpoint", "prune", str(checkpoint), "--keep-runs", "1"])
    assert pruned.exit_code == 0, pruned.output
    refused = during[0]
    assert refused.exit_code == 1, refused.output
    assert refused.stderr.startswith(
        f"error: checkpoint {checkpoint} is in use by another clef job (pid {os.getpid()} on host "
        f"{socket.gethostname()}); lock file {checkpoint}.lock"
    )
    assert not (tmp_path / "out.parquet.ckpt.lock").exists()
    assert forwards(score(inputs, output)) == (0, 12)  # the refused run changed nothing


def test_a_prune_killed_after_its_journal_switch_keeps_what_it_meant_to_keep(tmp_path, monkeypatch):
    """Crash state found by test_crash_enumeration.py: the journal names the prune's rewritten
    shards, the index still the old ones. Reconciling forgot the old rows and indexed the new
    ones as last used by the run that first computed them, so the rerun prune dropped the keys
    the last night had reused (the ones the prune meant to keep)."""
    store = tmp_path / "st"
    first, second = write_jsonl(tmp_path / "a.jsonl", RECORDS[:4]), write_jsonl(tmp_path / "b.jsonl", RECORDS[2:6])
    for inputs, name in ((first, "a"), (second, "b")):
        done = score_into(inputs, tmp_path / f"{name}.parquet", store)
        assert done.exit_code == 0, done.output

    def killed(*args) -> None:
        raise KeyboardInterrupt  # the kill lands after the journal switch and the deletions

    monkeypatch.setattr(prune_module, "_update_index", killed)
    assert runner.invoke(app, ["checkpoint", "prune", str(store), "--keep-runs", "1"]).exit_code == 130
    monkeypatch.undo()
    again = runner.invoke(app, ["checkpoint", "prune", str(store), "--keep-runs", "1"])
    assert again.exit_code == 0, again.output
    assert "dropped 0 of 4 keys" in again.stdout  # the old code dropped 2 of the 4 kept keys here
    assert forwards(score_into(second, tmp_path / "c.parquet", store)) == (0, 4)
