"""`clef score --engine vllm` on the dense family (Qwen3.5, issue 38.3): the HF engine is the
oracle, in fp32, on the vLLM-ready tiny dense release (`python -m tests.support.vllm_release --family
dense`). Text and image records, batched and one per batch; the stored ids, spans and states;
--rehead and train-head on a dense vLLM store. Slow: vLLM starts (CLEF_VLLM_PYTHON, as
tests/test_vllm_engine.py; in CI its absence fails them)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from clef_cli.cli import app
from tests.support.helpers import FIXTURES, SAMPLE_DATA, TINY_MODEL, write_jsonl
from tests.test_vllm_engine import assert_parity, rows, score, vllm_python

GOLDEN_DENSE = FIXTURES / "golden_dense"
TEXT_IDS = ("d01-text", "d02-json-state", "d05-noul-criteria", "d06-long-state-cut", "d07-unicode",
            "d09-many-options", "d10-empty-instructions", "ticket-001", "mod-002")  # fmt: skip
IMAGE_IDS = ("d03-one-image", "d04-two-images", "d08-gray-image", "ticket-003", "ticket-005", "ticket-009")
AUDIO_ID = "ticket-004"  # the dense family reads no audio: refused by clef, whatever the engine
STATE_BOUND = 2e-4
"""Final hidden states, HF against vLLM (fp32): measured 1.7e-5 (text and images); the head's
probabilities, the product, keep BOUND (1e-5)."""
VLLM = ("--engine", "vllm", "--cpu-kv-cache-gib", "1")
DENSE_MODEL = Path(__file__).resolve().parent.parent / "clef_cli" / "engines" / "vllm" / "dense_model.py"


@pytest.fixture(scope="module")
def dense_model():
    """The worker's dense module as the worker loads it: by path (stdlib imports at the top)."""
    spec = importlib.util.spec_from_file_location("clef_vllm_dense_model_under_test", DENSE_MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_worker_registers_its_dense_class_for_qwen3_5_releases_only(dense_model, tmp_path):
    assert dense_model.architecture(str(FIXTURES / "tiny-clef-dense")) == "ClefDenseHiddenStates"
    assert dense_model.architecture(str(TINY_MODEL)) is None  # Omni keeps its own class
    config = json.loads((FIXTURES / "tiny-clef-dense" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "qwen3_5_moe"}))
    assert dense_model.architecture(str(tmp_path)) is None  # not proven exact: the scorer refuses it


def test_the_exact_gated_deltanet_path_equals_transformers_across_prefill_chunks(dense_model):
    """The worker's fp32 CPU path (vLLM's own CPU kernels take bf16 only) against transformers'
    PyTorch path, the HF engine's on the CPU: a 150-token prompt whole, and cut into the pieces
    chunked prefill makes (70, 79, 1 tokens), the conv and recurrent states carried between them."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    generator = torch.Generator().manual_seed(5)
    k_heads, v_heads, dim, width, length = 2, 4, 16, 4, 150
    conv = 2 * k_heads * dim + v_heads * dim
    draw = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    layer = SimpleNamespace(key_dim=k_heads * dim, value_dim=v_heads * dim, tp_size=1, head_k_dim=dim,
                            head_v_dim=dim, A_log=0.5 * draw(v_heads), dt_bias=draw(v_heads),
                            conv1d=SimpleNamespace(weight=0.5 * draw(conv, 1, width), bias=None))  # fmt: skip
    mixed, b, a = draw(length, conv), draw(length, v_heads), draw(length, v_heads)

    convolved = hf.causal_conv1d_fn(mixed.T[None], layer.conv1d.weight.squeeze(1), None, activation="silu")[0].T
    query, key, value = convolved.split([k_heads * dim, k_heads * dim, v_heads * dim], -1)
    g = -layer.A_log.exp() * torch.nn.functional.softplus(a + layer.dt_bias)
    want, _ = hf.torch_chunk_gated_delta_rule(
        query.reshape(1, length, k_heads, dim), key.reshape(1, length, k_heads, dim),
        value.reshape(1, length, v_heads, dim), g=g[None], beta=b.sigmoid()[None], use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    for cuts in ([0, length], [0, 70, 149, length]):
        conv_state, state = torch.zeros(conv, width - 1), torch.zeros(v_heads, dim, dim)
        pieces = []
        for begin, end in itertools.pairwise(cuts):
            piece = dense_model.convolve(layer, mixed[begin:end], conv_state)
            pieces.append(dense_model.delta_rule(layer, piece, b[begin:end], a[begin:end], state))
        worst = float((torch.cat(pieces) - want[0]).abs().max())
        print(f"cut at {cuts[1:-1]}: worst difference {worst:.3g}")
        assert worst <= 1e-5


def dense_records(folder: Path) -> Path:
    """The dense golden records that score (d06's state is longer than vLLM's 4,096-token step:
    chunked prefill), three sample records with images, two text ones and one with audio."""
    lines = [json.loads(line) for line in (GOLDEN_DENSE / "records_D.jsonl").read_text().splitlines()]
    lines += [json.loads(line) for line in (SAMPLE_DATA / "records.jsonl").read_text().splitlines()]
    chosen = [record for record in lines if record["id"] in TEXT_IDS + IMAGE_IDS + (AUDIO_ID,)]
    shutil.copytree(GOLDEN_DENSE / "media", folder / "media", dirs_exist_ok=True)
    shutil.copytree(SAMPLE_DATA / "media", folder / "media", dirs_exist_ok=True)
    return write_jsonl(folder / "records.jsonl", chosen)


@pytest.fixture(scope="module")
def dense_release() -> Path:
    from tests.support.vllm_release import cached_release

    return cached_release(family="dense")


@pytest.fixture(scope="module")
def dense_runs(tmp_path_factory, dense_release) -> Path:
    """The HF engine and vLLM batched, both keeping fp32 states; vLLM one record per batch."""
    python = vllm_python()
    folder = tmp_path_factory.mktemp("dense")
    inputs = dense_records(folder)
    keep = ("--hidden-states", "keep", "--hidden-dtype", "float32")
    code, output = score(dense_release, inputs, folder / "hf.parquet", *keep)
    assert code == 3, output  # the audio record, refused
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CLEF_VLLM_PYTHON", python)
        code, output = score(dense_release, inputs, folder / "batched.parquet", *VLLM, *keep)
        assert code == 3, output
        alone = ("--max-batch-size", "1", "--hidden-states", "drop")
        code, output = score(dense_release, inputs, folder / "alone.parquet", *VLLM, *alone)
        assert code == 3, output
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("run", ["batched", "alone"])
@pytest.mark.parametrize("ids", [TEXT_IDS, IMAGE_IDS], ids=["text", "image"])
def test_dense_vllm_equals_the_hf_engine(dense_runs, run, ids):
    """fp32: the same answers and prompt lengths (vLLM's expanded image ids equal clef's, or the
    record fails) and probabilities within 1e-5, in one batch and one record per batch."""
    worst = assert_parity(rows(dense_runs / f"{run}.parquet"), rows(dense_runs / "hf.parquet"), ids)
    print(f"worst probability difference ({run}): {worst:.3g}")


@pytest.mark.slow
def test_dense_audio_is_refused_alike(dense_runs):
    hf, vllm = rows(dense_runs / "hf.parquet")[AUDIO_ID], rows(dense_runs / "batched.parquet")[AUDIO_ID]
    assert "this model does not read audio" in vllm["error"]
    assert (vllm["error"], vllm["error_kind"]) == (hf["error"], hf["error_kind"])


def stored(checkpoint: Path) -> dict[str, object]:
    from clef_cli.store.hidden_store import read_shard

    found = {}
    for shard in sorted((checkpoint / "shards").glob("*.hidden.safetensors")):
        found |= {record.id: record for record in read_shard(shard)}
    return found


@pytest.mark.slow
def test_a_dense_vllm_store_holds_the_hf_engines_ids_spans_and_states(dense_runs):
    hf, vllm = stored(dense_runs / "hf.parquet.ckpt"), stored(dense_runs / "batched.parquet.ckpt")
    assert sorted(vllm) == sorted(hf) == sorted(TEXT_IDS + IMAGE_IDS)
    worst = 0.0
    for record_id, want in hf.items():
        got = vllm[record_id]
        assert got.input_ids == want.input_ids, record_id
        assert got.encoded.questions == want.encoded.questions, record_id  # spans, option ids
        assert got.hidden.dtype == torch.float32 and got.hidden.shape == want.hidden.shape
        worst = max(worst, float((got.hidden - want.hidden).abs().max()))
    print(f"worst hidden-state difference: {worst:.3g}")
    assert worst <= STATE_BOUND, worst
    manifest = json.loads((dense_runs / "batched.parquet.ckpt" / "manifest.json").read_text())
    assert manifest["settings"]["engine"] == "vllm"


def perturbed_head(release: Path, folder: Path) -> Path:
    """Another joint head for the same backbone (seeded)."""
    from safetensors.torch import load_file, save_file

    folder.mkdir()
    state = load_file(str(release / "joint_head.safetensors"))
    generator = torch.Generator().manual_seed(7)
    state = {k: v + 0.05 * torch.randn(v.shape, generator=generator).to(v.dtype) for k, v in state.items()}
    save_file(state, str(folder / "joint_head.safetensors"))
    shutil.copy(release / "joint_head_config.json", folder)
    return folder


def rehead(release: Path, store: Path, head: Path, out: Path) -> dict[str, dict]:
    args = ["--checkpoint", str(store), "--rehead", str(head), "--hidden-dtype", "float32"]
    code, output = score(release, store.parent / "records.jsonl", out, *args)
    assert code == 3, output  # the audio record stays refused
    return rows(out)


def gold_labels(inputs: Path, ids: tuple[str, ...]) -> list[dict]:
    """A label for each record's first question (arbitrary, fixed): what train-head reads."""
    gold = []
    for n, record in enumerate(json.loads(line) for line in inputs.read_text().splitlines()):
        if record["id"] not in ids:
            continue
        question, spec = next(iter(record["questions"].items()))
        options = {"noul": ["true", "false"], "choice": sorted(spec.get("criteria") or {})}
        choices = options.get(spec["type"]) or [str(level) for level in range(len(spec["criteria"]))]
        gold.append({"id": record["id"], "labels": {question: choices[n % len(choices)]}})
    return gold


def first_probability(table: dict[str, dict]) -> float:
    return table["d01-text"]["answers"][0]["labels"][0]["probability"]


@pytest.mark.slow
def test_rehead_and_train_head_on_dense_vllm_stores(dense_runs, dense_release, tmp_path, monkeypatch):
    """--rehead with another head: on the vLLM store that kept its states, and on the one that
    dropped them (vLLM, the store's engine, computes them again), both equal the HF store's
    rehead within 1e-5; train-head then trains from the states the rehead stored."""
    monkeypatch.setenv("CLEF_VLLM_PYTHON", vllm_python())
    ids = TEXT_IDS + IMAGE_IDS
    head = perturbed_head(dense_release, tmp_path / "head-b")
    want = rehead(dense_release, dense_runs / "hf.parquet.ckpt", head, tmp_path / "hf-b.parquet")
    assert abs(first_probability(want) - first_probability(rows(dense_runs / "hf.parquet"))) > 1e-3  # a new head
    for store in ("batched", "alone"):
        got = rehead(dense_release, dense_runs / f"{store}.parquet.ckpt", head, tmp_path / f"{store}-b.parquet")
        print(f"worst probability difference, rehead of the {store} store: {assert_parity(got, want, ids):.3g}")
    metadata = pq.read_schema(tmp_path / "alone-b.parquet").metadata
    assert metadata[b"clef.engine"] == b"vllm" and metadata[b"clef.rehead_states_computed"] == str(len(ids)).encode()

    inputs = dense_runs / "records.jsonl"
    gold = write_jsonl(tmp_path / "gold.jsonl", gold_labels(inputs, ids))
    common = ["--gold", str(gold), "--folds", "2", "--epochs", "1", "--device", "cpu", "--force", "--quiet"]
    trained = CliRunner().invoke(app, ["train-head", str(dense_runs / "alone.parquet.ckpt"), "-o",
                                       str(tmp_path / "trained"), *common, "--records", str(inputs)])  # fmt: skip
    assert trained.exit_code == 0, trained.output
    report = json.loads((tmp_path / "trained" / "training_report.json").read_text())
    assert report["states_computed"]["records"] == 0  # the rehead stored them all
    assert (tmp_path / "trained" / "joint_head.safetensors").exists()
