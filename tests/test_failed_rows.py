"""Failed rows that cannot be mistaken (issue 50, point 10): a copy of a failed prompt names its
own record in its error, a row whose id cannot be read has a null id (never a position that a
real record's id may repeat), and pre-decoded audio holds numbers, not booleans or text."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clef_cli.engines.local.pipeline import ScoreJob
from clef_cli.errors import RecordError
from clef_cli.inputs.media_cells import media_entries
from clef_cli.inputs.readers import read_records
from clef_cli.inputs.records import InvalidRecord, Record

from .support.helpers import settings_for

NOUL = {"q": {"type": "noul", "instructions": "Is it?"}}


def line(record_id: object, state: str, **more: object) -> str:
    return json.dumps({"id": record_id, "state": state, "questions": NOUL, **more})


def test_copies_of_a_failed_prompt_and_unreadable_ids_in_one_job(tmp_path, scorer):
    """Two records with one prompt whose image does not decode: one prompt runs, and each row's
    error names its own record (on 5c1bfd9 the copy's named the first). Rows whose id cannot be
    read (a broken line, an id `true`) have a null id beside real records with ids "2" and "4"
    (on 5c1bfd9 they showed "2" and "4" too). A later run reusing the stored error under another
    id names that id."""
    (tmp_path / "bad.png").write_bytes(b"not an image")
    lines = [
        line("a", "one prompt", images=["bad.png"]),
        line("b", "one prompt", images=["bad.png"]),
        "{broken",
        line("2", "a real record whose id is 2"),
        line(True, "an id that cannot be read"),
        line("4", "a real record whose id is 4"),
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    store = tmp_path / "store.ckpt"
    settings = settings_for(tmp_path, inputs=[tmp_path / "in.jsonl"], hidden_states="drop", checkpoint=store)
    summary = ScoreJob(settings, scorer=scorer).run()
    rows = pq.read_table(settings.output).to_pylist()
    assert summary.duplicates == 1
    for row, own in zip(rows[:2], "ab", strict=True):
        assert row["id"] == own and row["error"].startswith(f"record {own!r}, field 'images[0]'"), row["error"]
    assert [row["id"] for row in rows] == ["a", "b", None, "2", None, "4"]
    assert [row["record_index"] for row in rows] == list(range(6))
    assert rows[2]["error"].startswith("in.jsonl line 3: invalid JSON")
    assert rows[4]["error"].startswith("record at index 4, field 'id'") and "id is null" in rows[4]["error"]
    assert rows[3]["error"] is None and rows[5]["error"] is None
    (tmp_path / "again.jsonl").write_text(line("z", "one prompt", images=["bad.png"]) + "\n")
    again = settings_for(tmp_path, inputs=[tmp_path / "again.jsonl"], name="again.parquet", hidden_states="drop",
                         checkpoint=store)  # fmt: skip
    assert ScoreJob(again, scorer=scorer).run().reused == 1
    [row] = pq.read_table(again.output).to_pylist()
    assert row["id"] == "z" and row["error"].startswith("record 'z', field 'images[0]'"), row["error"]


def test_an_unreadable_id_never_repeats_a_real_one_in_any_format(tmp_path):
    (tmp_path / "r.jsonl").write_text("\n".join(["[1, 2]", line("0", "s"), line(1.5, "s"), line("2", "s")]) + "\n")
    table = pa.table({"id": pa.array([2.5, 0.0]), "state": ["s", "s"], "questions": [json.dumps(NOUL)] * 2})
    pq.write_table(table, tmp_path / "r.parquet")
    for name, ids in (("r.jsonl", [None, "0", None, "2"]), ("r.parquet", [None, "0"])):
        records = list(read_records([tmp_path / name]))
        assert [record.id for record in records] == ids, name
        assert all(isinstance(record, InvalidRecord) for record in records if record.id is None)
        assert all(isinstance(record, Record) for record in records if record.id is not None)


@pytest.mark.parametrize(
    "array",
    [[True, False] * 8, [True, 0.5, -0.5], ["0.5", "0.25"], [0.5, "0.25"], [1j, 0.5]],
    ids=["booleans", "a boolean among numbers", "text", "text among numbers", "complex"],
)
def test_decoded_audio_must_be_numbers(tmp_path: Path, array):
    with pytest.raises(RecordError, match="decoded audio must be an array of numbers") as refused:
        media_entries({"array": array, "sampling_rate": 16000}, "audio", "r")
    assert refused.value.field == "audio[0].array"
    assert isinstance(media_entries({"array": [0, 1, -1], "sampling_rate": 16000}, "audio", "r")[0], object)


def test_a_parquet_column_of_boolean_samples_is_the_records_error(tmp_path):
    kind = pa.struct([("array", pa.list_(pa.bool_())), ("sampling_rate", pa.int64())])
    schema = pa.schema([("id", pa.string()), ("state", pa.string()), ("audio", pa.list_(kind))])
    rows = [{"id": "bits", "state": "s", "audio": [{"array": [True, False] * 800, "sampling_rate": 16000}]}]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / "bits.parquet")
    [record] = read_records([tmp_path / "bits.parquet"], questions=NOUL)
    assert isinstance(record, InvalidRecord)
    assert record.error == "record 'bits', field 'audio[0].array': decoded audio must be an array of numbers"
