"""Cut (b): vLLM as the backbone. The worker returns each prompt's final hidden states and clef's
own joint head scores them, exactly as the HF engine does, so results, hidden states for the
store (--hidden-states keep, --rehead, train-head) and every check downstream are the same code.

Records go to vLLM as the token ids clef's prompt encoder made (requests.py: media placeholders
collapsed, the media and the processor options beside them); vLLM's expanded ids must equal ours.
Media kinds not yet proven exact are refused as their records' errors."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from clef_cli.encoding.batching import ModelBatch
from clef_cli.encoding.media import MediaLimits
from clef_cli.engines.vllm.client import VllmRecordError, VllmWorker, vllm_python
from clef_cli.engines.vllm.limits import MEDIA_REFUSED, EngineRefusal, too_long
from clef_cli.engines.vllm.mm_requests import unsupported_media, vllm_request
from clef_cli.errors import UsageError
from clef_cli.model.backbone import Backbone
from clef_cli.model.scoring import Scorer
from clef_cli.release import Release
from clef_cli.settings import ScoreSettings

FAMILIES = ("omni",)


def check_family(release: Release) -> None:
    """Refuse, before any work, a family this engine does not serve."""
    if release.family not in FAMILIES:
        raise UsageError(
            f"--engine vllm serves the Clef-Omni family only; {release.family!r} ({release.path}) is not proven "
            "exact against the HF engine on vLLM yet: use --engine hf"
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
        }
    return options


class VllmBackbone(Backbone):
    """The thinker served by a vLLM worker; hidden states come back over the pipe."""

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
        self.device = torch.device("cpu")
        self.dtype = dtype
        self.hidden_size = int(lexical_rows.shape[1])

    def tokenize(self, text: str) -> list[int]:
        """Placeholder text to ids, as the prompt encoder's processor call tokenizes it."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def hidden_states(self, batch: ModelBatch) -> torch.Tensor:
        """Right-padded `[B, L, hidden]`: each prompt runs as its own vLLM request, so a record's
        states do not depend on its batch."""
        for record in batch.records:  # planning refused these already (VllmScoreJob): a safety net
            if (kind := unsupported_media(record)) is not None:
                raise EngineRefusal(MEDIA_REFUSED.format(kind=kind), "unsupported")
            if (message := too_long(record.length, self.worker.max_model_len)) is not None:
                raise EngineRefusal(message, "overflow")
        prompts = [vllm_request(record, self.release, self.limits, self.tokenize) for record in batch.records]
        states = self.worker.hidden(prompts)
        longest = max(record.length for record in batch.records)
        padded = torch.zeros(len(states), longest, self.hidden_size, dtype=self.dtype)
        for row, (record, (state, ids)) in enumerate(zip(batch.records, states, strict=True)):
            if ids != list(record.input_ids):
                raise VllmRecordError(
                    f"vLLM expanded the prompt to {len(ids)} tokens, not the {record.length} clef's encoder made "
                    "(the media processors disagree): score this record with --engine hf"
                )
            padded[row, : record.length] = torch.from_numpy(state).to(self.dtype)
        return padded


def load_vllm_scorer(
    release: Release, settings: ScoreSettings, dtype: str, log: Path, stop: threading.Event | None = None
) -> Scorer:
    """The vLLM worker started and loaded (its output in `log`), with clef's joint head and the
    lm_head rows; a stop request while it loads ends it (KeyboardInterrupt: exit 130)."""
    from clef_cli.families import family_of
    from clef_cli.model.head import load_joint_head
    from clef_cli.release import load_processor

    check_family(release)
    torch_dtype = getattr(torch, dtype)
    worker = VllmWorker(vllm_python(), release.path, worker_options(settings, dtype), log, stop)
    lexical = family_of(release).lexical_rows(release).to(torch_dtype)
    head = load_joint_head(release.path)
    tokenizer = load_processor(release).tokenizer
    backbone = VllmBackbone(worker, lexical, torch_dtype, release, settings.limits, tokenizer)
    return Scorer(backbone=backbone, head=head, pad_token_id=int(tokenizer.pad_token_id), release=release)
