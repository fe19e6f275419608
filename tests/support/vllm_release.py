"""vLLM-ready tiny releases: Clef-Omni (issue 33) from tests/fixtures/tiny-clef-omni, and the
dense family (issue 38) from tests/fixtures/tiny-clef-dense (tests/support/vllm_release_dense.py).

vLLM needs what the tiny release lacks: `model.safetensors.index.json` (else it loads the head's
file as backbone weights), `vision_config.image_size` and `apply_vit_abs_pos_embed`,
`text_config.tie_word_embeddings`, and a text head size its CPU attention accepts (32, not 16):
2 query heads and 1 KV head of 32, `mrope_section` doubled. The attention weights whose shapes
change are drawn again from a fixed seed; the rest are copied. Our HF engine is exact against the
reference on the original fixture, so on this release it is the oracle for the vLLM engine.

    python -m tests.support.vllm_release [--family omni|dense] [OUT_DIR]
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).parents[1] / "fixtures" / "tiny-clef-omni"
SEED = 33
HEAD_DIM, HEADS, KV_HEADS = 32, 2, 1
COPIED = (
    "chat_template.jinja",
    "generation_config.json",
    "joint_head.safetensors",
    "joint_head_config.json",
    "processor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
MAKER_VERSION = "1"


def _config() -> dict:
    config = json.loads((SOURCE / "config.json").read_text())
    thinker = config["thinker_config"]
    text = thinker["text_config"]
    text.update(head_dim=HEAD_DIM, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS)
    text["tie_word_embeddings"] = bool(thinker.get("tie_word_embeddings", False))
    text["rope_parameters"]["mrope_section"] = [2 * size for size in text["rope_parameters"]["mrope_section"]]
    vision = thinker["vision_config"]
    vision["image_size"] = math.isqrt(vision["num_position_embeddings"]) * vision["patch_size"]
    vision["apply_vit_abs_pos_embed"] = True
    return config


def _weights(hidden: int) -> dict:
    """The source weights with the text attention redrawn for the new head layout (seeded)."""
    import torch
    from safetensors.torch import load_file

    weights = load_file(SOURCE / "model.safetensors")
    generator = torch.Generator().manual_seed(SEED)
    shapes = {
        "q_proj.weight": (HEADS * HEAD_DIM, hidden),
        "k_proj.weight": (KV_HEADS * HEAD_DIM, hidden),
        "v_proj.weight": (KV_HEADS * HEAD_DIM, hidden),
        "o_proj.weight": (hidden, HEADS * HEAD_DIM),
    }
    for name in sorted(weights):
        if not name.startswith("thinker.model.layers.") or ".self_attn." not in name:
            continue
        suffix = name.split(".self_attn.", 1)[1]
        if suffix in shapes:
            weights[name] = torch.randn(shapes[suffix], generator=generator) * 0.08
        elif suffix in ("q_norm.weight", "k_norm.weight"):
            weights[name] = 1.0 + 0.1 * torch.randn(HEAD_DIM, generator=generator)
    return weights


def _omni_release() -> tuple[dict, dict]:
    config = _config()
    return config, _weights(config["thinker_config"]["text_config"]["hidden_size"])


def _surgery(family: str) -> tuple[Path, tuple[str, ...], Any]:
    """(source fixture, files copied as they are, the maker of (config, weights)) per family."""
    if family == "omni":
        return SOURCE, COPIED, _omni_release
    if family == "dense":
        from tests.support import vllm_release_dense as dense

        return dense.SOURCE, dense.COPIED, dense.config_and_weights
    raise ValueError(f"unknown family {family!r}: omni or dense")


def make_release(out: Path, family: str = "omni") -> Path:
    """Write the release into `out` (made afresh), atomically; returns `out`."""
    from safetensors.torch import save_file

    source, copied, maker = _surgery(family)
    config, weights = maker()
    building = out.with_name(out.name + f".building.{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    for name in copied:
        shutil.copy2(source / name, building / name)
    (building / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file({k: v.contiguous() for k, v in weights.items()}, building / "model.safetensors", {"format": "pt"})
    size = (building / "model.safetensors").stat().st_size
    index = {"metadata": {"total_size": size}, "weight_map": dict.fromkeys(sorted(weights), "model.safetensors")}
    (building / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    building.rename(out)
    return out


def source_digest(family: str = "omni") -> str:
    """What the release is made from (the source fixture and the makers): its cache name."""
    source = _surgery(family)[0]
    digest = hashlib.sha256(MAKER_VERSION.encode())
    for path in sorted(source.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(Path(__file__).read_bytes())
    if family != "omni":
        digest.update((Path(__file__).parent / f"vllm_release_{family}.py").read_bytes())
    return digest.hexdigest()[:16]


def cached_release(cache: Path | None = None, family: str = "omni") -> Path:
    """The release in a cache folder named by its sources' digest, made once."""
    root = cache or Path(os.environ.get("CLEF_TEST_CACHE", Path.home() / ".cache" / "clef" / "test-releases"))
    out = root / f"tiny-clef-{family}-vllm-{source_digest(family)}"
    if not (out / "model.safetensors.index.json").exists():
        make_release(out, family)
    return out


def main(argv: list[str]) -> None:
    """`[--family omni|dense] [OUT_DIR]`: the release written to OUT_DIR, else to the cache."""
    family = "omni"
    if argv[:1] == ["--family"] and len(argv) > 1:
        family, argv = argv[1], argv[2:]
    print(make_release(Path(argv[0]), family) if argv else cached_release(family=family))


if __name__ == "__main__":
    main(sys.argv[1:])
