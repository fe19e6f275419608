"""clef's side of the vLLM worker: finds vLLM's Python, starts worker.py in it, and asks it for
hidden states. Out of process, so clef's own pins (transformers>=5.23) never meet vLLM's (the
CPU build pins transformers<5.20; the CUDA `vllm` package has pins of its own)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from clef_cli.engines.vllm.protocol import receive, send
from clef_cli.errors import ModelLoadError, UsageError

PYTHON_ENV = "CLEF_VLLM_PYTHON"
WORKER = Path(__file__).with_name("worker.py")


class VllmRecordError(ValueError):
    """vLLM refused a request (too long for --max-model-len, a media item its processor rejects):
    a ValueError, so the batch runner narrows it down to the record that causes it."""


def vllm_python() -> str:
    """The Python that has vLLM: $CLEF_VLLM_PYTHON, else this one when vLLM is installed here."""
    configured = os.environ.get(PYTHON_ENV)
    if configured:
        if shutil.which(configured) is None and not Path(configured).is_file():
            raise UsageError(f"{PYTHON_ENV}={configured} is not a Python interpreter")
        return configured
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise UsageError(
        f"--engine vllm needs vLLM in an environment of its own: build one with .ci/vllm_venv.sh (the CPU "
        f"build) or pip install vllm into a venv (CUDA), then set {PYTHON_ENV} to its bin/python"
    )


class VllmWorker:
    """One worker process, holding one loaded model; `close()` ends it."""

    def __init__(self, python: str, model: Path, options: dict[str, Any], log: Path) -> None:
        """`log`: where vLLM's own output goes (the checkpoint's vllm.log), out of the user's way."""
        to_worker_read, to_worker_write = os.pipe()
        from_worker_read, from_worker_write = os.pipe()
        self.log = log
        with open(log, "ab") as log_file:
            self.process = subprocess.Popen(
                [python, str(WORKER), str(to_worker_read), str(from_worker_write)],
                pass_fds=(to_worker_read, from_worker_write),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"},
            )
        os.close(to_worker_read)
        os.close(from_worker_write)
        self.outbox = os.fdopen(to_worker_write, "wb")
        self.inbox = os.fdopen(from_worker_read, "rb")
        reply = self._ask({"op": "load", "model": str(model), "options": options}, "loading the model")
        self.version: str = reply["version"]

    def _ask(self, message: dict[str, Any], doing: str) -> dict[str, Any]:
        try:
            send(self.outbox, message)
            reply: dict[str, Any] = receive(self.inbox)
        except (EOFError, BrokenPipeError):
            code = self.process.wait()
            raise ModelLoadError(
                f"the vLLM worker stopped while {doing} (exit code {code}; its log: {self.log})"
            ) from None
        if reply["ok"]:
            return reply
        if reply.get("kind") == "fatal":
            raise ModelLoadError(f"vLLM failed while {doing}: {reply['error']} (its log: {self.log})")
        raise VllmRecordError(f"vLLM refused the request: {reply['error']}")

    def hidden(self, prompts: list[dict[str, Any]]) -> list[Any]:
        """Each prompt's final hidden states (a float32 numpy array [L, hidden]) and the token ids
        vLLM ran (its own expansion of the media placeholders)."""
        hidden: list[Any] = self._ask({"op": "hidden", "prompts": prompts}, "running a batch")["hidden"]
        return hidden

    def close(self) -> None:
        try:
            send(self.outbox, {"op": "stop"})
            self.outbox.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.inbox.close()
