"""clef's side of the vLLM worker: finds vLLM's Python, starts worker.py in it, and asks it for
hidden states. Out of process, so clef's own pins (transformers>=5.23) never meet vLLM's (the
CPU build pins transformers<5.20; the CUDA `vllm` package has pins of its own)."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from clef_cli.engines.vllm.protocol import receive, send
from clef_cli.errors import JobStopped, ModelLoadError, UsageError

PYTHON_ENV = "CLEF_VLLM_PYTHON"
WORKER = Path(__file__).with_name("worker.py")
STOP_POLL_SECONDS = 0.2
RUNNING = "running a batch"


class VllmRecordError(ValueError):
    """vLLM refused a request (too long for --max-model-len, a media item its processor rejects):
    a ValueError, so the batch runner narrows it down to the record that causes it. What vLLM
    refuses, the HF engine may score (clef checked the record and decoded its media before), so
    the record's error is `unsupported`: no verdict on it, tried again by the next run."""

    kind = "unsupported"


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


def log_header(log: Path, model: Path) -> None:
    """A line in vllm.log before each run's output, so a failure can be found by its time."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    with open(log, "a", encoding="utf-8") as file:
        file.write(f"\n===== clef {stamp}: starting vLLM for {model} (pid {os.getpid()}) =====\n")


def one_line(error: str) -> str:
    """vLLM's errors (pydantic's among them) span many lines: the first that says something."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else "unknown error"


class VllmWorker:
    """One worker process, holding one loaded model; `close()` ends it.

    The worker runs in a session of its own, so the terminal's Ctrl-C (sent to the whole
    foreground process group) reaches clef alone: clef finishes and commits the batch in flight,
    then stops the worker and exits 130. While the model loads, a stop request ends the worker
    at once (`stop`); the worker also ends when clef's end of the pipe closes."""

    def __init__(
        self, python: str, model: Path, options: dict[str, Any], log: Path, stop: threading.Event | None = None
    ) -> None:
        """`log`: where vLLM's own output goes (the checkpoint's vllm.log), out of the user's way."""
        to_worker_read, to_worker_write = os.pipe()
        from_worker_read, from_worker_write = os.pipe()
        self.log = log
        log_header(log, model)
        with open(log, "ab") as log_file:
            self.process = subprocess.Popen(
                [python, str(WORKER), str(to_worker_read), str(from_worker_write)],
                pass_fds=(to_worker_read, from_worker_write),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,
                env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"},
            )
        os.close(to_worker_read)
        os.close(from_worker_write)
        self.outbox = os.fdopen(to_worker_write, "wb")
        self.inbox = os.fdopen(from_worker_read, "rb")
        self._tickets = 0
        self._replies: dict[int | None, dict[str, Any]] = {}
        try:
            send(self.outbox, {"op": "load", "model": str(model), "options": options})
            self._wait_for_reply(stop)
            reply = self._reply("loading the model")
        except BaseException:
            self.kill()
            raise
        self.version: str = reply["version"]
        self.max_model_len: int | None = reply.get("max_model_len")
        """The longest prompt the loaded engine takes (vLLM's own figure, after its checks)."""

    def _wait_for_reply(self, stop: threading.Event | None) -> None:
        """Block until the worker answers; a stop request meanwhile ends the load (JobStopped:
        the job is interrupted). One that comes with the answer is the job's loops' to see."""
        while not select.select([self.inbox], [], [], STOP_POLL_SECONDS)[0]:
            if stop is not None and stop.is_set():
                raise JobStopped
            if self.process.poll() is not None:
                return  # the reply read then meets the closed pipe and says how it ended

    def _stopped(self, doing: str) -> ModelLoadError:
        """The job's error for a worker that has gone (its exit code and log named)."""
        code = self.process.wait()
        return ModelLoadError(f"the vLLM worker stopped while {doing} (exit code {code}; its log: {self.log})")

    def _received(self, doing: str) -> dict[str, Any]:
        try:
            reply: dict[str, Any] = receive(self.inbox)
        except EOFError:
            raise self._stopped(doing) from None
        return reply

    def _checked(self, reply: dict[str, Any], doing: str) -> dict[str, Any]:
        """A reply that says ok, else its failure: the job's (fatal) or one request's."""
        if reply["ok"]:
            return reply
        if reply.get("kind") == "fatal":
            raise ModelLoadError(f"vLLM failed while {doing}: {one_line(reply['error'])} (its log: {self.log})")
        error = one_line(reply["error"])
        raise VllmRecordError(f"vLLM refused the request: {error}; score this record with --engine hf")

    def _reply(self, doing: str) -> dict[str, Any]:
        return self._checked(self._received(doing), doing)

    def kill(self) -> None:
        """End the worker now (a stop while loading, a failed start): nothing of it is needed."""
        with contextlib.suppress(OSError):
            self.process.kill()
        self.process.wait()
        for stream in (self.outbox, self.inbox):
            with contextlib.suppress(OSError):
                stream.close()

    def submit(self, message: dict[str, Any]) -> int:
        """Send one request without waiting for it (the worker reads requests on a thread of its
        own and answers them in order); its ticket, for `collect`."""
        ticket = self._tickets = self._tickets + 1
        try:
            send(self.outbox, {**message, "ticket": ticket})
        except (BrokenPipeError, OSError):
            raise self._stopped(RUNNING) from None
        return ticket

    def collect(self, ticket: int) -> dict[str, Any]:
        """The reply to a submitted request; replies to earlier requests read on the way are kept."""
        while ticket not in self._replies:
            reply = self._received(RUNNING)
            self._replies[reply.get("ticket")] = reply
        return self._checked(self._replies.pop(ticket), RUNNING)

    def forget(self, path: str) -> None:
        """The worker unmaps a shared-memory file clef is about to remove."""
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            send(self.outbox, {"op": "forget", "path": path})

    def close(self) -> None:
        if self.process.poll() is not None and self.outbox.closed:
            return
        try:
            send(self.outbox, {"op": "stop"})
            self.outbox.close()
        except (BrokenPipeError, OSError, ValueError):
            pass
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.inbox.close()
