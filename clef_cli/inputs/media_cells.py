"""A media field's cell as the tables people have hold it, read into media entries.

An entry is either a location (a string: a path, a URI or a `data:` URL, resolved later by the
encoder) or the medium itself, carried in the record: `InlineBytes` (a binary cell, or the
`{bytes, path}` struct that Hugging Face `datasets` writes for its `Image`, `Audio` and `Video`
features: the bytes win, a path alone is a location) or, for audio, `InlineSamples` (the
`{array, sampling_rate}` struct of pre-decoded audio). A cell is one entry or a list of them.

Inline bytes are decoded exactly as the same bytes in a file, and keyed by the same digest
(store/record_key.py), so one medium gives one prompt and one key however it arrives. Samples
are taken as the reference takes raw samples, 16 kHz mono float32; any other rate or shape is
the record's error naming it, never a silent resample.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from clef_cli.errors import RecordError
from clef_cli.inputs.json_values import kind_of, text_problem
from clef_cli.inputs.record_size import OversizeCell

SAMPLE_RATE = 16000
"""The rate pre-decoded audio must have: the model's (encoding/media.py resamples files to it)."""


@dataclass(frozen=True)
class InlineBytes:
    """A medium's encoded bytes (a PNG, a WAV, an MP4), exactly as a file would hold them."""

    data: bytes = field(repr=False)

    def __repr__(self) -> str:
        return f"InlineBytes({len(self.data)} bytes)"

    @property
    def digest(self) -> str:
        """The SHA-256 a file of these bytes is keyed by."""
        return hashlib.sha256(self.data).hexdigest()

    @property
    def key(self) -> str:
        """The entry's part of the record key (store/record_key.py): as a file of these bytes."""
        return "sha256:" + self.digest


@dataclass(frozen=True)
class InlineSamples:
    """Pre-decoded audio: 16 kHz mono float32 samples, little-endian bytes (so a record stays
    hashable and pickles small)."""

    data: bytes = field(repr=False)

    def __repr__(self) -> str:
        return f"InlineSamples({len(self.data) // 4} samples at {SAMPLE_RATE} Hz)"

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def key(self) -> str:
        return "samples:" + self.digest


@dataclass(frozen=True)
class RefusedInline:
    """A medium the record carries that was refused unread, too large to hold (its size told by
    the table's metadata: inputs/parquet_pages.py): no bytes, only why; the record's `media`
    error when it is encoded, and keyed by why, as a file over the limit is."""

    reason: str
    data: bytes = field(default=b"", repr=False)
    """Nothing: what holding it costs (`inline_size`)."""

    @property
    def key(self) -> str:
        return "refused:" + self.reason


MediaEntry = str | InlineBytes | InlineSamples | RefusedInline
"""One media entry of a record: a location, the medium itself, or one refused unread."""
MEDIA_STRUCT_KEYS = frozenset({"bytes", "path"})
SAMPLES_KEYS = frozenset({"array", "sampling_rate"})


def inline_size(*fields: tuple[MediaEntry, ...]) -> int:
    """Bytes of media a record carries itself (what holding it costs; a location costs nothing)."""
    return sum(len(entry.data) for entries in fields for entry in entries if not isinstance(entry, str))


def media_entries(value: Any, name: str, record_id: str, text: bool = False) -> tuple[MediaEntry, ...]:
    """The entries of one media field's cell (None: no media), or the record's error naming the
    entry. A list cell holds one entry per item; any other cell is one entry. `text`: the cell
    is a text table's (CSV, TSV: `text_cell`)."""
    if text and isinstance(value, str):
        value = text_cell(value, name, record_id)
    if value is None:
        return ()
    if isinstance(value, OversizeCell):
        return (RefusedInline(value.reason),)
    if isinstance(value, str) or _is_entry(value):  # one path, URL or medium is a list of one
        return (_entry(value, name, f"{name}[0]", record_id),)
    if isinstance(value, Mapping) or (not isinstance(value, Sequence) and not hasattr(value, "tolist")):
        raise RecordError(record_id, name, f"must be a list of media entries, got {kind_of(value)}")
    return tuple(_entry(item, name, f"{name}[{i}]", record_id) for i, item in enumerate(value))


def text_cell(value: str, name: str, record_id: str) -> Any:
    """A media cell of a table whose cells are all text (CSV, TSV), as a typed cell would hold
    it: empty is no media (None), text starting with `[` a JSON list of entries, other text one
    entry."""
    if not value:
        return None
    if not value.lstrip().startswith("["):
        return value
    try:
        listed = json.loads(value)
    except (json.JSONDecodeError, RecursionError, ValueError):
        listed = None
    if not isinstance(listed, list):
        raise RecordError(record_id, name, "a cell starting with [ must be a JSON list of paths")
    return listed


def _is_entry(value: Any) -> bool:
    """A cell that is one entry rather than a list of them."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return True
    return isinstance(value, Mapping) and bool(set(value) & (MEDIA_STRUCT_KEYS | SAMPLES_KEYS))


def _entry(item: Any, name: str, where: str, record_id: str) -> MediaEntry:
    if isinstance(item, str):
        if not item:
            raise RecordError(record_id, where, "empty media entry")
        if text_problem(item):
            raise RecordError(record_id, where, f"a media entry that is {text_problem(item)}")
        return item
    if isinstance(item, (bytes, bytearray, memoryview)):
        return _inline(bytes(item), where, record_id)
    if isinstance(item, Mapping) and set(item) & SAMPLES_KEYS:
        if name != "audio":
            raise RecordError(record_id, where, "decoded samples ({array, sampling_rate}) belong in audio")
        return samples_entry(item.get("array"), item.get("sampling_rate"), where, record_id)
    if isinstance(item, Mapping) and set(item) & MEDIA_STRUCT_KEYS:
        data, path = item.get("bytes"), item.get("path")
        if data is not None:  # datasets' rule: the bytes are the medium, the path only its name
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise RecordError(record_id, f"{where}.bytes", f"must be binary, got {kind_of(data)}")
            return _inline(bytes(data), where, record_id)
        if path is not None:
            return _entry(path, name, f"{where}.path", record_id)
        raise RecordError(record_id, where, "a media struct with neither bytes nor a path")
    if item is None:
        raise RecordError(record_id, where, "a null media entry (give a path or bytes, or leave it out)")
    message = f"media entries must be strings, got {kind_of(item)} (or bytes, or {{bytes, path}} structs)"
    raise RecordError(record_id, where, message)


def _inline(data: bytes, where: str, record_id: str) -> InlineBytes:
    if not data:
        raise RecordError(record_id, where, "empty media bytes")
    return InlineBytes(data)


def samples_entry(array: Any, rate: Any, where: str, record_id: str) -> InlineSamples:
    """`{array, sampling_rate}` as the model takes raw samples: 16 kHz, one channel, finite."""
    import numpy as np

    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate != SAMPLE_RATE:
        shown = rate if isinstance(rate, (int, float)) and not isinstance(rate, bool) else kind_of(rate)
        raise RecordError(
            record_id,
            f"{where}.sampling_rate",
            f"decoded audio at {shown} Hz: the model takes {SAMPLE_RATE} Hz samples and clef never resamples "
            "them (resample first, e.g. datasets' cast_column(..., Audio(sampling_rate=16000)), or give the bytes)",
        )
    not_numbers = RecordError(record_id, f"{where}.array", "decoded audio must be an array of numbers")
    not_samples = (bool, np.bool_, str, bytes, complex)  # what np.asarray would turn into floats anyway
    values = array if array is not None else []
    if isinstance(values, np.ndarray) and values.dtype.kind not in "iuf" and values.size:
        raise not_numbers  # booleans, text, complex or objects
    if isinstance(values, (list, tuple)) and any(issubclass(kind, not_samples) for kind in set(map(type, values))):
        raise not_numbers  # numpy would read True as 1.0 and "0.5" as 0.5
    try:
        samples = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise not_numbers from None
    if samples.ndim != 1:
        raise RecordError(
            record_id,
            f"{where}.array",
            f"decoded audio of shape {tuple(samples.shape)}: the model takes mono samples, one dimension "
            "(mix the channels down first)",
        )
    if samples.size == 0:
        raise RecordError(record_id, f"{where}.array", "decoded audio holds no samples")
    if not np.isfinite(samples).all():
        raise RecordError(record_id, f"{where}.array", "decoded audio holds non-finite samples (NaN or infinity)")
    return InlineSamples(samples.astype("<f4").tobytes())
