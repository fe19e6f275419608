"""Quick guards for two engine details that only slow tests caught (issue 36): the states computed
on demand take the dtype of the states already stored, and the vLLM worker tells vLLM that a
Clef-Omni release's M-RoPE is interleaved. Neither loads a model."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from clef_cli.engines.on_demand import states_settings
from clef_cli.job.settings import ScoreSettings
from clef_cli.store.checkpoint import SHARDS
from clef_cli.store.keep_policy import KEEP
from clef_cli.store.location import StoreLocation
from clef_cli.store.manifest import FORMAT_VERSION
from clef_cli.store.opening import stored_hidden_dtype

WORKER = Path(__file__).resolve().parent.parent / "clef_cli" / "engines" / "vllm" / "worker.py"


def tiny_store(folder: Path, shards: dict[str, torch.dtype]) -> Path:
    """A checkpoint folder with a manifest (scored in float32 by the hf engine) and one hidden-state
    shard per name, its states in the dtype given (and its input ids, as int32, beside them)."""
    (folder / SHARDS).mkdir(parents=True)
    manifest = {
        "format_version": FORMAT_VERSION,
        "model": {"id": "org/clef-omni-test"},
        "settings": {"dtype": "float32"},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    for name, dtype in shards.items():
        tensors = {"input_ids.0": torch.arange(3, dtype=torch.int32), "hidden.0": torch.ones(3, 4, dtype=dtype)}
        save_file(tensors, str(folder / SHARDS / f"{name}.hidden.safetensors"))
    return folder


@pytest.mark.parametrize("stored", [torch.float16, torch.float32, torch.bfloat16])
def test_states_computed_on_demand_take_the_stored_states_dtype(tmp_path, stored):
    """The run's own --hidden-dtype (bfloat16 by default) must not win over the store's: the
    missing states would be kept in another dtype than those beside them."""
    store = tiny_store(tmp_path / "st", {"000001": stored, "000002": torch.bfloat16})
    name = str(stored).removeprefix("torch.")
    assert stored_hidden_dtype(StoreLocation(store)) == name  # the first shard's, by name
    asked = "float32" if stored != torch.float32 else "float16"
    settings = ScoreSettings(inputs=[], output=tmp_path / "o.parquet", checkpoint=store, hidden_dtype=asked,
                             hidden_states="drop", model="elsewhere/model")  # fmt: skip
    filled = states_settings(settings)
    assert filled.hidden_dtype == name
    assert (filled.dtype, filled.hidden_states, filled.engine) == ("float32", KEEP, "hf")


def test_a_store_without_states_keeps_the_runs_hidden_dtype(tmp_path):
    store = tiny_store(tmp_path / "st", {})
    (store / SHARDS / "000001.hidden.safetensors").write_bytes(b"not safetensors")  # damaged: skipped
    assert stored_hidden_dtype(StoreLocation(store)) is None
    settings = ScoreSettings(inputs=[], output=tmp_path / "o.parquet", checkpoint=store, hidden_dtype="float16")
    assert states_settings(settings).hidden_dtype == "float16"


@pytest.fixture(scope="module")
def models():
    """hidden_models.py as a module: stdlib-only at import (it never imports clef), loaded from its
    path as worker.py loads it."""
    spec = importlib.util.spec_from_file_location("clef_vllm_models_under_test", WORKER.with_name("hidden_models.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def text_config(rope_name: str) -> SimpleNamespace:
    return SimpleNamespace(**{rope_name: {"rope_type": "default", "mrope_section": [24, 20, 20]}})


@pytest.mark.parametrize("rope_name", ["rope_parameters", "rope_scaling"])
def test_vllm_is_told_the_mrope_is_interleaved_under_the_thinker_and_at_top_level(models, rope_name):
    head = {"hidden_size": 8}
    nested = SimpleNamespace(thinker_config=SimpleNamespace(text_config=text_config(rope_name)), architectures=["X"])
    flat = SimpleNamespace(text_config=text_config(rope_name), architectures=["X"])
    for config in (nested, flat):
        assert models.release_overrides(head)(config) is config
        assert config.architectures == [models.ARCHITECTURE] == ["ClefOmniHiddenStates"]
        assert config.joint_head_config == head
    for text in (nested.thinker_config.text_config, flat.text_config):
        rope = getattr(text, rope_name)
        assert rope["mrope_interleaved"] is True and rope["mrope_section"] == [24, 20, 20]


def test_a_rope_without_mrope_sections_is_left_alone(models):
    """Only an M-RoPE (one with `mrope_section`) is interleaved; a plain rope dict is not touched."""
    config = SimpleNamespace(text_config=SimpleNamespace(rope_parameters={"rope_type": "default"}))
    models.release_overrides({})(config)
    assert config.text_config.rope_parameters == {"rope_type": "default"}
    assert config.architectures == [models.ARCHITECTURE]
