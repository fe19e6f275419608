"""vLLM alone, with its own Clef-Omni pooler (`ClefOmniForJointSchema`, the head inside the engine),
over prompts clef already tokenized: the bare engine that bench_engines.py sets beside
`clef score --engine vllm`, and the parity check of that pooler against clef's head.

Run in vLLM's Python: `$CLEF_VLLM_PYTHON benchmarks/engines/vllm_bare.py MODEL PROMPTS.json OUT.json`.
PROMPTS.json: `{"options": {...clef's worker options...}, "prompts": [{"id", "ids", "schema"}]}`,
where `schema` is the pooler's `joint_schema` (spans counted from the prompt's end). OUT.json:
`{"load_s", "encode_s", "tokens", "logits": {id: [logit per option, in option_spans order]}}`.
It reuses the worker's release overrides and engine options (loaded by path, as the worker runs),
with the architecture set back to vLLM's own class.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

WORKER = Path(__file__).resolve().parents[2] / "clef_cli" / "engines" / "vllm" / "worker.py"
BUILT_IN = "ClefOmniForJointSchema"


def worker_module(name: str = "worker"):
    """worker.py, or a module beside it, loaded from its path (as the worker loads its neighbours)."""
    spec = importlib.util.spec_from_file_location(f"clef_vllm_{name}", WORKER.with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    model, prompts_path, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    job = json.loads(prompts_path.read_text())
    worker = worker_module()
    import os

    from vllm import LLM, PoolingParams

    options = job["options"]
    if options.get("cpu_kv_cache_gib"):
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(options["cpu_kv_cache_gib"]))
    head_config = json.loads((Path(model) / "joint_head_config.json").read_text())
    overrides = worker_module("hidden_models").release_overrides(head_config, BUILT_IN)
    started = time.perf_counter()
    engine = worker.engine_options(options, worker._on_cpu())
    llm = LLM(model=model, runner="pooling", hf_overrides=overrides, seed=0, **engine)
    load = time.perf_counter() - started
    requests = [{"prompt_token_ids": prompt["ids"]} for prompt in job["prompts"]]
    params = [
        PoolingParams(task="token_classify", extra_kwargs={"joint_schema": prompt["schema"]}, use_activation=False)
        for prompt in job["prompts"]
    ]
    started = time.perf_counter()
    outputs = llm.encode(requests, pooling_params=params, pooling_task="token_classify", use_tqdm=False)
    encode = time.perf_counter() - started
    logits = {
        prompt["id"]: output.outputs.data.float().cpu().tolist()
        for prompt, output in zip(job["prompts"], outputs, strict=True)
    }
    tokens = sum(len(prompt["ids"]) for prompt in job["prompts"])
    out.write_text(json.dumps({"load_s": load, "encode_s": encode, "tokens": tokens, "logits": logits}))


if __name__ == "__main__":
    main()
