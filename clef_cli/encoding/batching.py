"""Planning token-budget batches and collating encoded records into one padded forward.

The traps of DESIGN §6 live here: the processor runs per record and its outputs are collated by
hand, media tensors are concatenated in row order (the rope index counters run across the
batch), records that need audio-in-video never share a forward with records that don't, and the
padding is on the right so each record's real tokens keep their positions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import torch

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


MediaSpans = dict[str, tuple[int, int, int]]
"""Per record: where its media sit in the batch's tensors (first row, end row, own last-dim width)."""
Allocate = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]


def casts_with_model(name: str, tensor: torch.Tensor) -> bool:
    """The media tensors the model takes in its compute dtype (all floating ones but the grid's seconds)."""
    return tensor.is_floating_point() and name != "video_second_per_grid"


@dataclass
class ModelBatch:
    """One padded forward's inputs, in the thinker's own argument names."""

    records: list[EncodedRecord]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    media: dict[str, torch.Tensor]
    use_audio_in_video: bool
    spans: tuple[MediaSpans, ...] = ()

    def model_inputs(self, device: torch.device | str, dtype: torch.dtype) -> dict[str, object]:
        """The tensors on `device`; to a GPU they go from pinned memory without blocking, so the
        host does not wait for each copy (the forward, on the same stream, runs after them).
        Media already in `dtype` (cast by the encoding worker) are not copied again."""
        device = torch.device(device)
        inputs: dict[str, object] = {
            "input_ids": _to(self.input_ids, device),
            "attention_mask": _to(self.attention_mask, device),
        }
        for name, value in self.media.items():
            if casts_with_model(name, value):
                value = value.to(dtype)
            inputs[name] = _to(value, device)
        return inputs

    def pinned(self) -> ModelBatch:
        """The same batch in page-locked memory (for a GPU), so its copies to the device do not block."""
        media = {name: value.pin_memory() for name, value in self.media.items()}
        return replace(
            self, input_ids=self.input_ids.pin_memory(), attention_mask=self.attention_mask.pin_memory(), media=media
        )

    def without_record_media(self) -> ModelBatch:
        """For sending to another process: the records' own media are in the batch's tensors."""
        return replace(self, records=[replace(record, media={}) for record in self.records])

    def with_record_views(self) -> ModelBatch:
        """The records with their own media again, as views of this batch's tensors (no copy):
        the backbone reads them (audio clips per record), and a split batch collates them."""
        records = [replace(record, media=self._record_media(row)) for row, record in enumerate(self.records)]
        return replace(self, records=records)

    def _record_media(self, row: int) -> dict[str, torch.Tensor]:
        media = {}
        for name, (start, stop, width) in self.spans[row].items():
            value = self.media[name]
            if name in TOKEN_ALIGNED:
                media[name] = value[row, start:stop]
            elif name in PADDED_AUDIO:
                media[name] = value[start:stop, ..., :width]
            else:
                media[name] = value[start:stop]
        return media


def _to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def _plain(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def collate(
    records: Sequence[EncodedRecord],
    pad_token_id: int,
    allocate: Allocate = _plain,
    media_dtype: torch.dtype | None = None,
) -> ModelBatch:
    """Right-pad the records' ids and join their media tensors in row order, each written once
    into a tensor from `allocate` (shared memory, in an encoding worker); floating media are cast
    to `media_dtype` on the way, exactly as the model's own cast would."""
    if not records:
        raise ValueError("cannot collate an empty batch")
    flags = {record.use_audio_in_video for record in records}
    if len(flags) > 1:
        raise ValueError("records with and without audio-in-video cannot share one forward")
    length = max(record.length for record in records)
    input_ids = allocate((len(records), length), torch.long).fill_(pad_token_id)
    attention_mask = allocate((len(records), length), torch.long).zero_()
    for row, record in enumerate(records):
        input_ids[row, : record.length] = torch.as_tensor(record.input_ids, dtype=torch.long)
        attention_mask[row, : record.length] = 1
    spans: list[MediaSpans] = [{} for _ in records]
    media: dict[str, torch.Tensor] = {}
    for name in TOKEN_ALIGNED:
        if any(name in record.media for record in records):
            aligned = media[name] = allocate((len(records), length), torch.long).zero_()
            for row, record in enumerate(records):
                if name in record.media:
                    values = torch.as_tensor(record.media[name]).reshape(-1)
                    start = record.media_span[0]
                    aligned[row, start : start + values.numel()] = values
                    spans[row][name] = (start, start + values.numel(), 0)
    for name in CONCATENATED_MEDIA + PADDED_AUDIO:
        rows = [(row, record.media[name]) for row, record in enumerate(records) if name in record.media]
        if rows:
            media[name] = _joined(name, rows, spans, allocate, media_dtype)
    return ModelBatch(
        records=list(records),
        input_ids=input_ids,
        attention_mask=attention_mask,
        media=media,
        use_audio_in_video=flags.pop(),
        spans=tuple(spans),
    )


def _joined(
    name: str,
    rows: list[tuple[int, torch.Tensor]],
    spans: list[MediaSpans],
    allocate: Allocate,
    media_dtype: torch.dtype | None,
) -> torch.Tensor:
    """The parts one after another along dim 0 (audio right-padded with zeros to the longest)."""
    first = torch.as_tensor(rows[0][1])
    dtype = media_dtype if media_dtype is not None and casts_with_model(name, first) else first.dtype
    trailing = tuple(first.shape[1:])
    padded = name in PADDED_AUDIO
    if padded:
        trailing = (*trailing[:-1], max(part.shape[-1] for _, part in rows))
    joined = allocate((sum(part.shape[0] for _, part in rows), *trailing), dtype)
    if padded:
        joined.zero_()
    start = 0
    for row, part in rows:
        stop = start + part.shape[0]
        target = joined[start:stop, ..., : part.shape[-1]] if padded else joined[start:stop]
        target.copy_(torch.as_tensor(part))
        spans[row][name] = (start, stop, part.shape[-1])
        start = stop
    return joined
