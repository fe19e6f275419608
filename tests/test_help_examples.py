"""Every `--help` ends with examples that run (issue 51): each command's story (cli/examples.py),
run line by line from a folder that holds the sample records as a source checkout does, with
`--model tests/fixtures/tiny-clef-omni` added to the lines that load a model, as the help says.
The stories share one folder, so the sample posts are scored once and later stories reuse the
store (the first line of each story runs nothing again)."""

from __future__ import annotations

import shlex

import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.cli.examples import AT_SCALE, LOADS_A_MODEL, RUNNABLE, TINY, epilog

from .support.helpers import SAMPLE_DATA, TINY_MODEL

runner = CliRunner()
QUICK = ("inspect-spans",)
"""The story that scores nothing (it loads the tokenizer alone); the others score the sample
records first (the stories after the first reuse its store), and train-head trains: slow tests."""


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A folder laid out as a checkout's root: `sample_data/` and the tiny model's path."""
    root = tmp_path_factory.mktemp("checkout")
    (root / "sample_data").symlink_to(SAMPLE_DATA)
    (root / "tests" / "fixtures").mkdir(parents=True)
    (root / TINY).symlink_to(TINY_MODEL)
    return root


def run_line(line: str) -> None:
    args = shlex.split(line)[1:]
    if line.startswith(LOADS_A_MODEL):
        args += ["--model", TINY]
        if line.startswith("clef score"):
            args += ["--workers", "0"]  # the test's own choice: no worker processes on the shared cores
    result = runner.invoke(app, args)
    assert result.exit_code == 0, f"{line}\n{result.output}"


@pytest.mark.parametrize(
    "command", [c if c in QUICK else pytest.param(c, marks=pytest.mark.slow) for c in RUNNABLE], ids=str
)
def test_each_commands_examples_run_from_a_checkout(command, checkout, monkeypatch):
    monkeypatch.chdir(checkout)
    for line in RUNNABLE[command]:
        run_line(line)


def test_the_examples_say_what_they_need():
    """The tiny model's path is given where a story loads a model; the lines that need GPUs, Ray or a
    bucket are under their own heading, never among the lines run."""
    for command, lines in RUNNABLE.items():
        text = epilog(command)
        assert (TINY in text) == any(line.startswith(LOADS_A_MODEL) for line in lines), command
        assert not any(word in line for line in lines for word in ("--ray", "vllm", "s3://", "||"))
    assert all("At scale" in epilog(command) for command in AT_SCALE)
