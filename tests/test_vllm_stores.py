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
from tests.support.helpers import assert_same_rows, write_jsonl
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
    from tests.support.vllm_release import cached_release

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


BUCKET = "clef-vllm-store"


@pytest.mark.slow
def test_a_vllm_job_keeps_its_store_in_a_bucket_and_night_two_reuses_it_from_a_fresh_cache(
    store_bucket, proxy, tmp_path, monkeypatch
):
    """`--engine vllm --checkpoint s3://…`: the job's shards go to the bucket through the one store
    code; night 2 on a fresh machine (another cache folder) runs nothing and writes the same
    output, and a rehead from a third machine reads the vLLM states from the bucket."""
    from clef_cli.locations import buckets
    from clef_cli.store.remote import manifests
    from tests.support.vllm_release import cached_release

    monkeypatch.setenv("CLEF_VLLM_PYTHON", vllm_python())
    release = cached_release()
    inputs = write_jsonl(tmp_path / "in.jsonl", records(COUNT))
    store = f"s3://{BUCKET}/vllm/"
    options = ("--checkpoint", store, "--hidden-dtype", "float32")
    outputs = {}
    for machine, extra in (("one", ("--engine", "vllm", "--cpu-kv-cache-gib", "1")), ("two", ("--engine", "vllm"))):
        monkeypatch.setenv("CLEF_CACHE_DIR", str(tmp_path / machine))
        buckets.forget()
        manifests.forget()
        proxy.clear()
        outputs[machine] = tmp_path / f"{machine}.parquet"
        done = score(release, inputs, outputs[machine], *options, *extra)
        assert done.exit_code == 0, done.output
    assert f"0 run through the model, {COUNT} from the checkpoint" in done.stderr, done.stderr
    assert not any(path.endswith(".hidden") for method, path in proxy.requests if method == "GET")
    assert_same_rows(pq.read_table(outputs["two"]).to_pylist(), pq.read_table(outputs["one"]).to_pylist(), 1e-6)
    listed = store_bucket.list_objects_v2(Bucket=BUCKET, Prefix="vllm/manifests/")["Contents"]
    latest = max(item["Key"] for item in listed)
    manifest = json.loads(store_bucket.get_object(Bucket=BUCKET, Key=latest)["Body"].read())
    assert manifest["fingerprint"]["settings"]["engine"] == "vllm"
    monkeypatch.setenv("CLEF_CACHE_DIR", str(tmp_path / "three"))
    buckets.forget()
    manifests.forget()
    proxy.clear()
    reheaded = tmp_path / "rehead.parquet"
    done = score(release, inputs, reheaded, "--checkpoint", store, "--rehead", str(release))
    assert done.exit_code == 0, done.output
    assert pq.read_schema(reheaded).metadata[b"clef.engine"] == b"vllm"
    assert_same_rows(pq.read_table(reheaded).to_pylist(), pq.read_table(outputs["one"]).to_pylist(), 1e-5)
    assert any(path.endswith(".hidden") for method, path in proxy.requests if method == "GET")
