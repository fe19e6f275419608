"""What every backbone shares: device and dtype choice, strict loading, the lexical rows.

The families (clef_cli/families/) build and run their own models; the `lm_head` is never
multiplied, its weight is kept as the head's lexical lookup table.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from clef_cli.encoding.batching import ModelBatch, collate
from clef_cli.encoding.encoded import EncodedRecord
from clef_cli.errors import ModelLoadError, ModelRefused
from clef_cli.model.dtypes import torch_dtype
from clef_cli.release import HEAD_FILES, Release

SPEECH_OUTPUT_KEYS = re.compile(r"^(talker|code2wav)\.")


def resolve_device(device: str = "auto") -> torch.device:
    """auto: the first GPU when there is one, else the CPU. A device this machine lacks is the
    option's fault, refused (`ModelRefused`, exit 2) before the job writes anything."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ModelRefused(f"unknown device {device!r} (use auto, cpu, cuda or cuda:N)") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelRefused(f"device {device!r} asked for, but no CUDA GPU is available")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ModelRefused(f"device {device!r} does not exist ({torch.cuda.device_count()} GPUs)")
    elif resolved.type != "cpu":
        raise ModelRefused(f"unsupported device {device!r} (use auto, cpu, cuda or cuda:N)")
    return resolved


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """Default: bf16 on a GPU, fp32 on the CPU."""
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return torch_dtype(dtype.lower())
    except KeyError:
        raise ModelLoadError(f"unknown dtype {dtype!r} (use auto, bfloat16, float16 or float32)") from None


def _describe_mismatch(item: object) -> str:
    if isinstance(item, tuple) and len(item) == 3:
        key, in_checkpoint, in_model = item
        return f"{key} (checkpoint {tuple(in_checkpoint)}, model {tuple(in_model)})"
    return str(item)


def check_loading_info(info: dict[str, object], release: Release) -> None:
    """Strict loading: missing, unexpected (other than speech output) or mismatched keys are one error."""
    missing = sorted(info.get("missing_keys") or ())
    unexpected = sorted(key for key in info.get("unexpected_keys") or () if not SPEECH_OUTPUT_KEYS.match(key))
    mismatched = sorted(_describe_mismatch(item) for item in info.get("mismatched_keys") or ())
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {', '.join(unexpected)}")
    if mismatched:
        problems.append(f"mismatched keys: {', '.join(mismatched)}")
    if problems:
        raise ModelLoadError(f"the weights in {release.path} do not match its config: {'; '.join(problems)}")


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Loading prints progress bars and notices on stderr; a batch job shows its own progress."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()


def load_strictly(model_class: Any, release: Release, device: torch.device, dtype: torch.dtype, **kwargs: Any) -> Any:
    """`model_class` from the release's weights, quietly; any missing, unexpected or mismatched
    key is one error (transformers would only warn)."""
    with quiet_transformers():
        try:
            model, info = model_class.from_pretrained(
                str(release.path),
                dtype=dtype,
                device_map=str(device) if device.type == "cuda" else None,
                output_loading_info=True,
                ignore_mismatched_sizes=True,  # reported below, with the others, as one error
                **kwargs,
            )
        except (OSError, ValueError, RuntimeError, KeyError, ImportError) as error:
            raise ModelLoadError(f"cannot load the model from {release.path}: {error}") from None
    check_loading_info(info, release)
    return model


def without_lm_head(model: Any, device: torch.device) -> tuple[Any, torch.Tensor]:
    """The model on `device` for inference, its lm_head replaced by identity (the output is then
    the final hidden state), and the lm_head rows kept as the head's lexical lookup table."""
    model = model.to(device).eval()
    lexical_rows = model.lm_head.weight.detach()
    model.lm_head = torch.nn.Identity()
    return model, lexical_rows


@dataclass
class Backbone(ABC):
    """A loaded backbone and the lm_head rows the head reads; its family implements the forward."""

    model: torch.nn.Module
    lexical_rows: torch.Tensor
    device: torch.device
    dtype: torch.dtype
    hidden_size: int

    in_flight: ClassVar[int] = 1
    """Batches `submit` may have started before the first of them is collected by `forward`."""

    @abstractmethod
    def hidden_states(self, batch: ModelBatch) -> torch.Tensor:
        """Final-norm hidden states `[B, L, hidden]` of a right-padded batch; each record's real
        tokens get exactly the states they get when the record runs alone."""

    def forward(self, records: Sequence[EncodedRecord], batch: ModelBatch | None, pad_token_id: int) -> torch.Tensor:
        """`hidden_states` of these records (`batch`: already collated by an encoding worker)."""
        return self.hidden_states(batch if batch is not None else collate(records, pad_token_id))

    def submit(self, records: Sequence[EncodedRecord]) -> None:
        """Start these records' forward now, before `forward` asks for it: an engine whose forward
        runs in another process keeps it busy while clef scores the batch before. In process,
        nothing to do."""
        return None

    def release_states(self) -> None:
        """The states handed out so far are read and copied where they must be kept: an engine
        that lent its own memory for them may reuse it."""
        return None

    def close(self) -> None:
        """End what the backbone runs outside this process (an engine's worker); in process, nothing."""
        return None


def load_lexical_rows(release: Release, key: str) -> torch.Tensor:
    """Only the lm_head weight `key`, read from its shard: re-scoring stored hidden states with
    another head needs these rows and nothing else of the backbone. (`Family.lexical_rows` knows
    the key.)"""
    import json

    from safetensors import safe_open

    index = release.path / "model.safetensors.index.json"
    if index.is_file():
        shard_name = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).get(key)
        candidates = [release.path / shard_name] if shard_name else []
    else:
        candidates = sorted(p for p in release.path.glob("*.safetensors") if p.name not in HEAD_FILES)
    for shard in candidates:
        with safe_open(str(shard), framework="pt") as handle:
            if key in handle.keys():  # noqa: SIM118 - safe_open has no __contains__
                return handle.get_tensor(key)
    raise ModelLoadError(f"{release.path} holds no {key}")
