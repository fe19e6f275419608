"""Optional test dependencies: a missing Ray skips its tests locally but fails them in CI."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from .support.helpers import GOLDEN_BUILD, golden_build, golden_mismatches, require_program, require_ray


@pytest.mark.parametrize("ci", ["true", "1"])
def test_a_missing_ray_fails_under_ci(monkeypatch, ci):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    monkeypatch.setenv("CI", ci)
    with pytest.raises(ImportError):
        require_ray()


def test_a_missing_ray_skips_outside_ci(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        require_ray()


def test_the_tight_golden_bounds_apply_to_the_pinned_release_whatever_its_local_build(monkeypatch):
    asked = os.environ.get("CLEF_GOLDEN_TOLERANCE", "")  # as the bounds of this session were chosen
    assert GOLDEN_BUILD is (asked == "tight" or (asked != "loose" and not golden_mismatches()))
    monkeypatch.delenv("CLEF_GOLDEN_TOLERANCE", raising=False)
    monkeypatch.setenv("CI", "true")
    # the golden values were made with torch 2.14.1+cu130; the CPU wheel says 2.14.1
    for torch in ("2.14.1", "2.14.1+cu130", "2.14.1+cpu"):
        assert golden_mismatches({"torch": torch, "transformers": "5.24.0"}) == []
        assert golden_build({"torch": torch, "transformers": "5.22.2"}) is True


@pytest.mark.parametrize(("torch", "transformers"), [("2.13.0", "5.24.0"), ("2.14.1", "5.23.0")])
def test_a_fall_back_to_the_loose_bounds_fails_in_ci_unless_asked_for(monkeypatch, torch, transformers):
    installed = {"torch": torch, "transformers": transformers}
    monkeypatch.delenv("CLEF_GOLDEN_TOLERANCE", raising=False)
    monkeypatch.delenv("CI", raising=False)
    assert golden_build(installed) is False  # outside CI: the loose bounds, quietly
    monkeypatch.setenv("CI", "true")
    with pytest.raises(RuntimeError, match="would fall back to their loose bounds"):
        golden_build(installed)
    monkeypatch.setenv("CLEF_GOLDEN_TOLERANCE", "loose")
    assert golden_build(installed) is False


def test_a_missing_program_fails_under_ci_and_skips_outside(monkeypatch):
    monkeypatch.setenv("PATH", "")  # no chromium anywhere
    monkeypatch.setenv("CI", "true")
    with pytest.raises(BaseException) as raised:  # a skip is a BaseException too: it must not be one
        require_program("chromium")
    assert raised.type is pytest.fail.Exception and "chromium is not installed; CI needs it" in str(raised.value)
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        require_program("chromium")


def test_no_test_module_skips_an_optional_tool_by_itself():
    """Optional tools go through `require`/`require_ray`/`require_program`, which fail in CI; a bare
    importorskip or skipif would let CI pass with the tests skipped."""
    from pathlib import Path

    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        text = path.read_text(encoding="utf-8")
        assert "importorskip(" not in text and "mark.skipif(" not in text, path.name
        assert 'which("chromium")' not in text, path.name  # require_program("chromium")


def test_the_newest_releases_pass_holds_an_unknown_transformers_to_the_tight_bounds(monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("CLEF_GOLDEN_TOLERANCE", "tight")
    assert golden_build({"torch": "2.14.1", "transformers": "5.99.0"}) is True


def test_cis_first_pass_pins_transformers_to_a_cross_checked_release():
    """.ci/run's whole-suite pass installs with .ci/cross-checked.txt: its transformers (with the
    torch of .ci/torch.txt) must be one the golden values' tight bounds accept by meta.json alone."""
    ci = Path(__file__).parent.parent / ".ci"

    def pins(name: str) -> dict[str, str]:
        lines = (ci / name).read_text().splitlines()
        return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))

    installed = {"torch": pins("torch.txt")["torch"], "transformers": pins("cross-checked.txt")["transformers"]}
    assert golden_mismatches(installed) == []
