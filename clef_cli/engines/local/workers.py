"""What runs inside an encoding worker: its encoder, planning a record, encoding one.

Each worker process builds its own `PromptEncoder` from an `EncoderSpec`; the functions here are
the tasks `EncodePool` sends it (module-level, so that they pickle). With `workers=0` they run in
the main process, the same way.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from clef_cli import faults
from clef_cli.choices import OverflowPolicy, SpecialTokens
from clef_cli.encoding.batching import casts_with_model
from clef_cli.encoding.encoded import EncodedRecord
from clef_cli.encoding.media import MediaLimits, set_decode_threads
from clef_cli.encoding.prompt import PromptEncoder
from clef_cli.errors import RecordError
from clef_cli.inputs.records import Record
from clef_cli.model.dtypes import torch_dtype


@dataclass(frozen=True)
class EncoderSpec:
    """Everything a worker process needs to build its own `PromptEncoder` (picklable)."""

    release_path: Path
    max_length: int
    overflow: OverflowPolicy
    limits: MediaLimits
    spool: Path | None = None
    """Where planning leaves each record's media tensors, so the batch that runs it later need
    not decode its media again; None drops them (a dry run)."""
    family: str = "omni"
    decode_threads: int = 1
    """FFmpeg threads per video decoder in each worker (more than one when cores are left over)."""
    media_dtype: str | None = None
    """The model's compute dtype when it is not float32: floating media are cast to it in the
    worker (the same rounding as the model's own cast), so half the bytes travel and spool."""
    images_from_headers: bool = False
    """Plan image records from their headers (their token count depends only on their size) and
    decode them once, when their batch is made; a dry run decodes them to check them."""
    special_tokens: SpecialTokens = SpecialTokens.text
    """Whether special-token strings in a record's text stay text (`--special-tokens`)."""

    def build(self) -> PromptEncoder:
        from clef_cli.families import family_named
        from clef_cli.release import Release, load_processor

        release = Release(path=self.release_path, model_id=str(self.release_path), revision=None, config={})
        family = family_named(self.family)
        processor = load_processor(release)
        return PromptEncoder(processor, self.max_length, self.overflow, self.limits, family, self.special_tokens)


@dataclass(frozen=True)
class Planned:
    """A planned record: its length, or why it cannot be scored, and its encoding (ids as int32).
    Media tensors never travel with it: they wait in a spool file (within a disk budget) until
    the record's batch runs, or, without one, the record is encoded again then."""

    record: Record
    length: int | None = None
    audio_in_video: bool = False
    error: str | None = None
    error_kind: str = "media"
    encoded: EncodedRecord | None = None
    spooled: Path | None = None
    spooled_bytes: int = 0
    seconds: float = 0.0
    """Time spent encoding it (for the job's encode rates)."""
    from_headers: bool = False
    """Planned from its images' headers: `encoded` holds its exact ids; its images are decoded
    when its batch is made (`complete_record`)."""

    def ready(self) -> EncodedRecord | None:
        """The full encoding, media read back from the spool; None when its media must be
        decoded (again) first."""
        if self.from_headers:
            return None
        if self.encoded is None or not self.record.has_media:
            return self.encoded
        if self.spooled is None:
            return None
        from safetensors.torch import load_file

        return replace(self.encoded, media=load_file(str(self.spooled)))

    def discard(self) -> None:
        if self.spooled is not None:
            self.spooled.unlink(missing_ok=True)


_worker_encoder: PromptEncoder | None = None
_worker_spool: Path | None = None
_worker_media_dtype: torch.dtype | None = None
_worker_images_from_headers = False
_in_pool_worker = False


def init_encoder(spec: EncoderSpec) -> None:
    global _worker_encoder, _worker_spool, _worker_media_dtype, _worker_images_from_headers
    set_decode_threads(spec.decode_threads)
    _worker_encoder = spec.build()
    _worker_spool = spec.spool
    _worker_images_from_headers = spec.images_from_headers
    _worker_media_dtype = torch_dtype(spec.media_dtype) if spec.media_dtype else None


def _exit_with_parent(parent: int, interval: float = 1.0) -> None:
    """A job killed outright (SIGKILL, the OOM killer) cannot stop its pool; its workers notice
    they were orphaned and exit instead of lingering with a model's worth of memory."""
    while os.getppid() == parent:
        time.sleep(interval)
    os._exit(1)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""glibc's `mallopt` parameters."""


def _keep_freed_buffers_warm() -> None:
    """By default glibc hands each freed buffer of a few megabytes back to the system, so every
    image's float32 patches (22 MB at 720p) land in new pages, and here faulting new pages in
    costs about as much as normalising the image (issue 24). Buffers up to 32 MiB then come from
    the heap, which keeps up to 512 MiB of freed memory (within a worker's estimated peak), so a
    batch reuses the pages of the one before it. Not glibc: nothing to do."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 512 << 20)
    except (OSError, AttributeError):
        pass


def init_pool_worker(spec: EncoderSpec) -> None:
    """A background worker: one CPU thread for torch, and Ctrl-C left to the main process (which
    finishes its batch and stops the pool) instead of killing the worker mid-task."""
    import signal

    import torch

    global _in_pool_worker
    _in_pool_worker = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    torch.set_num_threads(1)
    _keep_freed_buffers_warm()
    init_encoder(spec)


def _encoder() -> PromptEncoder:
    assert _worker_encoder is not None, "worker not initialised"
    return _worker_encoder


def worker_media_dtype() -> torch.dtype | None:
    """The dtype this worker casts floating media to (None: as the processor made them)."""
    return _worker_media_dtype


def in_pool_worker() -> bool:
    """True in a background encoding process (its results travel to the main process)."""
    return _in_pool_worker


def pad_token_id() -> int:
    return int(_encoder().processor.tokenizer.pad_token_id)


def compact(encoded: EncodedRecord) -> EncodedRecord:
    return replace(encoded, input_ids=np.asarray(encoded.input_ids, dtype=np.int32))


def plan_record(record: Record) -> Planned:
    """Measure the prompt: from the images' headers where they tell it (the batch decodes them),
    else by encoding it, its media tensors then going to the spool (when there is one)."""
    faults.maybe_crash(record.id)
    started = time.perf_counter()
    try:
        sketch = _encoder().plan(record) if _worker_images_from_headers else None
        encoded = sketch or _encoder().encode(record)
    except RecordError as error:
        return Planned(record, error=str(error), error_kind=error.kind or "media")
    faults.slow_encode()
    seconds = time.perf_counter() - started
    planned = Planned(record, encoded.length, encoded.use_audio_in_video, encoded=compact(encoded), seconds=seconds)
    if sketch is not None:
        return replace(planned, from_headers=True)
    if not encoded.media:
        return planned
    if _worker_spool is None:
        return replace(planned, encoded=None)
    from safetensors.torch import save_file

    path = _worker_spool / f"{record.index}.safetensors"
    save_file({name: _cast(name, tensor).contiguous() for name, tensor in encoded.media.items()}, str(path))
    media_free = replace(planned.encoded, media={}) if planned.encoded is not None else None
    return replace(planned, encoded=media_free, spooled=path, spooled_bytes=path.stat().st_size)


def _cast(name: str, tensor: torch.Tensor) -> torch.Tensor:
    dtype = _worker_media_dtype
    return tensor.to(dtype) if dtype is not None and casts_with_model(name, tensor) else tensor


def within_budget(planned: Planned, budget: list[int]) -> Planned:
    """Keep a planned record's spooled media while `budget[0]` bytes remain; else drop them (the
    record is then encoded again when its batch runs)."""
    if planned.spooled is None:
        return planned
    if planned.spooled_bytes <= budget[0]:
        budget[0] -= planned.spooled_bytes
        return planned
    planned.discard()
    return replace(planned, encoded=None, spooled=None, spooled_bytes=0)


def _encoding(record: Record, encode: Callable[[], EncodedRecord]) -> EncodedRecord | tuple[str, str]:
    """One encoding task: the encoding, or (the error, its kind)."""
    faults.maybe_crash(record.id)
    try:
        encoded = encode()
    except RecordError as error:
        return str(error), error.kind or "media"
    faults.slow_encode()
    return encoded


def encode_record(record: Record) -> EncodedRecord | tuple[str, str]:
    """The encoding, or (the error, its kind)."""
    return _encoding(record, lambda: compact(_encoder().encode(record)))


def complete_record(planned: Planned) -> EncodedRecord | tuple[str, str]:
    """What its batch needs of a record `ready()` could not give: the plan's encoding with its
    images decoded now, or the record encoded again (its spooled media dropped)."""
    encoded = planned.encoded
    if not planned.from_headers or encoded is None:
        return encode_record(planned.record)
    return _encoding(planned.record, lambda: _encoder().with_images(encoded))


CRASHED = "the encoding process crashed on this record (a media decoder failed hard)"


def planning_crashed(record: Record) -> Planned:
    return Planned(record, error=str(RecordError(record.id, "media", CRASHED)), error_kind="transient")


def encoding_crashed(record: Record) -> tuple[str, str]:
    return str(RecordError(record.id, "media", CRASHED)), "transient"
