"""Cut (b): vLLM as the backbone. The worker returns each prompt's final hidden states and clef's
own joint head scores them, exactly as the HF engine does, so results, hidden states for the
store (--hidden-states keep, --rehead, train-head) and every check downstream are the same code.

Records go to vLLM as the token ids clef's prompt encoder made (requests.py: media placeholders
collapsed, the media and the processor options beside them); vLLM's expanded ids must equal ours.
Every media kind the HF engine scores, this engine scores (the worker gives vLLM the reference's
audio features: omni_audio.py)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from clef_cli.encoding.batching import ModelBatch
from clef_cli.encoding.encoded import EncodedRecord
from clef_cli.encoding.media import MediaLimits
from clef_cli.engines.vllm.client import VllmRecordError, VllmWorker, vllm_python
from clef_cli.engines.vllm.limits import EngineRefusal, too_long
from clef_cli.engines.vllm.mm_requests import vllm_request
from clef_cli.engines.vllm.transport import Slot, StateSlots, padded_bytes
from clef_cli.errors import UsageError
from clef_cli.job.settings import ScoreSettings
from clef_cli.model.backbone import Backbone, resolve_device
from clef_cli.model.scoring import Scorer
from clef_cli.release import Release

MODEL_TYPES = {"qwen3_omni_moe": "Clef-Omni", "qwen3_5": "Clef / Clef-Flash (dense Qwen3.5)"}
"""The releases this engine serves, by config.json model_type: each proven exact against the HF
engine (tests/test_vllm_engine.py, tests/test_vllm_dense.py). Qwen3.5-MoE (`qwen3_5_moe`) is not yet."""
IN_FLIGHT = 2
"""Batches sent to vLLM at once: one running, the next waiting in the worker, so vLLM starts it
the moment the first ends, while clef runs the head and commits."""


def check_family(release: Release) -> None:
    """Refuse, before any work, a model this engine does not serve."""
    model_type = release.config.get("model_type")
    if model_type not in MODEL_TYPES:
        served = " and ".join(MODEL_TYPES.values())
        raise UsageError(
            f"--engine vllm serves {served} only (model_type {', '.join(MODEL_TYPES)}); {model_type!r} "
            f"({release.path}) is not proven exact against the HF engine on vLLM yet: use --engine hf"
        )


def worker_options(settings: ScoreSettings, dtype: str) -> dict[str, Any]:
    """The options passed through to vLLM's engine."""
    vllm = settings.vllm
    options: dict[str, Any] = {"dtype": dtype}
    if vllm is not None:
        options |= {
            "max_model_len": vllm.max_model_len,
            "gpu_memory_utilization": vllm.gpu_memory_utilization,
            "tensor_parallel_size": vllm.tensor_parallel_size,
            "cpu_kv_cache_gib": vllm.cpu_kv_cache_gib,
            "enforce_eager": vllm.enforce_eager,
        }
    return options


class VllmBackbone(Backbone):
    """The thinker served by a vLLM worker. Batches are submitted ahead (`IN_FLIGHT` at once), so
    vLLM runs the next while clef scores and commits this one; their states come back through
    shared memory (transport.py), in the compute dtype, already right-padded."""

    in_flight = IN_FLIGHT

    def __init__(
        self,
        worker: VllmWorker,
        lexical_rows: torch.Tensor,
        dtype: torch.dtype,
        release: Release,
        limits: MediaLimits,
        tokenizer: Any,
    ) -> None:
        self.worker = worker
        self.tokenizer = tokenizer
        self.release = release
        self.limits = limits
        self.lexical_rows = lexical_rows
        self.device = lexical_rows.device
        self.dtype = dtype
        self.hidden_size = int(lexical_rows.shape[1])
        self.slots = StateSlots()
        self.submitted: dict[tuple[int, ...], tuple[int, Slot]] = {}

    def tokenize(self, text: str) -> list[int]:
        """Placeholder text to ids, as the prompt encoder's processor call tokenizes it."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def submit(self, records: Sequence[EncodedRecord]) -> None:
        """Send the batch to vLLM now; `forward` collects it. Records the engine refuses are left
        for `forward` to refuse (and the batch runner to narrow)."""
        if refusal(records, self.worker.max_model_len) is None:
            self.submitted[_batch_key(records)] = self._send(records)

    def _send(self, records: Sequence[EncodedRecord]) -> tuple[int, Slot]:
        """The batch's request sent, with a slot for its states: (its ticket, the slot)."""
        longest = max(record.length for record in records)
        slot = self.slots.take(padded_bytes(len(records), longest, self.hidden_size, self.dtype))
        message = {
            "op": "hidden",
            "prompts": [vllm_request(record, self.release, self.limits, self.tokenize) for record in records],
            "slot": {"path": str(slot.path), "bytes": slot.size},
            "padded": longest,
            "dtype": str(self.dtype).removeprefix("torch."),
        }
        try:
            return self.worker.submit(message), slot
        except BaseException:
            self.slots.give_back(slot)
            raise

    def forward(self, records: Sequence[EncodedRecord], batch: ModelBatch | None, pad_token_id: int) -> torch.Tensor:
        """Right-padded `[B, L, hidden]` over the slot's pages: each prompt runs as its own vLLM
        request, so a record's states do not depend on its batch."""
        if (refused := refusal(records, self.worker.max_model_len)) is not None:
            raise refused  # planning refused these already (VllmScoreJob): a safety net
        ticket, slot = self.submitted.pop(_batch_key(records), None) or self._send(records)
        try:
            reply = self.worker.collect(ticket)
        except BaseException:
            self.slots.give_back(slot)
            raise
        self.slots.lend(slot)
        for record, ids in zip(records, reply["ids"], strict=True):
            if ids is not None and ids.tolist() != list(record.input_ids):
                raise VllmRecordError(
                    f"vLLM expanded the prompt to {len(ids)} tokens, not the {record.length} clef's encoder made "
                    "(the media processors disagree): score this record with --engine hf"
                )
        return slot.view(tuple(reply["shape"]), self.dtype)

    def hidden_states(self, batch: ModelBatch) -> torch.Tensor:
        return self.forward(batch.records, batch, 0)

    def release_states(self) -> None:
        self.slots.release_read()

    def close(self) -> None:
        for slot in self.slots.every:
            self.worker.forget(str(slot.path))
        self.worker.close()
        self.slots.close()


def _batch_key(records: Sequence[EncodedRecord]) -> tuple[int, ...]:
    return tuple(record.record.index for record in records)


def refusal(records: Sequence[EncodedRecord], limit: int | None) -> EngineRefusal | None:
    """Why vLLM cannot run one of these records (its length), or None."""
    for record in records:
        if (message := too_long(record.length, limit)) is not None:
            return EngineRefusal(message, "overflow")
    return None


def load_vllm_scorer(
    release: Release, settings: ScoreSettings, dtype: str, log: Path, stop: threading.Event | None = None
) -> Scorer:
    """The vLLM worker started and loaded (its output in `log`), with clef's joint head and the
    lm_head rows; a stop request while it loads ends it (JobStopped: the job is interrupted)."""
    from clef_cli.families import family_of
    from clef_cli.model.head import load_joint_head
    from clef_cli.release import load_processor

    check_family(release)
    torch_dtype = getattr(torch, dtype)
    device = resolve_device(settings.device)  # the head runs on the model's device
    worker = VllmWorker(vllm_python(), release.path, worker_options(settings, dtype), log, stop)
    lexical = family_of(release).lexical_rows(release).to(device, torch_dtype)
    head = load_joint_head(release.path).to(device)
    tokenizer = load_processor(release).tokenizer
    backbone = VllmBackbone(worker, lexical, torch_dtype, release, settings.limits, tokenizer)
    return Scorer(backbone=backbone, head=head, pad_token_id=int(tokenizer.pad_token_id), release=release)
