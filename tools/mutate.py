"""Mutation testing of the modules a change touches, against only their tests (mutmut 3).

    python tools/mutate.py clef_cli/inputs/columns.py clef_cli/inputs/listing.py
    python tools/mutate.py --changed main              # every clef_cli module changed since main
    python tools/mutate.py clef_cli/store/x.py --tests tests/test_store.py
    python tools/mutate.py clef_cli/store/remote/segments.py --tests tests/test_store_in_memory.py --only
    python tools/mutate.py clef_cli/locations/*.py --tests ... --only --resume   # after new tests

A module's tests are the test files that import it (by its dotted name), plus any `--tests`
(`--only`: the `--tests` alone, e.g. store/remote/'s in-process tests without the moto ones).
mutmut runs in a scratch copy of the working tree (it writes its `mutants/` folder beside the
code), the static settings from pyproject.toml's [tool.mutmut] and the modules and tests given
here, under `nice`, one mutant at a time by default (`--max-children`); a test's subprocesses
run the unmutated copy (only in-process tests kill mutants). It prints killed / survived / timed
out / no tests per module and the survivors' names; `mutmut show NAME` run in the scratch folder
shows one's diff. `--resume` carries the scratch folder's earlier results into the fresh copy:
mutants killed (or timed out) stay so where their function is unchanged, and only the others
(survived, no tests, not yet tried) run again, against the tests as they are now.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEFT_OUT = shutil.ignore_patterns(
    ".git", "mutants", "__pycache__", ".pytest_cache", ".ruff_cache", "venv", "*.egg-info"
)
"""Left out of the scratch copy: what git ignores that is large or rebuilt (.ci/venv among them)."""
SOURCE_READERS = ("tests/test_architecture.py",)
"""Test files that read the modules' text (sizes, imports) rather than run them: mutmut's copy of a
module, every mutant beside the original, fails them before any mutant is tried."""
CAUGHT = (1, -24)
"""mutmut's exit codes kept by `--resume`: a test failed (killed), the tests ran past their time."""
STATUSES = ("killed", "survived", "timeout", "no tests", "suspicious", "skipped", "not checked")


def dotted(module: Path) -> str:
    """`clef_cli/inputs/columns.py` -> `clef_cli.inputs.columns`."""
    parts = module.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def tests_for(module: Path, root: Path = ROOT) -> list[str]:
    """The test files that import `module`: `clef_cli.a.b` by name, or `from clef_cli.a import b`
    (not the `SOURCE_READERS`)."""
    name = dotted(module)
    package, _, leaf = name.rpartition(".")
    patterns = [re.compile(rf"\b{re.escape(name)}\b")]
    if package:
        patterns.append(re.compile(rf"from {re.escape(package)} import [^\n]*\b{re.escape(leaf)}\b"))
    return sorted(
        path.relative_to(root).as_posix()
        for path in (root / "tests").glob("test_*.py")
        if any(pattern.search(path.read_text(encoding="utf-8")) for pattern in patterns)
        and path.relative_to(root).as_posix() not in SOURCE_READERS
    )


def changed_modules(ref: str) -> list[Path]:
    names = subprocess.run(
        ["git", "diff", "--name-only", ref, "--", "clef_cli"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [Path(name) for name in names if name.endswith(".py") and (ROOT / name).exists()]


def with_selection(pyproject: str, modules: list[Path], tests: list[str]) -> str:
    """pyproject.toml's text, its [tool.mutmut] told which modules to mutate and which tests to run."""
    chosen = (
        f"only_mutate = {json.dumps([module.as_posix() for module in modules])}\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
    )
    if "[tool.mutmut]\n" not in pyproject:
        raise SystemExit("pyproject.toml has no [tool.mutmut] table")
    return pyproject.replace("[tool.mutmut]\n", "[tool.mutmut]\n" + chosen, 1)


def scratch_copy(scratch: Path, modules: list[Path], tests: list[str]) -> None:
    """The working tree in `scratch`, its [tool.mutmut] told which modules and tests."""
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(ROOT, scratch, ignore=LEFT_OUT)
    pyproject = scratch / "pyproject.toml"
    pyproject.write_text(with_selection(pyproject.read_text(encoding="utf-8"), modules, tests), encoding="utf-8")


def earlier_results(scratch: Path) -> dict[Path, dict]:
    """The scratch folder's mutmut records (`mutants/**/*.meta`), each cut to its caught mutants."""
    found = {}
    for meta in (scratch / "mutants").rglob("*.meta"):
        record = json.loads(meta.read_text(encoding="utf-8"))
        codes = record.get("exit_code_by_key", {})
        record["exit_code_by_key"] = {name: (code if code in CAUGHT else None) for name, code in codes.items()}
        found[meta.relative_to(scratch)] = record
    return found


def carry_results(scratch: Path, records: dict[Path, dict]) -> None:
    for relative, record in records.items():
        target = scratch / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(record, indent=4), encoding="utf-8")


def results(scratch: Path) -> dict[str, str]:
    """Mutant name -> status, as `mutmut results --all true` prints them."""
    done = subprocess.run(
        ["mutmut", "results", "--all", "true"], cwd=scratch, capture_output=True, text=True, check=True
    )
    found = {}
    for line in done.stdout.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name and status in STATUSES:
            found[name] = status
    return found


def report(found: dict[str, str], modules: list[Path]) -> None:
    for module in modules:
        prefix = dotted(module) + "."
        counts = Counter(status for name, status in found.items() if name.startswith(prefix))
        total = sum(counts.values())
        score = f"{100 * counts['killed'] / total:.0f}% killed" if total else "no mutants"
        shown = ", ".join(f"{counts[status]} {status}" for status in STATUSES if counts[status])
        print(f"{module.as_posix()}: {total} mutants, {score} ({shown})")
    survivors = sorted(name for name, status in found.items() if status != "killed")
    if survivors:
        print("not killed (`mutmut show NAME` in the scratch folder):")
        print("\n".join(f"  {name}: {found[name]}" for name in survivors))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", type=Path, help="clef_cli/... .py files to mutate")
    parser.add_argument("--changed", metavar="REF", help="also every clef_cli module changed since REF (git diff)")
    parser.add_argument("--tests", nargs="*", default=[], help="more test files to run against the mutants")
    parser.add_argument("--only", action="store_true", help="run only the --tests, not the files importing the modules")
    parser.add_argument("--max-children", type=int, default=1, help="mutants tested at once (default 1)")
    parser.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()) / "clef-mutate")
    parser.add_argument("--resume", action="store_true", help="keep the killed mutants of --scratch; try the rest")
    args = parser.parse_args(argv)
    modules = [*args.modules, *(changed_modules(args.changed) if args.changed else [])]
    modules = sorted({Path(module).resolve().relative_to(ROOT) for module in modules})
    if not modules:
        parser.error("name the modules to mutate, or --changed REF")
    found = [] if args.only else [test for module in modules for test in tests_for(module)]
    tests = sorted({*args.tests, *found})
    if not tests:
        parser.error("no test file imports these modules: name them with --tests")
    print(f"mutating {len(modules)} module(s) against {len(tests)} test file(s): {' '.join(tests)}", flush=True)
    earlier = earlier_results(args.scratch) if args.resume else {}
    scratch_copy(args.scratch, modules, tests)
    carry_results(args.scratch, earlier)
    run = ["nice", "-n", "19", "mutmut", "run", "--max-children", str(args.max_children)]
    # a test's own `python -m clef_cli` or `python -c` imports the scratch copy's clef, unmutated
    # (mutmut's trampolines fail outside its folder), never another checkout or an installed clef
    env = {**os.environ, "PYTHONPATH": str(args.scratch)}
    subprocess.run(run, cwd=args.scratch, env=env, check=False)
    report(results(args.scratch), modules)
    return 0


if __name__ == "__main__":
    sys.exit(main())
