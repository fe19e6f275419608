"""A record's logits never depend on what else shares its forward.

Seeded random batches are drawn from every golden record plus generated media variants (audio
of several lengths and sample rates in WAV and MP3, images of several sizes, silent and sounding
videos with odd frame counts, several clips per record, schemas of different widths). Each
record's logits inside a batch must equal its logits scored alone within 1e-5 (fp32).
"""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from .support.helpers import GOLDEN_RECORDS, write_jsonl

TOLERANCE = 1e-5
COMPOSITIONS = 36
QUICK_COMPOSITIONS = 2  # the other compositions in CI's whole run (issue 36.12)
"""The first compositions run in the quick loop; the rest are marked slow (CI runs them all)."""


def tone(seconds: float, rate: int, channels: int = 1, pitch: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    wave = 0.3 * np.sin(2 * np.pi * pitch * t) + 0.05 * np.sin(2 * np.pi * 3.1 * pitch * t)
    return np.stack([wave * (0.6 + 0.4 * c) for c in range(channels)], axis=-1).astype(np.float32)


def write_video(path: Path, seconds: float, fps: int, size: tuple[int, int], sound: bool) -> None:
    width, height = size
    with av.open(str(path), mode="w", format="mp4") as container:
        video = container.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        audio = container.add_stream("aac", rate=22050, layout="mono") if sound else None
        for index in range(int(seconds * fps)):
            pixels = np.zeros((height, width, 3), dtype=np.uint8)
            pixels[:, : (index * 7) % width] = (200, 40 + index * 9 % 200, 90)
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24").reformat(format="yuv420p")
            frame.pts, frame.time_base = index, Fraction(1, fps)
            container.mux(video.encode(frame))
        container.mux(video.encode(None))
        if audio is not None:
            samples = tone(seconds, 22050, pitch=330.0)[:, 0]
            for offset in range(0, len(samples), 1024):
                chunk = np.ascontiguousarray(samples[None, offset : offset + 1024])
                frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="mono")
                frame.sample_rate, frame.pts, frame.time_base = 22050, offset, Fraction(1, 22050)
                container.mux(audio.encode(frame))
            container.mux(audio.encode(None))


def make_media(folder: Path) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    for name, seconds, rate, channels in [
        ("short_8k.wav", 0.9, 8000, 1),
        ("tiny_16k.wav", 0.45, 16000, 1),
        ("mid_22k.wav", 1.7, 22050, 1),
        ("stereo_44k.wav", 0.7, 44100, 2),
        ("long_16k.wav", 2.6, 16000, 1),
    ]:
        sf.write(folder / name, tone(seconds, rate, channels, pitch=200 + 60 * len(files)), rate)
        files[name] = str(folder / name)
    sf.write(folder / "speech.mp3", tone(1.2, 16000, pitch=520.0), 16000, format="MP3")
    files["speech.mp3"] = str(folder / "speech.mp3")
    for name, size in [("small.png", (32, 32)), ("wide.png", (100, 40)), ("big.png", (200, 150))]:
        pixels = np.random.default_rng(len(name)).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / name)
        files[name] = str(folder / name)
    write_video(folder / "sound_odd.mp4", 1.5, 10, (64, 48), sound=True)
    write_video(folder / "silent.mp4", 2.0, 10, (48, 48), sound=False)
    write_video(folder / "sound_even.mp4", 2.0, 8, (80, 64), sound=True)
    files.update({name: str(folder / name) for name in ("sound_odd.mp4", "silent.mp4", "sound_even.mp4")})
    return files


SCHEMAS = [
    {"r": {"type": "score", "criteria": ["low", "mid", "high"]}},
    {"ok": {"type": "noul"}, "team": {"type": "choice", "criteria": {"b": "bee", "a": None, "c": "sea"}}},
    {"one": {"type": "choice", "criteria": {"x": "only x", "y": "only y"}}},
    {
        "a": {"type": "noul", "instructions": "Is it loud?"},
        "b": {"type": "score", "criteria": ["0", "1", "2", "3", "4"]},
        "c": {"type": "choice", "criteria": {"k": None, "m": "em"}},
    },
]


def variant_records(files: dict[str, str]) -> list[dict]:
    media_sets = [
        {"audio": ["short_8k.wav"]},
        {"audio": ["tiny_16k.wav"]},
        {"audio": ["mid_22k.wav"]},
        {"audio": ["stereo_44k.wav"]},
        {"audio": ["long_16k.wav"]},
        {"audio": ["speech.mp3"]},
        {"audio": ["short_8k.wav", "tiny_16k.wav"]},
        {"audio": ["tiny_16k.wav", "mid_22k.wav", "short_8k.wav"]},
        {"audio": ["speech.mp3", "long_16k.wav"]},
        {"images": ["small.png"]},
        {"images": ["wide.png", "big.png"]},
        {"images": ["small.png"], "audio": ["short_8k.wav"]},
        {"videos": ["sound_odd.mp4"]},
        {"videos": ["sound_even.mp4", "sound_odd.mp4"]},
        {"videos": ["silent.mp4"]},
        {"videos": ["silent.mp4", "sound_odd.mp4"]},
        {"videos": ["sound_odd.mp4"], "audio": ["tiny_16k.wav"]},
        {"videos": ["sound_even.mp4"], "audio": ["stereo_44k.wav"], "images": ["wide.png"]},
        {"images": ["big.png"], "videos": ["silent.mp4"], "audio": ["mid_22k.wav"]},
        {},
    ]
    records = []
    for number, media in enumerate(media_sets):
        record = {
            "id": f"v{number:02d}",
            "state": "variant " * (1 + 5 * (number % 4)) + str(number),
            "questions": SCHEMAS[number % len(SCHEMAS)],
        }
        for kind, names in media.items():
            record[kind] = [files[name] for name in names]
        records.append(record)
    return records


@pytest.fixture(scope="module")
def pool(tmp_path_factory, processor):
    from clef_cli.encoding.prompt import PromptEncoder
    from clef_cli.inputs.readers import read_records

    encoder = PromptEncoder(processor, max_length=4096)
    folder = tmp_path_factory.mktemp("invariance")
    path = write_jsonl(folder / "variants.jsonl", variant_records(make_media(folder / "media")))
    golden = [record for record in read_records([GOLDEN_RECORDS])]
    variants = list(read_records([path]))
    assert all(not hasattr(record, "error") for record in golden + variants)
    return [encoder.encode(record) for record in golden + variants]


class Alone(dict):
    """Each record's logits scored alone, computed the first time a batch needs them."""

    def __init__(self, scorer) -> None:
        super().__init__()
        self.scorer = scorer

    def of(self, encoded) -> list[list[float]]:
        if encoded.record.id not in self:
            self[encoded.record.id] = _logits(self.scorer.score_batch([encoded])[0])
        return self[encoded.record.id]


@pytest.fixture(scope="module")
def alone(scorer):
    return Alone(scorer)


def _logits(result) -> list[list[float]]:
    return [list(question.logits) for question in result.questions]


def _largest_difference(got: list[list[float]], want: list[list[float]]) -> float:
    assert [len(q) for q in got] == [len(q) for q in want]
    return max(abs(a - b) for g, w in zip(got, want, strict=True) for a, b in zip(g, w, strict=True))


def test_pool_covers_every_media_path(pool):
    media = [encoded.media for encoded in pool]
    assert sum("input_features" in m and m["feature_attention_mask"].shape[0] > 1 for m in media) >= 4
    assert sum("pixel_values" in m and m["image_grid_thw"].shape[0] > 1 for m in media) >= 2
    assert sum("video_second_per_grid" in m for m in media) >= 6
    assert {encoded.use_audio_in_video for encoded in pool} == {True, False}
    lengths = {int(m["feature_attention_mask"].sum(-1).min()) for m in media if "input_features" in m}
    assert min(lengths) < 100 < max(lengths)  # clips shorter and longer than one encoder chunk


@pytest.mark.parametrize(
    "seed",
    [seed if seed < QUICK_COMPOSITIONS else pytest.param(seed, marks=pytest.mark.slow) for seed in range(COMPOSITIONS)],
)
def test_logits_in_a_random_batch_equal_logits_alone(scorer, pool, alone, seed):
    chooser = random.Random(seed)
    picked = chooser.sample(pool, chooser.randint(2, 7))
    for flag in (False, True):
        group = [encoded for encoded in picked if encoded.use_audio_in_video is flag]
        if not group:
            continue
        by_id = {encoded.record.id: encoded for encoded in group}
        for result in scorer.score_batch(group):
            difference = _largest_difference(_logits(result), alone.of(by_id[result.record_id]))
            assert difference <= TOLERANCE, (result.record_id, [e.record.id for e in group], difference)
