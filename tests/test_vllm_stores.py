"""A vLLM store gets its missing states from vLLM (issue 36.4): `--rehead` on an `--engine vllm
--hidden-states drop` store computes them through the store's own engine (no --engine needed),
names the engine in its output, and equals the HF engine's rehead within 1e-5 (fp32); train-head
`--records` then trains from them. Slow: vLLM starts (CLEF_VLLM_PYTHON, as test_vllm_engine.py)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from tests.helpers import assert_same_rows, write_jsonl
from tests.test_checkpoint import records, second_head_release
from tests.test_keep_policy import gold_rows
from tests.test_vllm_engine import vllm_python

COUNT = 6


def score(release, inputs, output, *extra):
    args = ["score", str(inputs), "-o", str(output), "--model", str(release), "--device", "cpu", "--dtype", "float32",
            "--workers", "0", "--quiet", *extra]  # fmt: skip
    return CliRunner().invoke(app, args)


@pytest.mark.slow
def test_rehead_and_train_head_on_a_vllm_drop_store(tmp_path, monkeypatch):
    from tests.vllm_release import cached_release

    monkeypatch.setenv("CLEF_VLLM_PYTHON", vllm_python())
    release = cached_release()
    inputs = write_jsonl(tmp_path / "in.jsonl", records(COUNT))
    vllm_out, hf_out = tmp_path / "vllm.parquet", tmp_path / "hf.parquet"
    first = score(release, inputs, vllm_out, "--engine", "vllm", "--hidden-states", "drop", "--cpu-kv-cache-gib", "1")
    assert first.exit_code == 0, first.output
    # the oracle: the HF engine keeps every state, in fp32 as the states computed on demand here
    assert score(release, inputs, hf_out, "--hidden-dtype", "float32").exit_code == 0
    head = second_head_release(tmp_path) and tmp_path / "head-b"
    reheaded = {}
    for name, out in (("vllm", vllm_out), ("hf", hf_out)):
        target = tmp_path / f"{name}-b.parquet"
        done = score(release, inputs, target, "--checkpoint", f"{out}.ckpt", "--rehead", str(head),
                     "--hidden-dtype", "float32")  # fmt: skip
        assert done.exit_code == 0, done.output
        reheaded[name] = target
    metadata = pq.read_schema(reheaded["vllm"]).metadata
    assert metadata[b"clef.engine"] == b"vllm" and metadata[b"clef.rehead_states_computed"] == str(COUNT).encode()
    assert_same_rows(pq.read_table(reheaded["vllm"]).to_pylist(), pq.read_table(reheaded["hf"]).to_pylist(), 1e-5)

    gold = write_jsonl(tmp_path / "gold.jsonl", gold_rows(COUNT))
    common = ["--gold", str(gold), "--folds", "2", "--epochs", "1", "--device", "cpu", "--force", "--quiet"]
    trained = CliRunner().invoke(app, ["train-head", f"{vllm_out}.ckpt", "-o", str(tmp_path / "trained"), *common,
                                       "--records", str(inputs)])  # fmt: skip
    assert trained.exit_code == 0, trained.output
    report = json.loads((tmp_path / "trained" / "training_report.json").read_text())
    assert report["states_computed"]["records"] == 0  # the rehead stored them all
