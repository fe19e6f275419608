"""Usage slips answered as such: usage lines name arguments as the README does (SCORED, not
{scored}), and a checkpoint argument that is missing or is the scored Parquet exits 2 with a hint."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from clef_cli.cli import app

from .support.helpers import SAMPLE_DATA

runner = CliRunner()


@pytest.mark.parametrize(
    ("command", "usage"),
    [
        (["eval"], "clef eval [OPTIONS] SCORED"),
        (["calibrate"], "clef calibrate [OPTIONS] SCORED"),
        (["train-head"], "clef train-head [OPTIONS] CHECKPOINT"),
        (["score"], "clef score [OPTIONS] INPUTS..."),
        (["inspect-spans"], "clef inspect-spans [OPTIONS] RECORD_FILE"),
        (["checkpoint", "info"], "clef checkpoint info [OPTIONS] DIRECTORY"),
    ],
)
def test_usage_lines_name_arguments_in_capitals(command, usage):
    shown = runner.invoke(app, [*command, "--help"])
    assert shown.exit_code == 0
    assert shown.stdout.splitlines()[0] == f"Usage: {usage}"
    missing = runner.invoke(app, command)  # no argument: the same usage line, and the name in capitals
    assert missing.exit_code == 2 and f"Usage: {usage}" in missing.output
    assert f"Missing argument '{usage.split()[-1].rstrip('.')}'" in missing.output
    assert "{" not in shown.stdout.splitlines()[0] + missing.output


@pytest.mark.parametrize("command", [["train-head"], ["checkpoint", "info"]])
def test_a_checkpoint_that_is_missing_or_a_file_exits_2_with_a_hint(tmp_path, command):
    scored = tmp_path / "out.parquet"
    scored.write_bytes(b"PAR1")
    extra = ["--gold", str(SAMPLE_DATA / "posts_gold.jsonl"), "-o", str(tmp_path / "head")]
    extra = extra if command == ["train-head"] else []
    for target, what in ((tmp_path / "nosuch.ckpt", "does not exist"), (scored, "is a file, not a checkpoint")):
        result = runner.invoke(app, [*command, str(target), *extra])
        assert result.exit_code == 2, result.output
        assert what in result.stderr and "OUT.parquet.ckpt" in result.stderr
        assert "Traceback" not in result.output and "did you mean" not in result.stderr
    (tmp_path / "out.parquet.ckpt").mkdir()
    result = runner.invoke(app, [*command, str(scored), *extra])
    assert result.exit_code == 2 and f"did you mean {scored}.ckpt?" in result.stderr
    assert not (tmp_path / "head").exists()
