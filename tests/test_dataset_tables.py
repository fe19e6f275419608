"""Tables as `datasets` writes them (issue 47): media bytes inside the table score exactly as the
same bytes in files, and key the same, so a store made from files is reused by the dataset.

The tables are written with the real `datasets` library's Arrow schema (`Features.arrow_schema`,
its `huggingface` metadata included), and every test checks that `datasets` reads the file back
with its Image/Audio/Video features; its own audio encoder needs torchcodec, so cells are given
in the struct `datasets` stores (`{bytes, path}`), which is what the Parquet holds either way.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clef_cli.encoding.media import decode_audio
from clef_cli.encoding.media_limits import MediaLimits
from clef_cli.engines.local.pipeline import ScoreJob
from clef_cli.inputs.columns import ColumnMapping

from .support.helpers import MEDIA, assert_same_rows, require, settings_for, write_jsonl

datasets = require("datasets")

QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Is this urgent?"},
    "team": {"type": "choice", "criteria": {"billing": "Payments", "tech": None}},
}
MAPPING = ColumnMapping((("images", "photo"), ("audio", "clip"), ("videos", "film")))


def media_bytes(name: str) -> bytes:
    return (MEDIA / name).read_bytes()


def write_dataset(path: Path, features: dict, rows: list[dict], cache: Path) -> Path:
    """`rows` written under `datasets`' own Arrow schema for `features`; read back by `datasets`
    to check it sees the media features (not plain structs)."""
    spec = datasets.Features({"id": datasets.Value("string"), "state": datasets.Value("string"), **features})
    pq.write_table(pa.Table.from_pylist(rows, schema=spec.arrow_schema), path)
    read = datasets.Dataset.from_parquet(str(path), cache_dir=str(cache))
    for name, feature in features.items():
        assert type(read.features[name]) is type(feature), name
        if isinstance(feature, datasets.List):
            assert type(read.features[name].feature) is type(feature.feature), name
    return path


def media_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "files"
    folder.mkdir()
    for name in ("image_a.png", "image_b.png", "tone_16k_mono.wav", "clip_av.mp4"):
        shutil.copy(MEDIA / name, folder / name)
    return folder


def run(tmp_path: Path, inputs: list, name: str, **overrides):
    settings = settings_for(tmp_path, inputs, name=name, questions=tmp_path / "questions.json", **overrides)
    (tmp_path / "questions.json").write_text(json.dumps(QUESTIONS))
    summary = ScoreJob(settings).run()
    return summary, pq.read_table(tmp_path / name)


@pytest.fixture
def twins(tmp_path):
    """Two records with an image, a clip and a video each: as files (JSONL) and as a dataset."""
    folder = media_folder(tmp_path)
    files = write_jsonl(
        folder / "records.jsonl",
        [
            {"id": "a", "state": "refund please", "images": ["image_a.png"], "audio": ["tone_16k_mono.wav"],
             "videos": ["clip_av.mp4"]},
            {"id": "b", "state": "app is down", "images": ["image_b.png"], "audio": ["tone_16k_mono.wav"],
             "videos": ["clip_av.mp4"]},
        ],
    )  # fmt: skip
    rows = [
        {"id": record_id, "state": state, "photo": {"bytes": media_bytes(image), "path": image},
         "clip": {"bytes": media_bytes("tone_16k_mono.wav"), "path": None},
         "film": {"bytes": media_bytes("clip_av.mp4"), "path": "ignored.mp4"}}
        for record_id, state, image in (("a", "refund please", "image_a.png"), ("b", "app is down", "image_b.png"))
    ]  # fmt: skip
    features = {"photo": datasets.Image(), "clip": datasets.Audio(), "film": datasets.Video()}
    table = write_dataset(tmp_path / "dataset.parquet", features, rows, tmp_path / "hf-cache")
    return files, table


def test_dataset_scores_and_keys_as_its_files(tmp_path, twins):
    """Image, Audio and Video bytes in the table give the files' probabilities (<= 1e-6) and
    keys: night 2 over the same dataset runs nothing, and the dataset reuses the store its files
    made. The mapping is in the output's metadata."""
    files, table = twins
    from_files_store, dataset_store = tmp_path / "files.ckpt", tmp_path / "dataset.ckpt"
    night1, from_files = run(tmp_path, [files], "files.parquet", checkpoint=from_files_store, hidden_states="drop")
    assert night1.run == 2 and night1.failed == 0
    fresh, from_dataset = run(tmp_path, [table], "scored-dataset.parquet", checkpoint=dataset_store,
                              hidden_states="drop", columns=MAPPING)  # fmt: skip
    assert (fresh.run, fresh.failed) == (2, 0)
    assert_same_rows(from_dataset.to_pylist(), from_files.to_pylist())
    again, _ = run(tmp_path, [table], "again.parquet", checkpoint=dataset_store, hidden_states="drop", columns=MAPPING)
    assert (again.run, again.reused) == (0, 2)
    reused, from_store = run(tmp_path, [table], "reused.parquet", checkpoint=from_files_store, hidden_states="drop",
                             columns=MAPPING)  # fmt: skip
    assert (reused.run, reused.reused, reused.failed) == (0, 2, 0)
    assert_same_rows(from_store.to_pylist(), from_files.to_pylist(), probability_tolerance=0)
    mapping = json.loads(pq.read_schema(tmp_path / "scored-dataset.parquet").metadata[b"clef.columns"])
    assert mapping == {"fields": {"images": "photo", "audio": "clip", "videos": "film"}, "state_columns": []}


def test_image_lists_binary_cells_and_nulls(tmp_path):
    """A List(Image()) column and a plain binary column score as paths; a null inside a list is
    that record's error naming the entry, and the other records are scored."""
    folder = media_folder(tmp_path)
    files = write_jsonl(
        folder / "records.jsonl",
        [{"id": "two", "state": "s", "images": ["image_a.png", "image_b.png"]},
         {"id": "one", "state": "t", "images": ["image_b.png"]}],
    )  # fmt: skip
    a, b = media_bytes("image_a.png"), media_bytes("image_b.png")
    rows = [
        {"id": "two", "state": "s", "pics": [{"bytes": a, "path": None}, {"bytes": b, "path": None}]},
        {"id": "one", "state": "t", "pics": [{"bytes": b, "path": "b.png"}]},
        {"id": "gap", "state": "u", "pics": [{"bytes": a, "path": None}, None]},
    ]
    listed = write_dataset(tmp_path / "listed.parquet", {"pics": datasets.List(datasets.Image())}, rows,
                           tmp_path / "hf-cache")  # fmt: skip
    binary = tmp_path / "binary.parquet"  # a list of plain binary values
    images = pa.array([[a, b], [b]], pa.list_(pa.binary()))
    pq.write_table(pa.table({"id": ["two", "one"], "state": ["s", "t"], "images": images}), binary)
    _, want = run(tmp_path, [files], "files.parquet", hidden_states="drop")
    summary, got = run(tmp_path, [listed], "scored-listed.parquet", hidden_states="drop",
                       columns=ColumnMapping((("images", "pics"),)))  # fmt: skip
    assert summary.failed == 1
    rows_out = got.to_pylist()
    assert_same_rows(rows_out[:2], want.to_pylist())
    assert "'images[1]'" in rows_out[2]["error"] and "null media entry" in rows_out[2]["error"]
    _, from_binary = run(tmp_path, [binary], "scored-binary.parquet", hidden_states="drop")
    assert_same_rows(from_binary.to_pylist(), want.to_pylist())


def samples_table(tmp_path: Path, rows: list[dict]) -> Path:
    """Pre-decoded audio as a `{array, sampling_rate}` struct column."""
    path = tmp_path / "samples.parquet"
    kind = pa.struct([("array", pa.list_(pa.float64())), ("sampling_rate", pa.int64())])
    schema = pa.schema([("id", pa.string()), ("state", pa.string()), ("audio", pa.list_(kind))])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def test_decoded_audio_at_16k_scores_as_its_file_and_8k_is_the_records_error(tmp_path):
    folder = media_folder(tmp_path)
    files = write_jsonl(folder / "records.jsonl", [{"id": "a", "state": "s", "audio": ["tone_16k_mono.wav"]}])
    samples = decode_audio(str(MEDIA / "tone_16k_mono.wav"), MediaLimits()).astype(float).tolist()
    table = samples_table(tmp_path, [
        {"id": "a", "state": "s", "audio": [{"array": samples, "sampling_rate": 16000}]},
        {"id": "slow", "state": "s", "audio": [{"array": samples[::2], "sampling_rate": 8000}]},
    ])  # fmt: skip
    _, want = run(tmp_path, [files], "files.parquet", hidden_states="drop")
    summary, got = run(tmp_path, [table], "scored-samples.parquet", hidden_states="drop")
    rows = got.to_pylist()
    assert summary.failed == 1
    assert_same_rows(rows[:1], want.to_pylist())
    assert "'audio[0].sampling_rate'" in rows[1]["error"] and "8000 Hz" in rows[1]["error"]


def test_hostile_and_oversize_inline_media_are_that_records_error(tmp_path):
    """Bytes that are not an image, and bytes over --max-file-bytes (against the cell's length),
    fail their own records; the good record is scored."""
    a = media_bytes("image_a.png")
    path = tmp_path / "hostile.parquet"
    cells = [a, b"\x89PNG\r\n\x1a\nnot really", a + b"\0" * 4096]
    pq.write_table(pa.table({"id": ["ok", "junk", "big"], "state": ["s"] * 3, "images": pa.array(cells)}), path)
    limits = MediaLimits(max_file_bytes=len(a) + 100)
    summary, got = run(tmp_path, [path], "scored-hostile.parquet", hidden_states="drop", limits=limits)
    errors = got.column("error").to_pylist()
    assert summary.failed == 2 and errors[0] is None
    assert "'images[0]'" in errors[1] and "image" in errors[1]
    assert "over the limit of" in errors[2] and str(len(a) + 4096) in errors[2]


@pytest.mark.parametrize("rate", [8000, 15999, 16001, 22050, 44100, 48000, 16000.5, True, "16000", None])
def test_decoded_audio_at_any_rate_but_16k_is_refused_never_taken_as_16k(rate):
    """clef never resamples: samples at another rate, higher or lower, would be heard at the wrong
    speed and pitch, so each is its record's error naming the rate's field."""
    from clef_cli.errors import RecordError
    from clef_cli.inputs.media_cells import media_entries

    with pytest.raises(RecordError) as refused:
        media_entries({"array": [0.0, 0.5, -0.5], "sampling_rate": rate}, "audio", "r")
    assert (refused.value.record_id, refused.value.field) == ("r", "audio[0].sampling_rate")
    for same in (16000, 16000.0):
        (entry,) = media_entries({"array": [0.0, 0.5, -0.5], "sampling_rate": same}, "audio", "r")
        assert len(entry.data) == 3 * 4  # three float32 samples
