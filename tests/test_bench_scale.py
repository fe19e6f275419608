"""bench_scale.py, bench_media_night.py, scale_ray.py and scale_dry_run.py run end to end at a
tiny size, so the scripts that measure issue 39's goals never rot (CI's whole run; minutes of
start-up on 2 cores)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks" / "scale"


def run(script: str, *args: str, tmp_path: Path) -> dict:
    out = tmp_path / f"{script}.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args, "--folder", str(tmp_path), "--json", str(out)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_bench_scale_smoke(tmp_path):
    report = run("bench_scale.py", "--sizes", "200,400", "--info-keys", "25000", tmp_path=tmp_path)
    for size in ("200", "400"):
        first, second = report["sizes"][size]["night1"], report["sizes"][size]["night2"]
        assert first["run"] == int(size) and first["reused"] == 0
        assert second["run"] == int(size) // 100 and second["reused"] == int(size)
        assert set(first["stage_us_per_record"]) == {"read", "key", "plan", "forward", "commit", "output", "other"}
        assert first["peak_rss_mib"] > 100 and first["job_cpu_s"] > 0
    assert set(report["stores"]) == {"400", "25000"}
    assert all(store["info_s"] > 0 and store["prune_s"] > 0 for store in report["stores"].values())


@pytest.mark.slow
def test_bench_media_night_smoke(tmp_path):
    report = run("bench_media_night.py", "--images", "100", "--videos", "100", tmp_path=tmp_path)
    for kind in ("image", "video"):
        nights = report[kind]["nights"]
        assert nights["night1"]["run"] == 100 and nights["night2"]["reused"] == 100
        # the stat cache spares reading the media again; --verify-media reads every file
        saved = nights["night2_verify_media"]["read_bytes"] - nights["night2"]["read_bytes"]
        assert saved >= 0.9 * report[kind]["media_bytes"]


def run_plain(script: str, *args: str, tmp_path: Path) -> dict:
    """The scripts without a --folder (they work in a temporary one)."""
    out = tmp_path / f"{script}.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args, "--json", str(out)],
                          capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_scale_ray_smoke(tmp_path):
    """The --ray driver's memory benchmark: a local cluster, one simulated actor, every record run."""
    report = run_plain("scale_ray.py", "--sizes", "300", tmp_path=tmp_path)
    assert report["300"]["run"] == 300 and report["300"]["driver_peak_rss_mib"] > 100
    assert set(report["300"]["driver_peak_mib"]) == {"RssAnon", "RssFile", "RssShmem"}


@pytest.mark.slow
def test_scale_dry_run_smoke(tmp_path):
    report = run_plain("scale_dry_run.py", "--records", "400", "--base", "100", "--workers", "0,1", tmp_path=tmp_path)
    assert report["0"]["run"]["records"] == 400 and report["0"]["base"]["records"] == 100
    assert report["1"]["run"]["workers_cpu_s"] > 0 and report["0"]["run"]["workers_cpu_s"] < 0.5
