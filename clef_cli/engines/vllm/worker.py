"""The vLLM worker: runs in vLLM's own environment, never imports clef (whose transformers pin
vLLM's excludes), and answers clef over a pipe.

Started as `python worker.py FD_IN FD_OUT` by clef (client.py). Everything vLLM prints goes to
stderr; the pipe carries length-prefixed pickle frames of small messages only
(clef_cli/engines/vllm/protocol.py); the hidden states cross through shared memory:

- `{"op": "load", "model": path, "options": {...}}` -> `{"ok": True, "version": ..., "max_model_len": n}`
- `{"op": "hidden", "ticket": n, "prompts": [{"ids": int32 array, "mm": {...}, "mm_kwargs": {...}}],
  "slot": {"path": file, "bytes": size}, "padded": L, "dtype": "float32" | "bfloat16" | ...}` ->
  `{"ok": True, "ticket": n, "ids": [None, or vLLM's expanded ids (int32) where they differ from the
  request's, per prompt], "shape": [B, L, H]}`: the thinker's final hidden states, written
  right-padded (zeros past each prompt) in the compute dtype into the slot, a file clef made in
  shared memory (cut (b): vLLM is the backbone, clef's own head scores them)
- any failure -> `{"ok": False, "ticket": n, "error": "...", "kind": "record" | "fatal"}`

Requests are read on a thread of their own and answered in order, so clef can send the next
batch while vLLM runs this one (requests in flight) without ever blocking on a full pipe.
"""

from __future__ import annotations

import itertools
import mmap
import os
import pickle
import queue
import struct
import sys
import threading
import traceback
from typing import Any

# Run as a script, this file's folder is sys.path[0]: its neighbours (clef's modules) must not
# shadow vLLM's imports, so the folder is taken off the path before vLLM is imported.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

HEADER = struct.Struct(">Q")
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


def neighbour(name: str) -> Any:
    """A module beside this file, loaded from its path (the folder is off sys.path, see above)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"clef_vllm_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def engine_options(options: dict[str, Any], on_cpu: bool) -> dict[str, Any]:
    """vLLM's engine arguments from clef's options. Eager mode only where it is needed: on the CPU
    build, or when the user forces it (`--enforce-eager`); on CUDA vLLM compiles the model and
    captures CUDA graphs wherever its pooling runner supports them."""
    kwargs = {
        key: options[key]
        for key in ("max_model_len", "gpu_memory_utilization", "tensor_parallel_size", "dtype")
        if options.get(key) is not None
    }
    if kwargs.get("gpu_memory_utilization") is None and on_cpu:
        # On the CPU build this is the share of the machine's memory vLLM claims at start (0.92 by
        # default), which fails beside any other large process; the KV cache has its own setting.
        kwargs["gpu_memory_utilization"] = CPU_MEMORY_SHARE
    kwargs["enforce_eager"] = bool(options.get("enforce_eager")) or on_cpu
    # A record's result must not depend on what ran before it (issue 38): no KV reused from an
    # earlier prompt, no processed media reused from an earlier request (vLLM processes a
    # record's clips together, so a clip processed beside a longer one differs from the same clip
    # alone by 1e-5; reused in a later record, it made that record's result depend on history).
    kwargs["enable_prefix_caching"] = False
    kwargs["mm_processor_cache_gb"] = 0
    kwargs["limit_mm_per_prompt"] = options.get("limit_mm_per_prompt") or {"image": 8, "video": 2, "audio": 8}
    return kwargs


def load(model: str, options: dict[str, Any]) -> Any:
    """The engine, with clef's release overrides (the architecture, the head's config)."""
    import json

    from vllm import LLM

    if options.get("cpu_kv_cache_gib"):  # vLLM reads a whole number of GiB: "1.0" fails its int()
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(options["cpu_kv_cache_gib"]))
    models = neighbour("hidden_models")
    models.register(neighbour)
    with open(os.path.join(model, "joint_head_config.json")) as file:
        head_config = json.load(file)
    architecture = neighbour("dense_model").architecture(model) or models.ARCHITECTURE
    return LLM(
        model=model,
        runner="pooling",
        hf_overrides=models.release_overrides(head_config, architecture),
        seed=0,
        **engine_options(options, _on_cpu()),
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


def encode(llm: Any, prompts: list[dict[str, Any]]) -> list[Any]:
    """vLLM's pooled outputs, one per prompt: each prompt's [L, H] final hidden states. Prompts
    with audio run one per call: vLLM encodes the clips of the requests it schedules together in
    one padded batch, which moves a short clip's states by 1e-5 (issue 38); alone, each record's
    clips are encoded as the HF engine encodes them."""
    test_hooks()
    requests = [vllm_request(prompt) for prompt in prompts]
    together = [n for n, prompt in enumerate(prompts) if "audio" not in (prompt.get("mm") or {})]
    outputs: list[Any] = [None] * len(prompts)
    groups = [together] if together else []
    groups += [[n] for n in range(len(prompts)) if n not in set(together)]
    for group in groups:
        for n, output in zip(group, pooled(llm, [requests[n] for n in group]), strict=True):
            outputs[n] = output
    return outputs


def vllm_request(prompt: dict[str, Any]) -> dict[str, Any]:
    request: dict[str, Any] = {"prompt_token_ids": prompt["ids"].tolist()}
    if prompt.get("mm"):
        request["multi_modal_data"] = prompt["mm"]
        request["multi_modal_uuids"] = unique_media_ids(prompt["mm"])
        if prompt.get("mm_kwargs"):
            request["mm_processor_kwargs"] = prompt["mm_kwargs"]
    return request


def pooled(llm: Any, requests: list[dict[str, Any]]) -> list[Any]:
    from vllm import PoolingParams

    params = PoolingParams(task="token_embed")
    return list(llm.encode(requests, pooling_params=params, pooling_task="token_embed", use_tqdm=False))


REQUESTS = itertools.count()


def unique_media_ids(media: dict[str, Any]) -> dict[str, list[str]]:
    """An id of its own for every media item of every request: vLLM keys its encoder cache by an
    item's id (by default a hash of its content), so an item's encoding, made beside another
    request's other items, is never reused for a later request."""
    serial = f"clef-{os.getpid()}-{next(REQUESTS)}"
    return {kind: [f"{serial}-{kind}-{n}" for n in range(len(items))] for kind, items in media.items()}


class Slots:
    """clef's shared-memory files, each mapped once (again when clef has grown it)."""

    def __init__(self) -> None:
        self.mapped: dict[str, tuple[int, mmap.mmap]] = {}

    def view(self, path: str, size: int, dtype: Any, shape: tuple[int, ...]) -> Any:
        import torch

        known = self.mapped.get(path)
        if known is None or known[0] != size:
            with open(path, "r+b") as file:
                self.mapped[path] = (size, mmap.mmap(file.fileno(), size))
        count = shape[0] * shape[1] * shape[2]
        return torch.frombuffer(self.mapped[path][1], dtype=dtype, count=count).view(shape)

    def forget(self, path: str) -> None:
        self.mapped.pop(path, None)


def write_states(message: dict[str, Any], outputs: list[Any], slots: Slots) -> dict[str, Any]:
    """Write one batch's states right-padded into clef's slot, in the compute dtype; the reply."""
    import numpy as np
    import torch

    prompts = message["prompts"]
    states = [output.outputs.data for output in outputs]
    width = int(states[0].shape[-1])
    shape = (len(states), int(message["padded"]), width)
    slot = message["slot"]
    padded = slots.view(slot["path"], slot["bytes"], getattr(torch, message["dtype"]), shape)
    ids: list[Any] = []
    for row, (prompt, output, state) in enumerate(zip(prompts, outputs, states, strict=True)):
        length = int(state.shape[0])
        padded[row, :length].copy_(state)
        padded[row, length:].zero_()
        ran = np.asarray(output.prompt_token_ids, dtype=np.int32)
        ids.append(None if np.array_equal(ran, prompt["ids"]) else ran)
    return {"ok": True, "ticket": message["ticket"], "ids": ids, "shape": list(shape)}


def failure(message: dict[str, Any], error: Exception) -> dict[str, Any]:
    traceback.print_exception(error, file=sys.stderr)
    kind = "fatal" if message.get("op") == "load" else "record"
    return {"ok": False, "ticket": message.get("ticket"), "error": f"{type(error).__name__}: {error}", "kind": kind}


def read_requests(inbox: Any, requests: queue.Queue) -> None:
    """On a thread: every request as it comes, so clef's writes never wait for a batch to end."""
    while True:
        try:
            requests.put(receive(inbox))
        except (EOFError, OSError, ValueError):
            requests.put(None)
            return


def answer_batches(finished: queue.Queue, outbox: Any, slots: Slots) -> None:
    """On a thread: each finished batch's states written out and its reply sent, in order, while
    vLLM already runs the next batch (copying states never holds the engine up)."""
    while (item := finished.get()) is not None:
        message, outputs = item
        try:
            reply = outputs if isinstance(outputs, dict) else write_states(message, outputs, slots)
        except Exception as error:
            reply = failure(message, error)
        send(outbox, reply)


def serve(inbox: Any, outbox: Any) -> None:
    requests: queue.Queue = queue.Queue()
    threading.Thread(target=read_requests, args=(inbox, requests), daemon=True).start()
    finished: queue.Queue = queue.Queue()
    slots = Slots()
    answering = threading.Thread(target=answer_batches, args=(finished, outbox, slots), daemon=True)
    answering.start()
    llm = None
    while (message := requests.get()) is not None and message["op"] != "stop":
        op = message["op"]
        try:
            if op == "load":
                import vllm

                llm = load(message["model"], message["options"])
                limit = int(llm.model_config.max_model_len)
                send(outbox, {"ok": True, "version": vllm.__version__, "max_model_len": limit})
            elif op == "forget":
                slots.forget(message["path"])
            else:
                finished.put((message, encode(llm, message["prompts"])))
        except Exception as error:
            if op == "load":
                send(outbox, failure(message, error))
            else:
                finished.put((message, failure(message, error)))
    finished.put(None)
    answering.join()


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
