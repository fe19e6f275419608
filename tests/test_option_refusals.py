"""An option that means nothing without another is refused (exit 2, one line naming the fix)
before any work, as `--max-model-len` without `--engine vllm` is: the keep policy's thresholds
without `--hidden-states selective`, and the keep policy with `--rehead` (a rehead keeps every
state it computes). A refused run leaves the disk as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from clef_cli.cli import app

from .support.helpers import SAMPLE_DATA, TINY_MODEL, write_jsonl

runner = CliRunner()
SELECTIVE_ONLY = "applies to --hidden-states selective only: add --hidden-states selective"
WITH_REHEAD = "does not go with --rehead (a rehead reads the stored hidden states and keeps those it computes)"


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under `folder` with its size and modification time (folders: 0, their mtime)."""
    return {
        str(path.relative_to(folder)): (path.stat().st_size if path.is_file() else 0, path.stat().st_mtime_ns)
        for path in sorted(folder.rglob("*"))
    }


def score(folder: Path, *options: str):
    """`clef score` of two text records in `folder` (also the working directory), output there."""
    inputs = folder / "records.jsonl"
    if not inputs.exists():
        write_jsonl(inputs, [{"id": "a", "state": "hello"}, {"id": "b", "state": "world"}])
    questions = SAMPLE_DATA / "questions.json"
    base = ["score", str(inputs), "-o", str(folder / "out.parquet"), "--questions", str(questions)]
    return runner.invoke(app, [*base, "--model", str(TINY_MODEL), "--device", "cpu", "--workers", "0", *options])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--keep-below", "0.5"], f"--keep-below {SELECTIVE_ONLY}"),
        (["--keep-sample", "0.1"], f"--keep-sample {SELECTIVE_ONLY}"),
        (["--hidden-states", "keep", "--keep-below", "0.5"], f"--keep-below {SELECTIVE_ONLY}"),
        (["--hidden-states", "drop", "--keep-sample", "0"], f"--keep-sample {SELECTIVE_ONLY}"),
        (
            ["--rehead", str(TINY_MODEL), "--hidden-states", "drop"],
            f"--hidden-states {WITH_REHEAD}: drop --hidden-states",
        ),
        (["--rehead", str(TINY_MODEL), "--keep-below", "0.5"], f"--keep-below {WITH_REHEAD}: drop --keep-below"),
        (["--rehead", str(TINY_MODEL), "--keep-sample", "0.5"], f"--keep-sample {WITH_REHEAD}: drop --keep-sample"),
        (
            ["--rehead", str(TINY_MODEL), "--hidden-states", "selective", "--keep-below", "0.5"],
            f"--hidden-states {WITH_REHEAD}: drop --hidden-states",
        ),
        (["--max-model-len", "4096"], "--max-model-len applies to the vLLM engine only: add --engine vllm"),
        (["--dry-run", "--keep-below", "0.5"], f"--keep-below {SELECTIVE_ONLY}"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else "",
)
def test_an_option_that_means_nothing_here_exits_2_and_writes_nothing(tmp_path, monkeypatch, options, message):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "records.jsonl", [{"id": "a", "state": "hello"}])
    before = tree(tmp_path)
    result = score(tmp_path, *options)
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: {message}\n"
    assert tree(tmp_path) == before


def test_the_options_are_taken_where_they_mean_something(tmp_path, monkeypatch):
    """Selective with its thresholds reaches the settings; so does --engine vllm with --rehead (a
    rehead takes the store's own engine for the states it lacks). The engine is stubbed: this is
    the refusal's boundary, not a run."""
    import clef_cli.cli.score as score_command

    monkeypatch.chdir(tmp_path)
    taken = []
    monkeypatch.setattr(score_command, "show_plan", lambda settings, progress: taken.append(settings))
    planned = score(tmp_path, "--dry-run", "--hidden-states", "selective", "--keep-below", "0.5", "--keep-sample", "0")
    assert planned.exit_code == 0, planned.output
    assert (taken[0].hidden_states, taken[0].keep_below, taken[0].keep_sample) == ("selective", 0.5, 0.0)

    def engine(settings, options, progress, quiet):
        taken.append(settings)
        raise SystemExit(0)

    monkeypatch.setattr(score_command, "run_engine", engine)
    reheaded = score(tmp_path, "--rehead", str(TINY_MODEL), "--engine", "vllm")
    assert reheaded.exit_code == 0, reheaded.output
    assert (taken[1].engine, taken[1].rehead) == ("vllm", TINY_MODEL)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["records.jsonl"]
