"""Optional test dependencies: a missing Ray skips its tests locally but fails them in CI."""

from __future__ import annotations

import sys

import pytest

from .helpers import require_ray


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
