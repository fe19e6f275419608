"""Planning token-budget batches and collating encoded records into one padded forward.

The traps of DESIGN §6 live here: the processor runs per record and its outputs are collated by
hand, media tensors are concatenated in row order (the rope index counters run across the
batch), records that need audio-in-video never share a forward with records that don't, and the
padding is on the right so each record's real tokens keep their positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from clef_cli.encoding.encoded import EncodedRecord

CONCATENATED_MEDIA = (
    "pixel_values",
    "image_grid_thw",
    "pixel_values_videos",
    "video_grid_thw",
    "video_second_per_grid",
)
PADDED_AUDIO = ("input_features", "feature_attention_mask")
TOKEN_ALIGNED = ("mm_token_type_ids",)
"""Per-token media tensors of the media segment, placed at each record's media offset."""


@dataclass(frozen=True)
class PlanEntry:
    """What the planner keeps per record: small, so millions of them fit in memory."""

    index: int
    length: int
    audio_in_video: bool = False


@dataclass(frozen=True)
class PlannedBatch:
    entries: tuple[PlanEntry, ...]

    @property
    def padded_length(self) -> int:
        return max(entry.length for entry in self.entries)

    @property
    def padded_tokens(self) -> int:
        return self.padded_length * len(self.entries)

    @property
    def real_tokens(self) -> int:
        return sum(entry.length for entry in self.entries)

    @property
    def indices(self) -> list[int]:
        return [entry.index for entry in self.entries]


def plan_batches(entries: Iterable[PlanEntry], max_batch_tokens: int, max_batch_size: int) -> list[PlannedBatch]:
    """Longest first, greedily filled while batch size x longest length fits the token budget.

    Sorting by length keeps padding small; the first batch is the longest, so it doubles as the
    memory probe. A record longer than the budget still gets a batch of its own.
    """
    by_flag: dict[bool, list[PlanEntry]] = {}
    for entry in entries:
        by_flag.setdefault(entry.audio_in_video, []).append(entry)
    batches: list[PlannedBatch] = []
    for group in by_flag.values():
        group.sort(key=lambda entry: (-entry.length, entry.index))
        current: list[PlanEntry] = []
        for entry in group:
            if current and (
                len(current) >= max_batch_size or (len(current) + 1) * current[0].length > max_batch_tokens
            ):
                batches.append(PlannedBatch(tuple(current)))
                current = []
            current.append(entry)
        if current:
            batches.append(PlannedBatch(tuple(current)))
    batches.sort(key=lambda batch: (-batch.padded_length, batch.entries[0].index))
    return batches


@dataclass
class ModelBatch:
    """One padded forward's inputs, in the thinker's own argument names."""

    records: list[EncodedRecord]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    media: dict[str, torch.Tensor]
    use_audio_in_video: bool

    def model_inputs(self, device: torch.device | str, dtype: torch.dtype) -> dict[str, object]:
        """The tensors on `device`; to a GPU they go from pinned memory without blocking, so the
        host does not wait for each copy (the forward, on the same stream, runs after them)."""
        device = torch.device(device)
        inputs: dict[str, object] = {
            "input_ids": _to(self.input_ids, device),
            "attention_mask": _to(self.attention_mask, device),
        }
        for name, value in self.media.items():
            if value.is_floating_point() and name not in ("video_second_per_grid",):
                value = value.to(dtype)
            inputs[name] = _to(value, device)
        return inputs


def _to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def collate(records: Sequence[EncodedRecord], pad_token_id: int) -> ModelBatch:
    """Right-pad the records' ids and join their media tensors in row order."""
    if not records:
        raise ValueError("cannot collate an empty batch")
    flags = {record.use_audio_in_video for record in records}
    if len(flags) > 1:
        raise ValueError("records with and without audio-in-video cannot share one forward")
    length = max(record.length for record in records)
    input_ids = torch.full((len(records), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(records), length), dtype=torch.long)
    for row, record in enumerate(records):
        input_ids[row, : record.length] = torch.tensor(record.input_ids, dtype=torch.long)
        attention_mask[row, : record.length] = 1
    media: dict[str, torch.Tensor] = {}
    for name in TOKEN_ALIGNED:
        if any(name in record.media for record in records):
            aligned = torch.zeros((len(records), length), dtype=torch.long)
            for row, record in enumerate(records):
                if name in record.media:
                    values = torch.as_tensor(record.media[name]).reshape(-1)
                    start = record.media_span[0]
                    aligned[row, start : start + values.numel()] = values
            media[name] = aligned
    for name in CONCATENATED_MEDIA:
        parts = [record.media[name] for record in records if name in record.media]
        if parts:
            media[name] = torch.cat([torch.as_tensor(part) for part in parts], dim=0)
    audio = [record.media for record in records if "input_features" in record.media]
    if audio:
        frames = max(item["input_features"].shape[-1] for item in audio)
        media["input_features"] = torch.cat(
            [F.pad(item["input_features"], (0, frames - item["input_features"].shape[-1])) for item in audio]
        )
        media["feature_attention_mask"] = torch.cat(
            [
                F.pad(item["feature_attention_mask"], (0, frames - item["feature_attention_mask"].shape[-1]))
                for item in audio
            ]
        )
    return ModelBatch(
        records=list(records),
        input_ids=input_ids,
        attention_mask=attention_mask,
        media=media,
        use_audio_in_video=flags.pop(),
    )
