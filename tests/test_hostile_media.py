"""Media that would give NaN scores, data: URLs that say they hold something else, and paths no
file system can open: each is that record's error naming the entry (processor only, no weights)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from clef_cli.encoding.prompt import PromptEncoder
from clef_cli.errors import UNEXPECTED, RecordError
from clef_cli.inputs.records import Record, RecordBuilder

from .support.hostile import NOUL
from .support.media_makers import SECOND, data_url, png_bytes, video_with_soundtrack, wav_bytes


def record(tmp_path: Path, **media: list[str]) -> Record:
    built = RecordBuilder().build({"id": "m", "state": "s", "questions": NOUL, **media}, 0, tmp_path)
    assert isinstance(built, Record), built
    return built


def encode_error(processor, built: Record) -> RecordError:
    with pytest.raises(RecordError) as caught:
        PromptEncoder(processor, max_length=4096).encode(built)
    assert caught.value.record_id == "m"
    return caught.value


@pytest.mark.parametrize(
    "samples",
    [
        np.full(16000, np.nan),
        np.where(np.arange(16000) == 8000, np.inf, np.sin(SECOND * 2000)),
        np.where(np.arange(16000) == 3, -np.inf, 0.0),
    ],
    ids=["all-nan", "one-inf", "one-minus-inf"],
)
def test_audio_with_non_finite_samples_is_refused(processor, tmp_path, samples):
    error = encode_error(processor, record(tmp_path, audio=[data_url("audio/wav", wav_bytes(samples))]))
    assert error.field == "audio[0]"
    assert error.message.startswith("audio holds non-finite samples (NaN or infinity)")


def test_a_video_soundtrack_with_nan_is_refused(processor, tmp_path):
    path = video_with_soundtrack(tmp_path / "clip.mkv", np.full(16000, np.nan))
    error = encode_error(processor, record(tmp_path, videos=[path.name]))
    assert error.field == "videos[0]"
    assert error.message.startswith("audio holds non-finite samples")


def test_finite_audio_that_overflows_the_features_is_refused(processor, tmp_path):
    """Samples of 1e30 are finite, but their spectrogram is not: the processor's own tensors are
    checked before a record may reach the model."""
    loud = data_url("audio/wav", wav_bytes(1e30 * np.sin(SECOND * 3000)))
    error = encode_error(processor, record(tmp_path, audio=[loud]))
    assert error.field == "media"
    assert error.message == "the processor's input_features hold non-finite values (NaN or infinity)"


def test_the_same_media_at_a_sane_level_encode(processor, tmp_path):
    quiet = data_url("audio/wav", wav_bytes(0.1 * np.sin(SECOND * 3000)))
    path = video_with_soundtrack(tmp_path / "clip.mkv", 0.1 * np.sin(SECOND * 2000))
    encoded = PromptEncoder(processor, max_length=4096).encode(record(tmp_path, audio=[quiet], videos=[path.name]))
    assert encoded.use_audio_in_video
    assert all(bool(t.isfinite().all()) for t in encoded.media.values() if t.is_floating_point())


@pytest.mark.parametrize(
    ("field", "mime"),
    [
        ("images", "text/plain"),
        ("images", "audio/wav"),
        ("audio", "image/png"),
        ("audio", "application/json"),
        ("videos", "image/png"),
        ("videos", "audio/wav"),
    ],
)
def test_a_data_url_of_another_kind_is_refused(processor, tmp_path, field, mime):
    error = encode_error(processor, record(tmp_path, **{field: [data_url(mime, png_bytes())]}))
    assert error.field == f"{field}[0]"
    assert error.message.startswith(f"a data: URL of type {mime!r} in {field} (expected ")


@pytest.mark.parametrize("mime", ["image/png", "IMAGE/JPEG", "application/octet-stream", ""])
def test_data_urls_of_the_fields_kind_or_no_kind_are_read(processor, tmp_path, mime):
    encoded = PromptEncoder(processor, max_length=4096).encode(record(tmp_path, images=[data_url(mime, png_bytes())]))
    assert "pixel_values" in encoded.media


def test_paths_no_file_system_can_open_are_refused(processor, tmp_path):
    error = encode_error(processor, record(tmp_path, images=["a\x00b.png"]))
    assert error.field == "images[0]"
    assert error.message.startswith("a control character in a location is refused: a\\x00b.png")


def test_fifos_symlink_loops_and_devices_are_refused_without_blocking(processor, tmp_path):
    os.mkfifo(tmp_path / "pipe.wav")
    os.symlink(tmp_path / "loop_b.png", tmp_path / "loop_a.png")
    os.symlink(tmp_path / "loop_a.png", tmp_path / "loop_b.png")
    os.symlink(tmp_path / "pipe.wav", tmp_path / "to_pipe.mp4")
    cases = [("audio", "pipe.wav", "not a regular file"), ("videos", "to_pipe.mp4", "not a regular file")]
    cases += [("images", "/dev/zero", "not a regular file"), ("images", "loop_a.png", "cannot read")]
    for field, entry, expected in cases:
        error = encode_error(processor, record(tmp_path, **{field: [entry]}))
        assert (error.field, error.message[: len(expected)]) == (f"{field}[0]", expected)
    assert error.message.endswith(f"loop_a.png: {os.strerror(errno.ELOOP)}")  # the system's words, not written here


def test_a_last_guard_names_the_encoding_step_that_failed(processor, tmp_path):
    """A library caller may build a `Record` without the builder's checks; a value the encoder
    cannot render is still that record's error, naming the field, not a crash of the job."""
    built = record(tmp_path)
    unchecked = Record(id="m", index=0, state=b"raw bytes", questions=built.questions)
    error = encode_error(processor, unchecked)
    assert error.field == "state"
    assert error.message.startswith(f"{UNEXPECTED} (TypeError: ")  # the type is clef's; the wording is Python's
