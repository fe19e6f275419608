"""The hidden-state shard format: what the writer stores, the reader gives back."""

from __future__ import annotations

import zlib

import pytest
import torch

from clef_cli.store.hidden_store import (
    HIDDEN_FORMAT_VERSION,
    HiddenPayload,
    HiddenReader,
    HiddenShardFile,
    HiddenStoreError,
    hidden_payload,
    load_states,
    pad_states,
    read_shard,
)


def _shard(tmp_path, golden_encoded, name, rows, dtype=torch.float32):
    records = [golden_encoded[row] for row in rows]
    length = max(record.length for record in records)
    hidden = torch.randn(len(records), length, 8, generator=torch.Generator().manual_seed(len(name)))
    data = hidden_payload(records, hidden, dtype).to_bytes()
    path = tmp_path / name
    path.write_bytes(data)
    return HiddenShardFile(path, len(records), zlib.crc32(data)), records, hidden


def test_round_trip_streamed_by_shard(tmp_path, golden_encoded):
    first, records_a, hidden_a = _shard(tmp_path, golden_encoded, "a.safetensors", [0, 1, 2])
    second, records_b, hidden_b = _shard(tmp_path, golden_encoded, "b.safetensors", [3, 4])
    reader = HiddenReader([first, second])
    assert reader.num_records == 5
    stored = list(reader.records())
    assert [record.index for record in stored] == [r.record.index for r in records_a + records_b]
    for record, original, row in zip(stored, records_a + records_b, [0, 1, 2, 0, 1], strict=True):
        source = hidden_a if original in records_a else hidden_b
        assert record.id == original.record.id and record.input_ids == list(original.input_ids)
        assert record.encoded.questions == original.questions
        assert record.option_ids == tuple(q.option_ids for q in original.questions)
        assert record.question_types == tuple(q.question_type for q in original.questions)
        assert torch.equal(record.hidden, source[row, : original.length])
    headers = list(reader.records(states=False))
    assert all(record.hidden is None for record in headers)
    loaded = load_states(headers[::-1])
    assert all(torch.equal(a, b.hidden) for a, b in zip(loaded, stored[::-1], strict=True))
    length = max(state.shape[0] for state in loaded[:2]) + 3
    padded = pad_states(loaded[:2], length)
    assert padded.shape == (2, length, 8) and torch.equal(padded[0, : loaded[0].shape[0]], loaded[0])
    assert not padded[0, loaded[0].shape[0] :].any()


def test_refuses_damage_and_other_versions(tmp_path, golden_encoded):
    shard, records, hidden = _shard(tmp_path, golden_encoded, "a.safetensors", [0])
    damaged = HiddenShardFile(shard.path, shard.records, shard.crc32 ^ 1)
    with pytest.raises(HiddenStoreError, match="checksum mismatch"):
        list(HiddenReader([damaged]).records())
    payload = hidden_payload(records, hidden, torch.float32)
    future = HiddenPayload(payload.tensors, payload.metadata | {"clef.hidden_format": str(HIDDEN_FORMAT_VERSION + 1)})
    path = tmp_path / "future.safetensors"
    path.write_bytes(future.to_bytes())
    with pytest.raises(HiddenStoreError, match="format version"):
        read_shard(path)
