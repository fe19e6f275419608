"""Progress for cron (issue 56.6): without a terminal, `clef score` writes a plain line at least
every `--log-every` seconds from a timer, so a killed or hung night's log says how far it got;
and the texts of issue 56.9 this file pins: the rehead summary's rate, the dry run's media lines
and hidden-state sizes, the start-up figure split from opening the store and keying."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.cli.line_progress import Counts, LineProgress, duration, progress_line
from clef_cli.cli.progress import rehead_line, score_line
from clef_cli.job.summary import JobSummary

from .support.helpers import TINY_MODEL, write_jsonl

ROOT = Path(__file__).resolve().parent.parent
NOUL = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
LINE = re.compile(r"^progress after [^:]+: (\d+) of (\d+) records \([\d.]+%\), ([\d.]+) records/s, eta ")


def records(count: int) -> list[dict]:
    return [{"id": f"r{n}", "state": f"ticket {n} " + "word " * (3 + n % 5), "questions": NOUL} for n in range(count)]


def score(*args: object) -> object:
    return CliRunner().invoke(app, ["score", *map(str, args), "--model", str(TINY_MODEL), "--device", "cpu"])


def test_the_line_gives_done_of_total_rate_eta_and_syncs():
    counts = Counts(total=2150, done=1234, ran=1000, failed=3, syncs=4, failing=2)
    line = progress_line(counts, elapsed=500.0, scoring=400.0, idle=None, doing=None)
    rate = 1000 / 400  # this run's records over the seconds since scoring began
    eta = (2150 - 1234) / rate  # 366.4 s
    assert eta == pytest.approx(366.4)
    assert line == (
        "progress after 8 min 20 s: 1,234 of 2,150 records (57.4%), 3 failed, 2.5 records/s, "
        "eta 6 min 06 s, syncs: 4 done, the last 2 failed"
    )
    unknown = progress_line(Counts(done=7, ran=7), elapsed=3.0, scoring=2.0, idle=61.0, doing="writing the output")
    assert (
        unknown
        == "progress after 3 s: 7 records, 3.5 records/s, no record finished for 1 min 01 s (writing the output)"
    )
    nothing = progress_line(Counts(total=10), elapsed=9.0, scoring=9.0, idle=None, doing=None)
    assert nothing.endswith("0 of 10 records (0.0%), 0.0 records/s, eta unknown")
    assert [duration(s) for s in (0.4, 59.6, 3599, 7500)] == ["0 s", "1 min 00 s", "59 min 59 s", "2 h 05 min"]


def test_a_line_comes_from_the_timer_while_no_record_finishes():
    """The timer writes whether or not the job calls: a hung batch still logs, and says for how
    long no record finished (the clock the lines read is the test's; the timer's is real)."""
    now = [1000.0]
    lines: list[str] = []
    progress = LineProgress(every=0.05, write=lines.append, clock=lambda: now[0])
    try:
        progress.note("keying the records")
        now[0] += 30
        assert wait_for(lines, "keying the records: 30 s so far")
        progress.start(10, 4)
        progress.advance(2, 100, 0)
        now[0] += 125  # then nothing: a batch that never comes back (2 records in 125 s: 4 left take 250 s)
        hung = wait_for(lines, "no record finished for 2 min 05 s")
    finally:
        progress.stop()
    assert "scoring 10 records: 4 done already, 6 to run" in lines
    assert hung.startswith("progress after 2 min 35 s: 6 of 10 records (60.0%), 0.0 records/s, eta 4 min 10 s")
    count = len(lines)
    time.sleep(0.2)
    assert len(lines) == count  # stop() ends the timer


def test_the_lines_go_to_the_commands_stderr_even_after_it_changed(monkeypatch):
    """A timer left running (a job hanging in a thread) wrote to whatever sys.stderr was at each
    line: in a test process, into a later command's captured output (CI: `starting: 17 min 00 s
    so far` before a one-line error). It writes to the stderr of the command that made it."""
    import io

    own, later = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", own)
    progress = LineProgress(every=0.05)
    monkeypatch.setattr(sys, "stderr", later)
    try:
        progress.warn("kept")
        deadline = time.monotonic() + 5
        while "so far" not in own.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        progress.stop()
    assert own.getvalue().startswith("warning: kept\n") and "starting: " in own.getvalue()
    assert later.getvalue() == ""


def wait_for(lines: list[str], text: str, seconds: float = 5.0) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = [line for line in list(lines) if text in line]
        if found:
            return found[-1]
        time.sleep(0.01)
    raise AssertionError(f"no line with {text!r} in {lines}")


def test_a_job_without_a_terminal_writes_plain_progress_lines(tmp_path, monkeypatch):
    """In process (the runner's stderr is no terminal): the start line, then timed lines with
    done of total and the rate, while each commit waits."""
    from clef_cli import faults

    monkeypatch.setattr(faults, "after_commit", lambda: time.sleep(0.15))
    inputs, output = write_jsonl(tmp_path / "in.jsonl", records(4)), tmp_path / "out.parquet"
    result = score(inputs, "-o", output, "--workers", "0", "--max-batch-size", "1", "--log-every", "0.05")
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stderr and "scoring 4 records: 0 done already, 4 to run" in result.stderr
    found = [m for m in map(LINE.match, result.stderr.splitlines()) if m]
    assert {m.group(2) for m in found} == {"4"} and any(0 < int(m.group(1)) < 4 for m in found)
    assert "4 scored, 0 failed of 4 records" in result.stderr


@pytest.mark.slow  # a real process: its start-up (torch, the model) is most of 20 s here
def test_a_killed_job_piped_to_a_log_leaves_lines_of_how_far_it_got(tmp_path):
    """A real process with stderr a pipe, as cron runs it, killed (SIGKILL) mid-job: the plain
    lines it wrote before say done of total, the rate and the ETA, with no escape code."""
    inputs, output = write_jsonl(tmp_path / "in.jsonl", records(12)), tmp_path / "out.parquet"
    command = [sys.executable, "-m", "clef_cli", "score", str(inputs), "-o", str(output), "--model", str(TINY_MODEL),
               "--device", "cpu", "--workers", "0", "--max-batch-size", "2", "--hidden-states", "drop",
               "--log-every", "0.2"]  # fmt: skip
    env = {**os.environ, "CLEF_TEST_SLOW_COMMIT": "0.5"}  # each commit waits: the job is still running
    process = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, env=env, start_new_session=True)
    log = b""
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(process.stderr, selectors.EVENT_READ)
            deadline = time.monotonic() + 120
            while not any(int(m.group(1)) >= 2 for m in map(LINE.match, log.decode().splitlines()) if m):
                assert process.poll() is None and time.monotonic() < deadline, log.decode()
                if selector.select(timeout=1):
                    log += os.read(process.stderr.fileno(), 65536)
        os.killpg(process.pid, signal.SIGKILL)
        log += process.stderr.read()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    text = log.decode()
    assert "\x1b" not in text and "\r" not in text  # plain lines: no colour, no redrawn bar
    assert "scoring 12 records: 0 done already, 12 to run" in text
    found = [m for m in map(LINE.match, text.splitlines()) if m]
    assert found and all(m.group(2) == "12" for m in found)
    assert any(int(m.group(1)) >= 2 and float(m.group(3)) > 0 for m in found)
    assert not output.exists()


def test_log_every_must_be_above_zero(tmp_path):
    inputs = write_jsonl(tmp_path / "in.jsonl", records(1))
    for value in ("0", "-1"):
        refused = score(inputs, "-o", tmp_path / "out.parquet", "--log-every", value)
        assert refused.exit_code == 2 and f"--log-every must be above 0 seconds, not {value}" in refused.stderr


def test_the_rehead_summary_quotes_no_tok_s_for_tokens_the_thinker_never_ran():
    summary = JobSummary(output="re.parquet", records=6, scored=6, tokens=3000, seconds=2.0)
    summary.rehead_states_computed = 0
    line = rehead_line(summary)
    assert "tok/s" not in line and "no thinker run" in line
    assert "3,000 prompt tokens in 2.0 s (3.0 records/s) -> re.parquet" in line


def test_the_dry_run_of_text_only_input_names_no_media_field(tmp_path):
    many = write_jsonl(tmp_path / "in.jsonl", records(70))  # longer than the 64 records sampled
    plan = score(many, "-o", tmp_path / "out.parquet", "--dry-run", "--limit", "1")  # the shape reads 64
    assert plan.exit_code == 0, plan.output
    assert "not in the first" not in plan.stdout and "no column" not in plan.stdout
    assert "  state <- state: text" in plan.stdout
    for field in ("images", "audio", "videos"):
        assert f"  {field}" not in plan.stdout
    mapped = score(many, "-o", tmp_path / "out.parquet", "--dry-run", "--limit", "1", "--columns", "images=photo")
    assert "images <- photo: not in the first 64 records" in mapped.stdout  # asked for: said


def test_the_dry_run_of_a_store_holding_every_record_quotes_no_size(tmp_path):
    inputs, output = write_jsonl(tmp_path / "in.jsonl", records(3)), tmp_path / "out.parquet"
    assert score(inputs, "-o", output, "--quiet").exit_code == 0
    plan = score(inputs, "-o", output, "--dry-run")
    assert plan.exit_code == 0, plan.output
    assert "already in the checkpoint: 3" in plan.stdout
    assert "about 0 B" not in plan.stdout and "of the stored results" not in plan.stdout
    assert "hidden states on disk: none under any --hidden-states (no prompt to compute)" in plan.stdout


def test_the_summary_names_opening_the_store_and_keying_apart_from_start_up(tmp_path):
    inputs, output, stats = (
        write_jsonl(tmp_path / "in.jsonl", records(4)),
        tmp_path / "out.parquet",
        tmp_path / "s.json",
    )
    result = score(inputs, "-o", output, "--quiet", "--workers", "0", "--stats-json", stats)
    assert result.exit_code == 0, result.output
    stages = json.loads(stats.read_text())["stages_seconds"]
    assert stages["open_store"] > 0 and stages["keying"] > 0 and stages["startup"] > 0
    for name, what in (("open_store", "opening the store"), ("keying", "keying the records"), ("startup", "start-up")):
        shown = f", {what} {stages[name]:.1f} s" in result.stderr
        assert shown is (stages[name] >= 0.05), (name, result.stderr)
    summary = JobSummary(output="o")
    summary.stats.stages |= {"open_store": 3.04, "keying": 12.0, "startup": 0.01}
    assert score_line(summary, 0.0).endswith("(0 tok/s, opening the store 3.0 s, keying the records 12.0 s) -> o")
