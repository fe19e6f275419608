"""Every command's `--help`, byte for byte, against the copy kept in tests/help/.

Moving code (the house rules ask for moves without behaviour changes) must not change what a user
reads; a change that means to change a help text updates its copy in the same commit:
`CLEF_UPDATE_HELP=1 python -m pytest tests/test_help_text.py` rewrites them, and `git diff
tests/help/` then shows exactly what a user will see differently.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from clef_cli.cli import app

HELP = Path(__file__).parent / "help"
WIDTH = "100"
"""Asked for; the help formatter may still wrap at its own default (80 here), the same everywhere."""


def command_paths(command: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group of the CLI, as the words that name it (the top level as ())."""
    paths = [prefix]
    if getattr(command, "commands", None):  # a group (typer's own click, so no isinstance)
        for name in sorted(command.commands):
            paths += command_paths(command.commands[name], (*prefix, name))
    return paths


PATHS = command_paths(typer.main.get_command(app))


def help_text(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": WIDTH, "TERM": "dumb", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.stdout


def snapshot(path: tuple[str, ...]) -> Path:
    return HELP / ("-".join(("clef", *path)) + ".txt")


def test_every_command_is_covered():
    assert ("score",) in PATHS and ("checkpoint", "prune") in PATHS and len(PATHS) == 13
    kept = {path.name for path in HELP.glob("*.txt")}
    assert kept == {snapshot(path).name for path in PATHS}, "a command was added or removed: update tests/help/"


@pytest.mark.parametrize("path", PATHS, ids=lambda path: " ".join(("clef", *path)))
def test_help_is_byte_identical_to_its_copy(path):
    text = help_text(path)
    if os.environ.get("CLEF_UPDATE_HELP") == "1":
        HELP.mkdir(exist_ok=True)
        snapshot(path).write_text(text, encoding="utf-8")
    assert text == snapshot(path).read_text(encoding="utf-8")
    assert help_text(path) == text  # the same twice: nothing in it depends on the moment


def score_option(name: str) -> Any:
    command = typer.main.get_command(app).commands["score"]  # type: ignore[attr-defined]
    return next(param for param in command.params if param.name == name)


def test_the_kv_cache_bound_the_help_shows_is_the_checks():
    """`--cpu-kv-cache-gib`'s range in the help is the one the check applies (whole GiB, at least
    the least vLLM takes): every value the help admits passes the check, the one below does not."""
    from clef_cli.errors import UsageError
    from clef_cli.job.settings import MIN_CPU_KV_CACHE_GIB, VllmOptions

    option = score_option("cpu_kv_cache_gib")
    assert option.type_descriptor.annotation is int  # the check takes whole GiB only
    assert option.min == MIN_CPU_KV_CACHE_GIB and option.max is None
    assert (
        f"<int range> --engine vllm on the CPU: KV-cache space in whole GiB. [x>={MIN_CPU_KV_CACHE_GIB}]"
        in " ".join(help_text(("score",)).split())
    )
    for admitted in (option.min, option.min + 1, 64):
        VllmOptions(cpu_kv_cache_gib=admitted).validate()
    for refused in (option.min - 1, option.min + 0.5):
        with pytest.raises(UsageError, match="whole number of GiB"):
            VllmOptions(cpu_kv_cache_gib=refused).validate()


def test_the_help_says_what_the_options_read():
    """Issue 51's untrue help: --verify-media hashed objects too, --columns mapped CSV columns too."""
    text = " ".join(help_text(("score",)).split())
    verify = text.split("--verify-media", 1)[1].split(" --", 1)[0]
    assert "object" in verify and "file" in verify
    columns = text.split("--columns <str>", 1)[1].split(" --", 1)[0]
    assert "CSV" in columns and "Parquet" in columns and "JSONL" in columns and "Hive" in columns
    spans = " ".join(help_text(("inspect-spans",)).split())
    assert "--columns <str>" in spans and "--state-columns <str>" in spans and "--questions PATH|URI" in spans
