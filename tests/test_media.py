"""Media decoding errors and limits: each is a clear error for that record only."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import numpy as np
import pytest

from clef_cli.encoding.media import AUDIO_SAMPLE_RATE, MediaLimits, capped_frame_size, decode_audio, decode_video
from clef_cli.encoding.prompt import PromptEncoder
from clef_cli.errors import RecordError
from clef_cli.inputs.readers import read_records
from clef_cli.inputs.records import InvalidRecord

from .support.helpers import MEDIA, write_jsonl

NOUL = {"ok": {"type": "noul", "instructions": "Fine?"}}


def encode_error(processor, tmp_path: Path, limits: MediaLimits | None = None, **media) -> RecordError:
    path = write_jsonl(tmp_path / "r.jsonl", [{"id": "m1", "state": "s", "questions": NOUL, **media}])
    (record,) = read_records([path])
    encoder = PromptEncoder(processor, max_length=4096, limits=limits)
    with pytest.raises(RecordError) as caught:
        encoder.encode(record)
    assert caught.value.record_id == "m1"
    return caught.value


def copy_media(tmp_path: Path, name: str) -> str:
    shutil.copy(MEDIA / name, tmp_path / name)
    return name


def test_missing_file_names_the_field(processor, tmp_path):
    error = encode_error(processor, tmp_path, images=["nope.png"])
    assert error.field == "images[0]"
    assert "file not found" in error.message and "nope.png" in error.message


@pytest.mark.parametrize(
    ("field", "name", "expected"),
    [
        ("images", "broken.png", "not a decodable image"),
        ("audio", "broken.wav", "cannot open media"),
        ("videos", "broken.mp4", "cannot open media"),
    ],
)
def test_undecodable_media(processor, tmp_path, field, name, expected):
    (tmp_path / name).write_bytes(b"\x00garbage" * 64)
    error = encode_error(processor, tmp_path, **{field: [name]})
    assert error.field == f"{field}[0]"
    assert expected in error.message


def test_video_file_without_sound_given_as_audio(processor, tmp_path):
    error = encode_error(processor, tmp_path, audio=[copy_media(tmp_path, "clip_silent.mp4")])
    assert (error.field, error.message) == ("audio[0]", "no audio stream")


def test_truncated_video_is_an_error_not_a_crash(processor, tmp_path):
    data = (MEDIA / "clip_av.mp4").read_bytes()
    (tmp_path / "cut.mp4").write_bytes(data[: len(data) // 3])
    error = encode_error(processor, tmp_path, videos=["cut.mp4"])
    assert error.field == "videos[0]"


def test_not_a_regular_file(processor, tmp_path):
    (tmp_path / "folder.png").mkdir()
    error = encode_error(processor, tmp_path, images=["folder.png"])
    assert "not a regular file" in error.message


def test_http_media_refused_unless_allowed(processor, tmp_path):
    error = encode_error(processor, tmp_path, images=["https://example.com/a.png"])
    assert error.field == "images[0]"
    assert "--allow-remote-media" in error.message


def test_data_url_decodes_like_the_file(processor, tmp_path):
    url = "data:image/png;base64," + base64.b64encode((MEDIA / "image_a.png").read_bytes()).decode()
    path = write_jsonl(
        tmp_path / "r.jsonl",
        [
            {"id": "u", "state": "s", "questions": NOUL, "images": [url]},
            {"id": "f", "state": "s", "questions": NOUL, "images": [str(MEDIA / "image_a.png")]},
        ],
    )
    encoder = PromptEncoder(processor, max_length=4096)
    from_url, from_file = (encoder.encode(record) for record in read_records([path]))
    assert from_url.input_ids == from_file.input_ids
    assert from_url.media["pixel_values"].equal(from_file.media["pixel_values"])


def test_bad_base64_data_url(processor, tmp_path):
    error = encode_error(processor, tmp_path, images=["data:image/png;base64,@@@"])
    assert "not valid base64" in error.message


@pytest.mark.parametrize(
    ("limits", "media", "message"),
    [
        (
            MediaLimits(max_image_pixels=5000),
            {"images": ["image_a.png"]},
            "96x64 = 6144 pixels, over the limit of 5000",
        ),
        (MediaLimits(max_audio_seconds=1.0), {"audio": ["tone_16k_mono.wav"]}, "over the limit of 1 s"),
        (MediaLimits(max_video_seconds=2.0), {"videos": ["clip_av.mp4"]}, "over the limit of 2 s"),
        (MediaLimits(max_image_pixels=100_000), {"videos": ["clip_large_silent.mp4"]}, "640x480, over the limit"),
        (MediaLimits(max_file_bytes=10_000), {"audio": ["chord_44k1_stereo.wav"]}, "over the limit of 10000"),
    ],
)
def test_media_limits_are_per_record_errors(processor, tmp_path, limits, media, message):
    for names in media.values():
        for name in names:
            copy_media(tmp_path, name)
    error = encode_error(processor, tmp_path, limits=limits, **media)
    assert message in error.message


def test_decoded_samples_are_held_to_the_duration_limit_in_seconds():
    """A record's pre-decoded samples (16 kHz float32) against --max-audio-seconds: exactly the
    limit passes, one sample more is refused, counted in samples (not in their bytes, 4 each)."""
    from clef_cli.encoding.inline_media import inline_samples
    from clef_cli.encoding.media_limits import MediaError
    from clef_cli.inputs.media_cells import InlineSamples

    limits = MediaLimits(max_audio_seconds=1.0)
    for count in (1, AUDIO_SAMPLE_RATE // 2, AUDIO_SAMPLE_RATE):
        entry = InlineSamples(np.full(count, 0.25, dtype="<f4").tobytes())
        assert inline_samples(entry, limits).tolist() == [0.25] * count
    with pytest.raises(MediaError, match=r"audio is 1\.0 s long, over the limit of 1 s"):
        inline_samples(InlineSamples(np.zeros(AUDIO_SAMPLE_RATE + 1, dtype="<f4").tobytes()), limits)


def test_mixed_file_gives_encodings_for_good_records_and_errors_for_bad(processor, tmp_path):
    copy_media(tmp_path, "image_a.png")
    (tmp_path / "bad.png").write_bytes(b"not an image")
    path = write_jsonl(
        tmp_path / "r.jsonl",
        [
            {"id": "good-1", "state": "s", "questions": NOUL, "images": ["image_a.png"]},
            {"id": "bad-media", "state": "s", "questions": NOUL, "images": ["bad.png"]},
            {"id": "bad-schema", "state": "s", "questions": {"q": {"type": "choice"}}},
            {"id": "good-2", "state": {"k": 1}, "questions": NOUL},
        ],
    )
    encoder = PromptEncoder(processor, max_length=4096)
    outcomes = {}
    for record in read_records([path]):
        if isinstance(record, InvalidRecord):
            outcomes[record.id] = record.error
            continue
        try:
            outcomes[record.id] = encoder.encode(record)
        except RecordError as error:
            outcomes[record.id] = str(error)
    assert outcomes["good-1"].length > 100 and outcomes["good-2"].length > 50
    assert outcomes["bad-media"].startswith("record 'bad-media', field 'images[0]': not a decodable image")
    assert outcomes["bad-schema"].startswith("record 'bad-schema', field 'questions.q.criteria'")


def test_stereo_is_mixed_by_the_resampler_not_averaged():
    """Against an independent mix: soundfile's samples, (L+R)/sqrt(2), scipy's polyphase resampler.
    The two resamplers' filters differ slightly (about 2e-4 inside the clip, more at its edges);
    the mean of the channels would be off by a factor sqrt(2) (about 0.1 here)."""
    import scipy.signal
    import soundfile

    samples = decode_audio(str(MEDIA / "chord_44k1_stereo.wav"), MediaLimits())
    assert samples.dtype == np.float32 and samples.ndim == 1
    stereo, rate = soundfile.read(str(MEDIA / "chord_44k1_stereo.wav"), dtype="float64")
    assert stereo.shape[1] == 2 and rate == 44100
    mixed = (stereo[:, 0] + stereo[:, 1]) / np.sqrt(2)
    oracle = scipy.signal.resample_poly(mixed, AUDIO_SAMPLE_RATE // 100, rate // 100)
    assert samples.shape == oracle.shape == (20800,)
    inside = slice(50, -50)
    assert np.abs(samples[inside] - oracle[inside]).max() < 1e-3
    scale = float(samples @ oracle / (oracle @ oracle))
    assert abs(scale - 1) < 5e-3
    averaged = scipy.signal.resample_poly(stereo.mean(axis=1), AUDIO_SAMPLE_RATE // 100, rate // 100)
    assert np.abs(samples[inside] - averaged[inside]).max() > 0.05  # the check can tell the two apart


def test_video_frames_are_taken_at_2_fps_capped_and_even():
    odd = decode_video(str(MEDIA / "clip_av_odd.webm"), MediaLimits())
    assert odd.frames.shape[0] % 2 == 0
    assert odd.soundtrack is not None
    silent = decode_video(str(MEDIA / "clip_silent.mp4"), MediaLimits())
    assert silent.soundtrack is None and silent.frames.shape[0] == 6
    large = decode_video(str(MEDIA / "clip_large_silent.mp4"), MediaLimits())
    assert large.frames.shape[1:] == (444, 592, 3)
    assert capped_frame_size(640, 480) == (592, 444)
    assert capped_frame_size(100, 100) == (100, 100)
