"""benchmarks/store/bench_nightly.py runs with small numbers, and its figures match a direct
computation (tokens x (hidden x bytes + a 4-byte id); tokens / rate / 3600)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_bench_nightly_figures_match_a_direct_computation(tmp_path):
    out = tmp_path / "nightly.json"
    arguments = ["--records", "1000", "3000", "--tokens", "120", "--hidden", "64", "--bytes-per-value", "4",
                 "--tokens-per-second", "500", "--uncertain-share", "0.2", "--keep-sample", "0.05"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "store" / "bench_nightly.py"), *arguments, "--json", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert [item["records"] for item in figures] == [1000, 3000]
    for item in figures:
        tokens = item["records"] * 120
        assert item["tokens"] == tokens
        assert item["bytes_keep"] == tokens * (64 * 4 + 4)
        assert item["bytes_selective"] == round(tokens * 260 * (0.2 + 0.8 * 0.05))
        assert item["bytes_drop"] == 0
        assert item["recompute_gpu_hours"] == pytest.approx(tokens / 500 / 3600)
        assert item["selective_recompute_gpu_hours"] == pytest.approx(tokens / 500 / 3600 * (1 - 0.24))
    assert "1,000 records, 120,000 tokens: keep" in done.stdout


def test_the_default_night_is_the_issues_arithmetic():
    """500k records of 1,500 tokens at 2048 x 2 bytes: about 3 TB; 1M records: about 6 TB."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "store" / "bench_nightly.py")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("500,000 records, 750,000,000 tokens: keep 3.08 TB")
    assert lines[2].startswith("1,000,000 records, 1,500,000,000 tokens: keep 6.15 TB")
    assert "recompute every state 5.2 GPU-hours" in lines[1]
