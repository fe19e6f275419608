"""`clef score --engine vllm` (issue 33): vLLM as the backbone in its own environment, through
the one job lifecycle. The slow tests need vLLM's Python in $CLEF_VLLM_PYTHON (.ci/vllm_venv.sh
builds it); in CI (`CI=true`) its absence fails them. The oracle is our HF engine, in fp32, on a
vLLM-ready tiny release (tests/support/vllm_release.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from tests.support.helpers import FIXTURES, SAMPLE_DATA, TINY_MODEL, in_ci

TINY_DENSE = FIXTURES / "tiny-clef-dense"

BOUND = 1e-5
TEXT_IDS = ("ticket-001", "ticket-002", "ticket-006", "ticket-007", "mod-001", "mod-002", "mod-006", "mod-007")
IMAGE_IDS = ("ticket-003", "ticket-005", "ticket-009")  # ticket-003: the 1.4e-2 gap of issue 33
AUDIO_IDS = ("ticket-004", "mod-008")
IMAGE_AND_AUDIO_IDS = ("ticket-008",)
VIDEO_IDS = ("mod-005",)  # a video without a soundtrack
AUDIO_IN_VIDEO_IDS = ("mod-003", "mod-004")


def vllm_python() -> str:
    """$CLEF_VLLM_PYTHON, or a skip (a failure in CI)."""
    python = os.environ.get("CLEF_VLLM_PYTHON", "")
    if python and Path(python).is_file():
        return python
    if in_ci():
        pytest.fail("CLEF_VLLM_PYTHON is not set to vLLM's Python; .ci/run builds it with .ci/vllm_venv.sh")
    pytest.skip("CLEF_VLLM_PYTHON is not set (build vLLM's venv with .ci/vllm_venv.sh)")


@pytest.fixture(scope="module")
def vllm_release(tmp_path_factory) -> Path:
    from tests.support.vllm_release import cached_release

    return cached_release()


def rows(path: Path) -> dict[str, dict]:
    return {row["id"]: row for row in pq.read_table(path).to_pylist()}


def write_records(folder: Path, ids: tuple[str, ...], extra: list[dict] = ()) -> Path:
    """The sample records with these ids (media paths made absolute), plus `extra`."""
    path = folder / "records.jsonl"
    lines = [json.loads(line) for line in (SAMPLE_DATA / "records.jsonl").read_text().splitlines()]
    chosen = [record for record in lines if record["id"] in ids] + list(extra)
    path.write_text("".join(json.dumps(record) + "\n" for record in chosen))
    for name in ("media",):
        if (SAMPLE_DATA / name).exists() and not (folder / name).exists():
            shutil.copytree(SAMPLE_DATA / name, folder / name)
    return path


def score(release: Path, inputs: Path, out: Path, *options: str) -> tuple[int, str]:
    args = ["score", str(inputs), "-o", str(out), "--model", str(release), "--device", "cpu", "--dtype", "float32"]
    result = CliRunner().invoke(app, [*args, "--workers", "0", "--quiet", *options])
    return result.exit_code, result.output


def assert_parity(got: dict[str, dict], want: dict[str, dict], ids) -> float:
    """Same answers, token counts and probabilities within BOUND; returns the worst difference."""
    worst = 0.0
    for record_id in ids:
        a, b = got[record_id], want[record_id]
        assert a["error"] is None and b["error"] is None, (a["error"], b["error"])
        assert a["prompt_tokens"] == b["prompt_tokens"], record_id
        for x, y in zip(a["answers"], b["answers"], strict=True):
            assert x["answer"] == y["answer"], record_id
            for p, q in zip(x["labels"], y["labels"], strict=True):
                assert p["label"] == q["label"]
                worst = max(worst, abs(p["probability"] - q["probability"]))
    assert worst <= BOUND, worst
    return worst


def test_vllm_options_need_the_vllm_engine(tmp_path):
    code, output = score(TINY_MODEL, SAMPLE_DATA / "records.jsonl", tmp_path / "out.parquet", "--max-model-len", "512")
    assert code == 2 and "--max-model-len applies to the vLLM engine only" in output


def test_a_model_vllm_does_not_serve_is_refused_at_start(tmp_path, monkeypatch):
    """Qwen3.5-MoE (`qwen3_5_moe`) is not proven exact on vLLM: refused before anything is written
    (here a copy of the tiny dense release named a MoE: the refusal reads only config.json)."""
    moe = tmp_path / "tiny-moe"
    shutil.copytree(TINY_DENSE, moe)
    config = json.loads((moe / "config.json").read_text())
    (moe / "config.json").write_text(json.dumps({**config, "model_type": "qwen3_5_moe"}))
    monkeypatch.setenv("CLEF_VLLM_PYTHON", "/nonexistent/python")
    code, output = score(moe, SAMPLE_DATA / "records.jsonl", tmp_path / "o.parquet", "--engine", "vllm")
    assert code == 2 and "'qwen3_5_moe'" in output and "is not proven exact" in output, output
    assert "serves Clef-Omni and Clef / Clef-Flash (dense Qwen3.5) only (model_type qwen3_omni_moe, qwen3_5)" in output
    assert not (tmp_path / "o.parquet.ckpt").exists()  # before any work


def test_the_engine_is_part_of_the_scoring_fingerprint(tmp_path):
    from clef_cli.job.lifecycle import job_manifest
    from clef_cli.release import resolve_release
    from tests.support.helpers import settings_for

    release = resolve_release(str(TINY_MODEL))
    hf = job_manifest(settings_for(tmp_path), release, "float32", release.path)
    vllm = job_manifest(settings_for(tmp_path, engine="vllm"), release, "float32", release.path)
    assert hf["settings"] == {"dtype": "float32"}  # HF stores keep the fingerprint they had
    assert vllm["settings"] == {"dtype": "float32", "engine": "vllm"}


def vllm_env() -> dict[str, str]:
    return {**os.environ, "CLEF_VLLM_PYTHON": vllm_python()}


@pytest.fixture(scope="module")
def parity_runs(tmp_path_factory, vllm_release):
    """One HF run and one vLLM run over text, image, audio, image+audio and video records."""
    python = vllm_python()
    folder = tmp_path_factory.mktemp("parity")
    media = IMAGE_IDS + AUDIO_IDS + IMAGE_AND_AUDIO_IDS + VIDEO_IDS + AUDIO_IN_VIDEO_IDS
    inputs = write_records(folder, TEXT_IDS + media)
    code, output = score(vllm_release, inputs, folder / "hf.parquet", "--hidden-states", "drop")
    assert code == 0, output
    previous = os.environ.get("CLEF_VLLM_PYTHON")
    os.environ["CLEF_VLLM_PYTHON"] = python
    try:
        options = ("--engine", "vllm", "--hidden-dtype", "float32", "--stats-json", str(folder / "stats.json"))
        code, output = score(vllm_release, inputs, folder / "vllm.parquet", *options)
    finally:
        if previous is None:
            os.environ.pop("CLEF_VLLM_PYTHON")
        else:
            os.environ["CLEF_VLLM_PYTHON"] = previous
    assert code == 0, output
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(
    "ids",
    [TEXT_IDS, IMAGE_IDS, AUDIO_IDS, IMAGE_AND_AUDIO_IDS, VIDEO_IDS, AUDIO_IN_VIDEO_IDS],
    ids=["text", "image", "audio", "image+audio", "video", "audio-in-video"],
)
def test_vllm_engine_equals_the_hf_engine_per_modality(parity_runs, ids):
    """fp32: the same answers, prompt lengths (vLLM's expanded ids equal ours, or the record
    fails) and probabilities within 1e-5."""
    worst = assert_parity(rows(parity_runs / "vllm.parquet"), rows(parity_runs / "hf.parquet"), ids)
    print(f"worst probability difference: {worst:.3g}")


@pytest.mark.slow
def test_vllm_output_names_the_engine_and_stores_hidden_states(parity_runs, tmp_path):
    """Provenance, --stats-json, the engine in the store's fingerprint, and the stored hidden
    states: --rehead with the same head on the vLLM store gives the vLLM run's results."""
    metadata = pq.read_schema(parity_runs / "vllm.parquet").metadata
    assert metadata[b"clef.engine"] == b"vllm" and metadata[b"clef.vllm_version"] == b"0.32.0"
    assert json.loads((parity_runs / "stats.json").read_text())["records"] == 17
    assert json.loads((parity_runs / "vllm.parquet.ckpt" / "manifest.json").read_text())["settings"]["engine"] == "vllm"
    from tests.support.vllm_release import cached_release

    result = CliRunner().invoke(
        app,
        [
            "score",
            str(parity_runs / "records.jsonl"),
            "-o",
            str(tmp_path / "rehead.parquet"),
            "--checkpoint",
            str(parity_runs / "vllm.parquet.ckpt"),
            "--rehead",
            str(cached_release()),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    scored = TEXT_IDS + IMAGE_IDS + AUDIO_IDS + IMAGE_AND_AUDIO_IDS + VIDEO_IDS + AUDIO_IN_VIDEO_IDS
    assert_parity(rows(tmp_path / "rehead.parquet"), rows(parity_runs / "vllm.parquet"), scored)


@pytest.mark.slow
def test_vllm_refusals_are_record_errors_and_batches_do_not_matter(tmp_path, vllm_release, monkeypatch):
    """A record longer than --max-model-len is that record's `overflow` error; the rest score,
    alone (--max-batch-size 1) or in one batch, alike and as the HF engine does; a rerun with a
    larger limit scores it (the refusal was not stored as final)."""
    monkeypatch.setenv("CLEF_VLLM_PYTHON", vllm_python())
    ids = ("ticket-001", "ticket-002", "ticket-006", "mod-002", "mod-007")
    inputs = write_records(tmp_path, ids)
    code, output = score(vllm_release, inputs, tmp_path / "hf.parquet", "--hidden-states", "drop")
    assert code == 0, output
    lengths = {row["id"]: row["prompt_tokens"] for row in rows(tmp_path / "hf.parquet").values()}
    longest = max(ids, key=lambda i: lengths[i])
    cap = str(max(lengths[i] for i in ids if i != longest))
    fine = [i for i in ids if i != longest]
    outputs = {}
    for name, size in (("batched", "64"), ("alone", "1")):
        options = ("--engine", "vllm", "--max-model-len", cap, "--max-batch-size", size, "--hidden-states", "drop")
        code, output = score(vllm_release, inputs, tmp_path / f"{name}.parquet", *options)
        assert code == 3, output  # a record failed, the job went on
        outputs[name] = rows(tmp_path / f"{name}.parquet")
        assert "more than vLLM's max_model_len" in outputs[name][longest]["error"]
        assert outputs[name][longest]["error_kind"] == "overflow"
        assert_parity(outputs[name], rows(tmp_path / "hf.parquet"), fine)
    assert_parity(outputs["alone"], outputs["batched"], fine)
    raised = ("--engine", "vllm", "--hidden-states", "drop", "--cpu-kv-cache-gib", "1")  # the release's own limit
    code, output = score(vllm_release, inputs, tmp_path / "batched.parquet", *raised)
    assert code == 0, output
    assert_parity(rows(tmp_path / "batched.parquet"), rows(tmp_path / "hf.parquet"), ids)


def journal_records(checkpoint: Path) -> int:
    journal = checkpoint / "journal.jsonl"
    total = 0
    for line in journal.read_text().splitlines() if journal.exists() else []:
        with contextlib.suppress(json.JSONDecodeError, KeyError):
            total += json.loads(line)["records"]
    return total


@pytest.mark.slow
def test_vllm_job_killed_mid_run_resumes_to_the_same_output(tmp_path, vllm_release):
    """SIGKILL after the first commits; the rerun computes only the rest (its worker, orphaned by
    the kill, has gone: its pipe closed) and writes what an uninterrupted run writes."""
    import signal
    import subprocess
    import sys
    import time

    inputs = write_records(tmp_path, TEXT_IDS)
    output = tmp_path / "out.parquet"
    command = [sys.executable, "-m", "clef_cli", "score", str(inputs), "-o", str(output), "--model", str(vllm_release)]
    command += ["--device", "cpu", "--dtype", "float32", "--workers", "0", "--quiet", "--engine", "vllm"]
    command += ["--max-batch-size", "1", "--hidden-states", "drop"]
    env = {**vllm_env(), "CLEF_TEST_SLOW_COMMIT": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while journal_records(output.with_name("out.parquet.ckpt")) < 2:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    rerun_finishes_as_hf(command, output, vllm_release, inputs, tmp_path)


def rerun_finishes_as_hf(command: list[str], output: Path, release: Path, inputs: Path, folder: Path) -> None:
    """After an interruption with some batches committed: the rerun computes only the rest, and
    its output equals the HF engine's (which an uninterrupted vLLM run equals)."""
    import subprocess

    committed = journal_records(output.with_name(output.name + ".ckpt"))
    assert 2 <= committed < len(TEXT_IDS) and not output.exists()
    done = subprocess.run(command, env=vllm_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"{len(TEXT_IDS) - committed} run through the model, {committed} from the checkpoint" in done.stderr
    code, log = score(release, inputs, folder / "hf.parquet", "--hidden-states", "drop")
    assert code == 0, log
    assert_parity(rows(output), rows(folder / "hf.parquet"), TEXT_IDS)
