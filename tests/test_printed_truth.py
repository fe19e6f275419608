"""What clef prints is true (issue 45.6), each checked against what the run, the output or the
store then shows: the dry run tells records already in the checkpoint from the job's own
duplicates and counts the states cut to fit, as the run's summary does; `checkpoint info` tells a
run stopped on request (exit 130) from one that crashed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app

from .support.helpers import SAMPLE_DATA, TINY_MODEL, one_ctrl_c, write_jsonl

POSTS = SAMPLE_DATA / "posts.jsonl"
QUESTIONS = ("--questions", str(SAMPLE_DATA / "questions.json"))


def score(inputs: Path, out: Path, *extra: str):
    command = ["score", str(inputs), "-o", str(out), "--model", str(TINY_MODEL), *QUESTIONS, "--workers", "0"]
    return CliRunner().invoke(app, [*command, "--hidden-states", "drop", *extra])


def total_tokens(stdout: str) -> int:
    return int(stdout.split("total prompt tokens: ")[1].split()[0].replace(",", ""))


def line_count(text: str, label: str) -> int | None:
    """The number after `label` in a printed line; None when no line says it."""
    found = re.search(re.escape(label) + r"[^:]*: ([\d,]+)", " ".join(text.split()))
    return int(found.group(1).replace(",", "")) if found else None


def test_the_dry_run_tells_the_checkpoint_from_the_jobs_own_duplicates(tmp_path):
    posts = [json.loads(line) for line in POSTS.read_text().splitlines()]
    copies = [{**post, "id": f"{post['id']}-again"} for post in posts[:2]]  # the same prompts, new ids
    inputs = write_jsonl(tmp_path / "in.jsonl", posts + copies)
    out = tmp_path / "out.parquet"
    alone = score(POSTS, tmp_path / "alone.parquet", "--dry-run")
    fresh = score(inputs, out, "--dry-run")
    assert fresh.exit_code == 0, fresh.output
    assert line_count(fresh.stdout, "already in the checkpoint") is None  # there is no checkpoint
    assert line_count(fresh.stdout, "duplicates in this job") == len(copies)
    assert total_tokens(fresh.stdout) == total_tokens(alone.stdout)  # planned once, as the run runs them
    assert f"records: {len(posts) + len(copies)} ({len(posts) + len(copies)} valid" in fresh.stdout
    first = score(inputs, out, "--limit", "3")  # three of the posts, in the checkpoint
    assert first.exit_code == 0, first.output
    again = score(inputs, out, "--dry-run")
    assert line_count(again.stdout, "already in the checkpoint") == 3
    assert line_count(again.stdout, "duplicates in this job") == len(copies)
    run = score(inputs, out)
    assert f"3 from the checkpoint, {len(copies)} duplicates collapsed" in run.stderr  # what the run then says


def test_the_summary_and_the_dry_run_count_the_states_cut_to_fit(tmp_path):
    out = tmp_path / "out.parquet"
    budget = ("--max-length", "850")  # some of the posts' states do not fit
    plan = score(POSTS, out, "--dry-run", *budget)
    run = score(POSTS, out, *budget)
    assert run.exit_code == 0, run.output
    cut = sum(1 for row in pq.read_table(out).to_pylist() if row["state_tokens_cut"])
    assert 0 < cut < len(POSTS.read_text().splitlines())
    assert f"states cut to fit --max-length 850: {cut} records" in " ".join(plan.stdout.split())
    assert f"states cut to fit --max-length: {cut} records" in " ".join(run.stderr.split())
    whole = score(POSTS, tmp_path / "whole.parquet")
    assert "states cut" not in whole.stderr  # nothing cut, nothing said


def run_lines(checkpoint: Path) -> list[str]:
    info = CliRunner().invoke(app, ["checkpoint", "info", str(checkpoint)])
    assert info.exit_code == 0, info.output
    return [line for line in info.stdout.splitlines() if line.startswith("run ")]


def journal_records(checkpoint: Path) -> int:
    lines = (checkpoint / "journal.jsonl").read_text().splitlines()
    return sum(json.loads(line).get("records", 0) for line in lines if line.strip())


def test_checkpoint_info_shows_a_run_stopped_on_request_as_interrupted(tmp_path, monkeypatch):
    """The first Ctrl-C (a real SIGINT through the CLI's handler, which sets the job's stop), sent
    at the first commit: exit 130."""
    from clef_cli import faults

    monkeypatch.setattr(faults, "after_commit", one_ctrl_c())
    out = tmp_path / "out.parquet"
    result = score(POSTS, out, "--max-batch-size", "1")
    assert result.exit_code == 130, result.output
    checkpoint = Path(f"{out}.ckpt")
    [line] = run_lines(checkpoint)
    assert " interrupted " in line and "not finished" not in line, line
    assert f"{journal_records(checkpoint)} committed" in line  # its counts so far
    assert "rerun the same command to continue" in line


@pytest.mark.parametrize(
    ("raised", "code", "said"),
    [(KeyboardInterrupt, 130, " interrupted "), (RuntimeError, 1, "not finished (failed, killed, stopped at once or")],
    ids=["a second Ctrl-C", "a crash"],
)
def test_checkpoint_info_tells_an_interrupt_from_a_crash(tmp_path, monkeypatch, raised, code, said):
    """Raised as the output is written, every record committed: only the interrupt is called one."""
    import clef_cli.job.lifecycle as job_module

    def stopped(*args, **kwargs):
        raise raised()

    monkeypatch.setattr(job_module, "write_job_output", stopped)
    out = tmp_path / "out.parquet"
    result = score(POSTS, out)
    assert result.exit_code == code, result.output
    [line] = run_lines(Path(f"{out}.ckpt"))
    assert said in line, line
    assert ("interrupted" in line) is (raised is KeyboardInterrupt)
