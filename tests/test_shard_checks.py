"""A resume reads only the hidden states that are new or changed since they last verified; damage
that leaves a file's times alone is caught by a reader, and the next run then drops the shard."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import clef_cli.store.shard_checks as shard_checks
from clef_cli.store.hidden_store import HiddenStoreError, check_shard
from clef_cli.store.shard_checks import VERIFIED

from .support.helpers import write_jsonl
from .test_checkpoint import in_process, records

SETTINGS = ("--max-batch-size", "4", "--hidden-dtype", "float32")


@pytest.fixture
def crc_reads(monkeypatch) -> list[str]:
    """The hidden-state files a check reads through (their CRC32 computed)."""
    read: list[str] = []
    real = shard_checks.file_crc32
    monkeypatch.setattr(shard_checks, "file_crc32", lambda path: read.append(Path(path).name) or real(path))
    return read


def _hidden_files(checkpoint: Path) -> list[Path]:
    entries = [json.loads(line) for line in (checkpoint / "journal.jsonl").read_text().splitlines()]
    return [checkpoint / "shards" / entry["files"]["hidden"]["name"] for entry in entries]


def test_a_resume_reads_only_new_or_changed_hidden_states_and_a_reader_flags_silent_damage(tmp_path, crc_reads):
    inputs, output = write_jsonl(tmp_path / "in.jsonl", records()), tmp_path / "out.parquet"
    checkpoint = Path(str(output) + ".ckpt")
    assert in_process(inputs, output, *SETTINGS).exit_code == 0
    files = _hidden_files(checkpoint)
    assert len(files) == 6 and not crc_reads  # a fresh store: nothing to check yet

    assert in_process(inputs, output, *SETTINGS).exit_code == 0
    assert sorted(crc_reads) == sorted(path.name for path in files)  # written by the last run: checked once
    assert set(json.loads((checkpoint / VERIFIED).read_text())) == {path.name for path in files}

    crc_reads.clear()
    assert in_process(inputs, output, *SETTINGS).exit_code == 0
    assert crc_reads == []  # nothing changed since: nothing read

    touched = files[1]
    touched.write_bytes(touched.read_bytes())  # the same bytes, written again: checked again
    crc_reads.clear()
    assert in_process(inputs, output, *SETTINGS).exit_code == 0
    assert crc_reads == [touched.name]

    # bit rot: one flipped bit, the size and times as they were; the resume trusts its memo ...
    rotten = files[2]
    times = os.stat(rotten)
    data = bytearray(rotten.read_bytes())
    data[-100] ^= 0x01
    rotten.write_bytes(bytes(data))
    os.utime(rotten, ns=(times.st_atime_ns, times.st_mtime_ns))
    crc_reads.clear()
    assert in_process(inputs, output, *SETTINGS).exit_code == 0
    assert crc_reads == []
    # ... a reader does not, and strikes it from the memo ...
    from clef_cli.store.checkpoint import Checkpoint

    shards = {shard.path.name: shard for shard in Checkpoint.open_existing(checkpoint).hidden_shards()}
    with pytest.raises(HiddenStoreError, match="damaged"):
        check_shard(shards[rotten.name])
    assert rotten.name not in json.loads((checkpoint / VERIFIED).read_text())
    # ... so the next run checks it, drops it and computes its records again
    healed = in_process(inputs, output, *SETTINGS)
    assert healed.exit_code == 0
    assert "again for damaged checkpoint shards" in healed.stderr
    assert rotten.name not in {path.name for path in _hidden_files(checkpoint)}
