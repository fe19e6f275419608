"""Media the record carries itself (inputs/media_cells.py): a cell's encoded bytes, opened as a
file's would be under the same limits, and pre-decoded audio samples, taken as they are."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import numpy as np

from clef_cli.encoding.media_limits import MediaError, MediaLimits
from clef_cli.inputs.media_cells import SAMPLE_RATE, InlineBytes, InlineSamples, RefusedInline

if TYPE_CHECKING:
    from typing import BinaryIO


def open_inline(entry: InlineBytes | InlineSamples | RefusedInline, limits: MediaLimits) -> io.BytesIO | InlineSamples:
    """A cell's bytes as a file's would be read (--max-file-bytes against the cell's length; a
    BytesIO over the record's own bytes object, not a copy), or its samples as they are; a cell
    refused unread (too large to hold) is the media error it was refused with."""
    if isinstance(entry, InlineSamples):
        return entry
    if isinstance(entry, RefusedInline):
        raise MediaError(entry.reason)
    if len(entry.data) > limits.max_file_bytes:
        raise MediaError(f"inline media is {len(entry.data)} bytes, over the limit of {limits.max_file_bytes}")
    return io.BytesIO(entry.data)


def inline_samples(entry: InlineSamples, limits: MediaLimits) -> np.ndarray:
    """Pre-decoded audio (16 kHz mono float32, checked when the record was read) within the
    duration limit: the samples the model takes, as they are."""
    samples = np.frombuffer(entry.data, dtype="<f4").astype(np.float32)
    if samples.shape[0] > limits.max_audio_seconds * SAMPLE_RATE:
        seconds = samples.shape[0] / SAMPLE_RATE
        raise MediaError(f"audio is {seconds:.1f} s long, over the limit of {limits.max_audio_seconds:g} s")
    return samples


def not_samples(source: str | BinaryIO | InlineSamples, kind: str) -> str | BinaryIO:
    if isinstance(source, InlineSamples):
        raise MediaError(f"decoded audio samples cannot be read as {kind}")
    return source
