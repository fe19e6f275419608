"""The vLLM worker with its forward replaced by a simulated device (bench_feed.py --engine vllm).

Run by clef's client exactly as it runs clef_cli/engines/vllm/worker.py (`python THIS FD_IN FD_OUT`):
this script loads the real worker module by path and replaces only what needs vLLM itself, the
engine (`load`) and vLLM's import, with a stand-in `LLM` whose `encode` sleeps
tokens / --device-rate seconds and returns hidden states of the real width. Everything else in
the worker (the serve loop, the protocol, the transport of the states) is the product's own.

The stand-in cannot expand media placeholders as vLLM's processor does, so the bench's client
side adds each record's expanded ids to its prompt (`bench_ids`), the worker's request builder is
wrapped to carry them, and the stand-in hands them back.
Settings come from the environment: CLEF_BENCH_DEVICE_RATE (tokens/s), CLEF_BENCH_HIDDEN_SIZE,
CLEF_BENCH_DEVICE_LOG (a file the stand-in appends its busy seconds to, one line per call).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORKER = Path(__file__).resolve().parents[2] / "clef_cli" / "engines" / "vllm" / "worker.py"


@dataclass
class _Pooled:
    data: Any


@dataclass
class _Output:
    outputs: _Pooled
    prompt_token_ids: list[int]


class SimulatedEngine:
    """What the worker calls on vLLM's `LLM`: `encode` and `model_config.max_model_len`."""

    def __init__(self, rate: float, hidden_size: int, dtype: str, log: str | None) -> None:
        import torch

        self.rate, self.hidden_size, self.log = rate, hidden_size, log
        self.dtype = getattr(torch, dtype)
        self.model_config = types.SimpleNamespace(max_model_len=1 << 20)
        self._zeros = torch.zeros(0, hidden_size, dtype=self.dtype)

    def _states(self, length: int) -> Any:
        import torch

        if self._zeros.shape[0] < length:  # one buffer, grown: the device's output costs no CPU here
            self._zeros = torch.zeros(max(length, 2 * self._zeros.shape[0]), self.hidden_size, dtype=self.dtype)
        return self._zeros[:length]

    def encode(self, requests: list[dict[str, Any]], **_: Any) -> list[_Output]:
        ids = [
            list(request["bench_ids"]) if request.get("bench_ids") is not None else request["prompt_token_ids"]
            for request in requests
        ]
        seconds = sum(len(one) for one in ids) / self.rate
        time.sleep(seconds)
        if self.log:
            with open(self.log, "a") as file:
                file.write(f"{seconds}\n")
        return [_Output(_Pooled(self._states(len(one))), one) for one in ids]


def _fake_vllm() -> types.ModuleType:
    """The names the worker imports from vLLM (PoolingParams, __version__)."""
    module = types.ModuleType("vllm")
    module.__version__ = "stand-in"  # type: ignore[attr-defined]
    module.PoolingParams = lambda **kwargs: kwargs  # type: ignore[attr-defined]
    return module


def main() -> None:
    sys.modules["vllm"] = _fake_vllm()
    spec = importlib.util.spec_from_file_location("clef_vllm_worker", WORKER)
    assert spec is not None and spec.loader is not None
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    rate = float(os.environ["CLEF_BENCH_DEVICE_RATE"])
    hidden_size = int(os.environ["CLEF_BENCH_HIDDEN_SIZE"])
    log = os.environ.get("CLEF_BENCH_DEVICE_LOG")
    worker.load = lambda model, options: SimulatedEngine(rate, hidden_size, options.get("dtype", "float32"), log)
    real_request = worker.vllm_request

    def request_with_expanded_ids(prompt: dict[str, Any]) -> dict[str, Any]:
        return {**real_request(prompt), "bench_ids": prompt.get("bench_ids")}

    worker.vllm_request = request_with_expanded_ids
    worker.main()


if __name__ == "__main__":
    main()
