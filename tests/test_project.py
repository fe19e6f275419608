"""The project's promises to a new user: README commands, CI and help texts stay true."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from clef_cli.cli import app

ROOT = Path(__file__).parent.parent


def test_ci_runs_the_test_command_written_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    quick_start = re.search(r"## Quick start\n\n```bash\n(.*?)```", readme, re.S).group(1)
    commands = [line for line in quick_start.splitlines() if line and not line.startswith("#")]
    # PyTorch's CPU build first (issue 56: a plain install resolved CUDA's 6.8 GB), the GPU one beside it
    assert commands[0] == "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu"
    assert "--index-url https://download.pytorch.org/whl/cu" in quick_start.split(commands[0], 1)[1].split("\n")[1]
    assert commands[1].startswith('pip install -e ".[test]" && clef score sample_data/records.jsonl')
    quick_loop, everything = commands[2], commands[3]
    assert quick_loop == "python -m pytest -q"  # the default selection: pyproject.toml's addopts
    assert everything == 'python -m pytest -q -m "slow or not slow"'
    ci = (ROOT / ".ci" / "run").read_text()
    assert everything in ci.splitlines()


def test_the_default_test_selection_is_the_quick_loop():
    pyproject = (ROOT / "pyproject.toml").read_text()
    section = pyproject.split("[tool.pytest.ini_options]", 1)[1].split("\n[", 1)[0]
    assert 'addopts = ["-m", "not slow"]' in section.splitlines()


def test_every_command_has_help_text():
    runner = CliRunner()
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0
    for command in ("score", "inspect-spans", "checkpoint"):
        line = next(line for line in top.stdout.splitlines() if line.strip().startswith(command))
        assert len(line.split(None, 1)) == 2, line
    for args in (["score", "--help"], ["inspect-spans", "--help"], ["checkpoint", "info", "--help"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0 and "Usage:" in result.stdout
        assert "--help" in result.stdout


def test_the_mutation_command_runs_a_modules_importers_against_only_that_module():
    """tools/mutate.py (docs/development.md): a module's tests are the files importing it (by dotted
    name or `from package import module`), and mutmut is told that module and those files alone."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mutate", ROOT / "tools" / "mutate.py")
    mutate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mutate)
    assert "tests/test_column_mapping.py" in mutate.tests_for(Path("clef_cli/inputs/columns.py"))
    assert "tests/test_s3_media.py" in mutate.tests_for(Path("clef_cli/locations/object_store.py"))  # from-import
    assert "tests/test_s3_media.py" not in mutate.tests_for(Path("clef_cli/inputs/columns.py"))
    assert "tests/test_architecture.py" not in mutate.tests_for(Path("clef_cli/locations/fence.py"))  # reads text
    text = mutate.with_selection((ROOT / "pyproject.toml").read_text(), [Path("clef_cli/inputs/columns.py")], ["t.py"])
    section = text.split("[tool.mutmut]\n", 1)[1].split("\n[", 1)[0].splitlines()
    assert section[0] == 'only_mutate = ["clef_cli/inputs/columns.py"]'
    assert section[1] == 'pytest_add_cli_args_test_selection = ["t.py"]'
    assert 'source_paths = ["clef_cli"]' in section


def test_a_resumed_mutation_run_keeps_only_the_caught_mutants(tmp_path):
    """tools/mutate.py --resume: killed (1) and timed-out (-24) mutants keep their result in the
    fresh copy; survived (0), no tests (33) and untried (None) run again against today's tests."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("mutate", ROOT / "tools" / "mutate.py")
    mutate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mutate)
    codes = {"m.x_f__mutmut_1": 1, "m.x_f__mutmut_2": 0, "m.x_f__mutmut_3": 33, "m.x_f__mutmut_4": -24}
    meta = tmp_path / "old" / "mutants" / "clef_cli" / "m.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": {**codes, "m.x_f__mutmut_5": None}, "hash_by_function_name": {}}))
    mutate.carry_results(tmp_path / "new", mutate.earlier_results(tmp_path / "old"))
    carried = json.loads((tmp_path / "new" / "mutants" / "clef_cli" / "m.py.meta").read_text())
    assert carried["exit_code_by_key"] == {
        "m.x_f__mutmut_1": 1,
        "m.x_f__mutmut_2": None,
        "m.x_f__mutmut_3": None,
        "m.x_f__mutmut_4": -24,
        "m.x_f__mutmut_5": None,
    }
    assert carried["hash_by_function_name"] == {}  # the rest of the record as it was


def test_the_max_length_defaults_read_as_each_family_has_them():
    """`--max-length`'s default is the family's (issue 56: docs/scoring.md gave 64000 for every
    family); the help and the docs name each family's own figure, read from the code."""
    from clef_cli.families.dense import DenseFamily
    from clef_cli.families.omni import OmniFamily

    omni, dense = OmniFamily.default_max_length, DenseFamily.default_max_length
    assert omni != dense
    scoring = " ".join((ROOT / "docs" / "scoring.md").read_text().split())
    assert f"{omni} tokens for Clef-Omni, {dense} for the dense Clef and Clef-Flash" in scoring
    help_text = " ".join(CliRunner().invoke(app, ["score", "--help"], terminal_width=200).stdout.split())
    assert f"({omni} Clef-Omni, {dense} Clef/Clef-Flash)" in help_text
