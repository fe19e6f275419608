"""The hidden-state shard format: one writer for every engine, one streaming reader for rehead
and train-head.

A hidden shard is a safetensors file holding, per record, its real tokens' final hidden states
(`hidden.{index}`, `[L, hidden]`) and its input ids (`input_ids.{index}`, int32), with two
metadata keys: `clef.hidden_format` (this module's `HIDDEN_FORMAT_VERSION`) and `records`, a
JSON list with each record's index, id, prompt length, state tokens cut and, per question, its
id, type, question type, question span, option spans, option ids and criteria order. Shards
written before the version key existed have the same layout and read as version 1.

The writer takes encoded records and a padded batch of hidden states, nothing engine-specific,
so a local job, a Ray actor or any other engine produces the same bytes. The reader yields
records shard by shard (one shard's states in memory at a time) or only their metadata, and
loads the states of chosen records on demand, so a job's states are never all in memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from clef_cli.encoding.encoded import EncodedQuestion, EncodedRecord
from clef_cli.errors import ClefError
from clef_cli.inputs.records import Question, Record
from clef_cli.model.dtypes import HIDDEN_DTYPES as HIDDEN_DTYPE_NAMES
from clef_cli.model.dtypes import torch_dtype
from clef_cli.release import file_crc32
from clef_cli.store.shard_checks import forget_verified

HIDDEN_FORMAT_VERSION = 1
FORMAT_KEY = "clef.hidden_format"
RECORDS_KEY = "records"
HIDDEN_DTYPES = {name: torch_dtype(name) for name in HIDDEN_DTYPE_NAMES}


class HiddenStoreError(ClefError):
    """A hidden-state shard that cannot be read: damaged, or written in another format."""


# ----------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class HiddenPayload:
    """One shard's content, ready to be written (`to_bytes`) by whoever commits it."""

    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str]

    def to_bytes(self) -> bytes:
        return b"".join(self.chunks())

    def chunks(self) -> list[memoryview | bytes]:
        """The safetensors file as its header and each tensor's own bytes, not joined: a shard of
        a big batch is written and checksummed piece by piece, never copied into one buffer (the
        library's `save` copied every state twice on the committer's thread)."""
        return safetensors_chunks(self.tensors, self.metadata)


SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int32: "I32"}


def safetensors_chunks(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> list[memoryview | bytes]:
    """A safetensors file (8-byte header length, JSON header padded to 8 bytes, then the data):
    the widest dtypes first, so every tensor sits at an offset its element size divides."""
    import struct

    order = sorted(tensors, key=lambda name: -tensors[name].element_size())
    header: dict[str, object] = {"__metadata__": metadata}
    views, offset = [], 0
    for name in order:
        tensor = tensors[name].contiguous()
        raw = tensor.view(torch.uint8) if tensor.numel() else torch.empty(0, dtype=torch.uint8)
        size = raw.numel()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        views.append(memoryview(raw.reshape(-1).numpy()))
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return [struct.pack("<Q", len(text)) + text, *views]


def hidden_payload(records: Sequence[EncodedRecord], hidden_states: torch.Tensor, dtype: torch.dtype) -> HiddenPayload:
    """Per record: its real tokens' hidden states `[L, d]` (row `i` of the right-padded
    `hidden_states` belongs to `records[i]`), its input ids and its spans."""
    tensors: dict[str, torch.Tensor] = {}
    described = []
    hidden_cpu = hidden_states.detach().to("cpu", dtype, copy=True)  # never a view of memory lent by an engine
    for row, record in enumerate(records):
        index = record.record.index
        tensors[f"hidden.{index}"] = hidden_cpu[row, : record.length].contiguous()
        tensors[f"input_ids.{index}"] = torch.as_tensor(list(record.input_ids), dtype=torch.int32)
        described.append(
            {
                "index": index,
                "id": record.record.id,
                "prompt_tokens": record.length,
                "state_tokens_cut": record.state_tokens_cut,
                "questions": [
                    {
                        "question_id": question.id,
                        "question_type": encoded.question_type,
                        "type": question.type,
                        "question_span": list(encoded.question_span),
                        "option_spans": [list(span) for span in encoded.option_spans],
                        "option_ids": list(question.option_ids),
                        "criteria_order": list(question.criteria_order),
                    }
                    for question, encoded in zip(record.record.questions, record.questions, strict=True)
                ],
            }
        )
    metadata = {FORMAT_KEY: str(HIDDEN_FORMAT_VERSION), RECORDS_KEY: json.dumps(described, ensure_ascii=False)}
    return HiddenPayload(tensors, metadata)


# ----------------------------------------------------------------------------- reading

STATE_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
MAX_HEADER = 1 << 30


def states_dtype(read: Callable[[int, int], bytes]) -> str | None:
    """The dtype a hidden shard keeps its states in, from its header alone (`read(start, end)`:
    the file's bytes in that range, a local file's or an object's by a ranged GET); None when the
    bytes are no hidden shard or it holds no states."""
    try:
        length = int.from_bytes(read(0, 8), "little")
        if not 2 <= length <= MAX_HEADER:
            return None
        header = json.loads(read(8, 8 + length))
        name = next((key for key in header if key.startswith("hidden.")), None)
        return STATE_DTYPES.get(header[name]["dtype"]) if name is not None else None
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def file_states_dtype(path: Path) -> str | None:
    """`states_dtype` of a local hidden shard (None when it cannot be read)."""

    def read(start: int, end: int) -> bytes:
        with open(path, "rb") as handle:
            handle.seek(start)
            return handle.read(end - start)

    try:
        return states_dtype(read)
    except OSError:
        return None


@dataclass(frozen=True)
class HiddenShardFile:
    """A committed hidden shard: where it is and the CRC32 its journal line promises; `fetch`
    downloads it first when it is a part of a store in a bucket (read only when needed)."""

    path: Path
    records: int
    crc32: int
    fetch: Callable[[], object] | None = field(default=None, compare=False)

    def local(self) -> Path:
        if self.fetch is not None and not self.path.exists():
            self.fetch()
        return self.path

    def verify(self) -> bool:
        return file_crc32(self.local()) == self.crc32


@dataclass(frozen=True)
class StoredRecord:
    """One stored record: its encoding rebuilt (ids, spans, option order; no state, no media)
    and, unless read without them, its hidden states `[L, hidden]` in the stored dtype."""

    encoded: EncodedRecord
    shard: Path
    hidden: torch.Tensor | None = None

    @property
    def index(self) -> int:
        return self.encoded.record.index

    @property
    def id(self) -> str:
        return self.encoded.record.id

    @property
    def length(self) -> int:
        return self.encoded.length

    @property
    def input_ids(self) -> list[int]:
        return self.encoded.input_ids

    @property
    def option_ids(self) -> tuple[tuple[str, ...], ...]:
        return tuple(question.option_ids for question in self.encoded.questions)

    @property
    def question_types(self) -> tuple[int, ...]:
        return tuple(question.question_type for question in self.encoded.questions)


def _rebuild(stored: dict, input_ids: list[int]) -> EncodedRecord:
    questions = tuple(
        Question(
            id=q["question_id"],
            type=q["type"],
            instructions=None,
            options=tuple((option_id, None) for option_id in q["option_ids"]),
            criteria_order=tuple(q["criteria_order"]),
        )
        for q in stored["questions"]
    )
    encoded_questions = tuple(
        EncodedQuestion(
            question_id=q["question_id"],
            question_type=q["question_type"],
            question_span=tuple(q["question_span"]),
            option_spans=tuple(tuple(span) for span in q["option_spans"]),
            option_ids=tuple(q["option_ids"]),
        )
        for q in stored["questions"]
    )
    record = Record(id=stored["id"], index=stored["index"], state=None, questions=questions)
    return EncodedRecord(
        record=record, input_ids=input_ids, questions=encoded_questions, state_tokens_cut=stored["state_tokens_cut"]
    )


def read_shard(path: Path, states: bool = True, only: Collection[int] | None = None) -> list[StoredRecord]:
    """Every record of one shard (those whose index is in `only`, when given), with its hidden
    states when `states` (only the header and the input ids are read otherwise)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            version = metadata.get(FORMAT_KEY, "1")
            if version != str(HIDDEN_FORMAT_VERSION):
                raise HiddenStoreError(
                    f"hidden-state shard {path} has format version {version}; this clef reads "
                    f"{HIDDEN_FORMAT_VERSION} (rerun the job with --restart to store them again)"
                )
            rebuilt = []
            for stored in json.loads(metadata[RECORDS_KEY]):
                index = stored["index"]
                if only is not None and index not in only:
                    continue
                encoded = _rebuild(stored, handle.get_tensor(f"input_ids.{index}").tolist())
                hidden = handle.get_tensor(f"hidden.{index}") if states else None
                rebuilt.append(StoredRecord(encoded, path, hidden))
    except (SafetensorError, OSError, KeyError, ValueError, TypeError) as error:
        raise HiddenStoreError(f"hidden-state shard {path} is unreadable: {error}") from None
    return rebuilt


def check_shard(shard: HiddenShardFile) -> None:
    if not shard.verify():
        forget_verified(shard.path.parent.parent, shard.path.name)  # the next run checks it, and drops it
        raise HiddenStoreError(
            f"hidden-state shard {shard.path} is damaged (checksum mismatch); rerun the job's own command: it "
            "computes that shard's records again"
        )


class HiddenReader:
    """A checkpoint's stored records, streamed shard by shard in commit order."""

    def __init__(self, shards: Iterable[HiddenShardFile]) -> None:
        self.shards = list(shards)

    @property
    def num_records(self) -> int:
        return sum(shard.records for shard in self.shards)

    def verify(self, only: Collection[Path] | None = None) -> None:
        """Check every shard's checksum (one sequential read of the states) before a long job;
        only those at the paths in `only` when given (a store in a bucket downloads what it checks)."""
        for shard in self.shards:
            if only is None or shard.path in only:
                check_shard(shard)

    def by_shard(
        self, states: bool = True, verify: bool = True
    ) -> Iterator[tuple[HiddenShardFile, list[StoredRecord]]]:
        """Each shard with its records; at most one shard's states are held at a time."""
        for shard in self.shards:
            if verify and states:
                check_shard(shard)
            yield shard, read_shard(shard.local(), states)

    def records(self, states: bool = True, verify: bool = True) -> Iterator[StoredRecord]:
        for _, stored in self.by_shard(states, verify):
            yield from stored


def load_states(records: Sequence[StoredRecord]) -> list[torch.Tensor]:
    """The hidden states of the given records (read without them), in the given order; each
    shard is opened once and only the asked-for tensors are read."""
    from safetensors import SafetensorError, safe_open

    states: list[torch.Tensor | None] = [None] * len(records)
    by_shard: dict[Path, list[int]] = {}
    for position, record in enumerate(records):
        by_shard.setdefault(record.shard, []).append(position)
    for path, positions in by_shard.items():
        try:
            with safe_open(str(path), framework="pt") as handle:
                for position in positions:
                    states[position] = handle.get_tensor(f"hidden.{records[position].index}")
        except (SafetensorError, OSError) as error:
            raise HiddenStoreError(f"hidden-state shard {path} is unreadable: {error}") from None
    return [state for state in states if state is not None]


def pad_states(states: Sequence[torch.Tensor], length: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Right-pad stored states `[L_i, d]` into one `[B, length, d]` batch, as the scorer pads."""
    padded = torch.zeros(len(states), length, states[0].shape[-1], dtype=dtype)
    for row, state in enumerate(states):
        padded[row, : state.shape[0]] = state.to(dtype)
    return padded
