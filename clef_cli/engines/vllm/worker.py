"""The vLLM worker: runs in vLLM's own environment, never imports clef (whose transformers pin
vLLM's excludes), and answers clef over a pipe.

Started as `python worker.py FD_IN FD_OUT` by clef (client.py). Everything vLLM prints goes to
stderr; the pipe carries length-prefixed pickle frames (clef_cli/engines/vllm/protocol.py):

- `{"op": "load", "model": path, "options": {...}}` -> `{"ok": True, "version": vllm.__version__}`
- `{"op": "hidden", "prompts": [{"ids": [...], "mm": {...}, "mm_kwargs": {...}}, ...]}` ->
  `{"ok": True, "hidden": [(float32 array [L, H], expanded ids) per prompt]}`: the thinker's final
  hidden states (cut (b): vLLM is the backbone, clef's own head scores them)
- any failure -> `{"ok": False, "error": "...", "kind": "record" | "fatal"}`
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import traceback
from typing import Any

# Run as a script, this file's folder is sys.path[0]: its neighbours (clef's modules) must not
# shadow vLLM's imports, so the folder is taken off the path before vLLM is imported.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

HEADER = struct.Struct(">Q")
ARCHITECTURE = "ClefOmniHiddenStates"
CPU_MEMORY_SHARE = 0.3


def send(stream: Any, message: Any) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(payload)) + payload)
    stream.flush()


def receive(stream: Any) -> Any:
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        raise EOFError
    (size,) = HEADER.unpack(header)
    return pickle.loads(stream.read(size))


def register_hidden_model() -> None:
    """vLLM's own Clef-Omni model with its pooler swapped for one that returns every token's
    final hidden state (the `token_embed` task, no normalisation): the head runs in clef."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.clef_omni import ClefOmniForJointSchema

    from_hidden = _all_tokens_pooler()

    class ClefOmniHiddenStates(ClefOmniForJointSchema):
        def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            self.pooler = from_hidden(self.pooler.head)  # the head's weights still load; clef's head scores

    ModelRegistry.register_model(ARCHITECTURE, ClefOmniHiddenStates)


def _all_tokens_pooler() -> Any:
    """A pooler class that hands back each prompt's [L, H] hidden states as they are."""
    from vllm.model_executor.layers.pooler import Pooler, PoolingParamsUpdate
    from vllm.model_executor.layers.pooler.tokwise.methods import AllPool

    class HiddenStatesPooler(Pooler):
        def __init__(self, head: Any) -> None:
            super().__init__()
            self.pooling = AllPool()
            self.head = head

        def get_supported_tasks(self) -> set[str]:
            return {"token_embed"}

        def get_pooling_updates(self, task: str) -> PoolingParamsUpdate:
            return PoolingParamsUpdate()

        def forward(self, hidden_states: Any, pooling_metadata: Any) -> Any:
            return self.pooling(hidden_states, pooling_metadata)

    return HiddenStatesPooler


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def release_overrides(head_config: dict[str, Any]) -> Any:
    """What vLLM must be told about a Clef-Omni release: the architecture, the head's config, and
    that its M-RoPE is interleaved. The reference (transformers' Qwen3-Omni thinker) always
    interleaves the T/H/W sections; vLLM does so only when `mrope_interleaved` is set, and
    otherwise gives vision tokens (whose three positions differ) other rotations (issue 33)."""

    def override(config: Any) -> Any:
        config.architectures = [ARCHITECTURE]
        config.joint_head_config = head_config
        for holder in (getattr(config, "thinker_config", None), config):
            text = getattr(holder, "text_config", None)
            for name in ("rope_parameters", "rope_scaling"):
                rope = getattr(text, name, None)
                if isinstance(rope, dict) and "mrope_section" in rope:
                    rope["mrope_interleaved"] = True
        return config

    return override


def load(model: str, options: dict[str, Any]) -> Any:
    """The engine, with clef's release overrides (the architecture, the head's config)."""
    import json

    from vllm import LLM

    if options.get("cpu_kv_cache_gib"):  # vLLM reads a whole number of GiB: "1.0" fails its int()
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(options["cpu_kv_cache_gib"]))
    register_hidden_model()
    if options.get("gpu_memory_utilization") is None and _on_cpu():
        # On the CPU build this is the share of the machine's memory vLLM claims at start (0.92 by
        # default), which fails beside any other large process; the KV cache has its own setting.
        options = {**options, "gpu_memory_utilization": CPU_MEMORY_SHARE}
    with open(os.path.join(model, "joint_head_config.json")) as file:
        head_config = json.load(file)
    kwargs = {
        key: options[key]
        for key in ("max_model_len", "gpu_memory_utilization", "tensor_parallel_size", "dtype")
        if options.get(key) is not None
    }
    return LLM(
        model=model,
        runner="pooling",
        hf_overrides=release_overrides(head_config),
        enforce_eager=True,
        seed=0,
        limit_mm_per_prompt=options.get("limit_mm_per_prompt") or {"image": 8, "video": 2, "audio": 8},
        **kwargs,
    )


def test_hooks() -> None:
    """Inert unless a test asks (as clef_cli/faults.py's): mark that a request began, then hold it,
    so a signal can be sent while vLLM is busy."""
    marker = os.environ.get("CLEF_TEST_VLLM_BUSY")
    if marker:
        with open(marker, "a"):
            pass
    seconds = os.environ.get("CLEF_TEST_SLOW_VLLM")
    if seconds:
        import time

        time.sleep(float(seconds))


def hidden(llm: Any, prompts: list[dict[str, Any]]) -> list[Any]:
    from vllm import PoolingParams

    test_hooks()
    requests = []
    for prompt in prompts:
        request: dict[str, Any] = {"prompt_token_ids": list(prompt["ids"])}
        if prompt.get("mm"):
            request["multi_modal_data"] = prompt["mm"]
            if prompt.get("mm_kwargs"):
                request["mm_processor_kwargs"] = prompt["mm_kwargs"]
        requests.append(request)
    params = PoolingParams(task="token_embed")
    outputs = llm.encode(requests, pooling_params=params, pooling_task="token_embed", use_tqdm=False)
    return [(output.outputs.data.float().cpu().numpy(), list(output.prompt_token_ids)) for output in outputs]


def serve(inbox: Any, outbox: Any) -> None:
    llm = None
    while True:
        try:
            message = receive(inbox)
        except EOFError:
            return
        try:
            if message["op"] == "load":
                import vllm

                llm = load(message["model"], message["options"])
                limit = llm.model_config.max_model_len
                send(outbox, {"ok": True, "version": vllm.__version__, "max_model_len": int(limit)})
            elif message["op"] == "hidden":
                send(outbox, {"ok": True, "hidden": hidden(llm, message["prompts"])})
            elif message["op"] == "stop":
                return
        except Exception as error:
            traceback.print_exc(file=sys.stderr)
            kind = "fatal" if message.get("op") == "load" else "record"
            send(outbox, {"ok": False, "error": f"{type(error).__name__}: {error}", "kind": kind})


def die_with_parent() -> None:
    """The worker runs in a session of its own (clef's Ctrl-C is not its); should clef itself be
    killed, Linux ends the worker too, so no orphan holds the GPU (elsewhere a closed pipe does)."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # clef was gone before the request took
        os._exit(1)


def main() -> None:
    die_with_parent()
    inbox = os.fdopen(int(sys.argv[1]), "rb")
    outbox = os.fdopen(int(sys.argv[2]), "wb")
    os.dup2(2, 1)  # whatever vLLM prints goes to stderr; the pipe stays clean
    serve(inbox, outbox)


if __name__ == "__main__":
    main()
