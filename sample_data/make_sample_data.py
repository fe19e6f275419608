"""Regenerate the sample data set: every file under media/ and records.parquet.

The sample media are synthetic (drawn with Pillow, synthesised with numpy, encoded with
soundfile and PyAV) so that they carry no third-party content and can be rebuilt at any time
instead of being trusted as opaque binaries. Random seeds are fixed and encoders run single
threaded, so a run reproduces the same files for a given set of library versions.

records.jsonl is written by hand; this script only converts it to records.parquet (same rows,
same order) and checks that every media path it names exists and decodes.

Run from the repository root:  python sample_data/make_sample_data.py
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import soundfile as sf
from PIL import Image, ImageDraw, ImageFilter, ImageFont

HERE = Path(__file__).resolve().parent
MEDIA = HERE / "media"
RECORDS_JSONL = HERE / "records.jsonl"
RECORDS_PARQUET = HERE / "records.parquet"
MEDIA_FIELDS = ("images", "audio", "videos")


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """Pillow's bundled default font, so no system font is needed."""
    return ImageFont.load_default(size=size)


# --------------------------------------------------------------------------- images


def make_parcel(path: Path) -> None:
    """A 'photo' of a dented, cracked cardboard box on a floor (JPEG, 240x180)."""
    width, height = 240, 180
    image = Image.new("RGB", (width, height))
    draw = ImageDraw.Draw(image)
    for y in range(height):  # wall above, floor below
        shade = 200 - y // 3 if y < 70 else 150 - (y - 70) // 4
        draw.line([(0, y), (width, y)], fill=(shade, shade - 6, shade - 14))

    front = [(50, 80), (160, 80), (160, 160), (50, 160)]
    top = [(50, 80), (90, 50), (200, 50), (160, 80)]
    side = [(160, 80), (200, 50), (200, 130), (160, 160)]
    draw.polygon([(54, 162), (164, 162), (212, 134), (206, 128)], fill=(70, 62, 55))  # shadow
    draw.polygon(front, fill=(176, 128, 78), outline=(110, 76, 40))
    draw.polygon(top, fill=(196, 150, 96), outline=(110, 76, 40))
    draw.polygon(side, fill=(146, 102, 58), outline=(110, 76, 40))
    draw.polygon([(100, 80), (140, 50), (150, 50), (110, 80)], fill=(214, 190, 150))  # tape
    draw.rectangle([60, 92, 102, 118], fill=(244, 244, 238), outline=(120, 120, 120))  # label
    for x in range(64, 98, 3):
        draw.line([(x, 106), (x, 115)], fill=(30, 30, 30), width=1 + (x % 2))
    draw.line([(64, 97), (96, 97)], fill=(60, 60, 60))
    draw.line([(64, 101), (88, 101)], fill=(60, 60, 60))

    draw.ellipse([112, 108, 154, 146], fill=(132, 90, 50))  # the dent, with a shaded rim
    draw.arc([112, 108, 154, 146], 200, 340, fill=(92, 60, 30), width=3)
    draw.arc([114, 110, 152, 144], 20, 160, fill=(200, 156, 104), width=2)
    cracks = [
        [(132, 126), (122, 116), (116, 104), (108, 96)],
        [(132, 126), (146, 112), (152, 96), (158, 90)],
        [(132, 126), (138, 140), (134, 152), (140, 160)],
        [(132, 126), (118, 134), (104, 140)],
        [(180, 62), (186, 74), (184, 88), (190, 100)],
    ]
    for crack in cracks:
        draw.line(crack, fill=(58, 36, 18), width=2)

    pixels = np.asarray(image.filter(ImageFilter.GaussianBlur(0.6)), dtype=np.int16)
    pixels = pixels + rng(11).normal(0.0, 5.0, size=pixels.shape).astype(np.int16)  # sensor noise
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, "JPEG", quality=82, optimize=True)


def make_receipt(path: Path) -> None:
    """A shop receipt with a double charge on it (PNG, 160x240)."""
    width, height = 160, 240
    image = Image.new("RGB", (width, height), (92, 96, 104))
    draw = ImageDraw.Draw(image)
    bottom = 228
    edge = [(12 + 8 * i, bottom + (4 if i % 2 else 0)) for i in range(18)]
    draw.polygon([(12, 8), (148, 8), (148, bottom), *reversed(edge), (12, bottom)], fill=(250, 248, 240))

    small, bold = font(9), font(11)
    draw.text((80, 16), "QUICKMART #0412", fill=(20, 20, 20), font=bold, anchor="mt")
    draw.text((80, 31), "14 Rue des Lilas, Lyon", fill=(70, 70, 70), font=small, anchor="mt")
    draw.text((80, 43), "2024-03-08  18:42", fill=(70, 70, 70), font=small, anchor="mt")
    draw.line([(20, 56), (140, 56)], fill=(150, 150, 150))
    items = [
        ("Headphones BT-200", "59.90"),
        ("USB-C cable 2m", "9.99"),
        ("Gift wrap", "2.50"),
    ]
    y = 62
    for name, price in items:
        draw.text((20, y), name, fill=(30, 30, 30), font=small)
        draw.text((140, y), price, fill=(30, 30, 30), font=small, anchor="ra")
        y += 13
    draw.line([(20, y + 2), (140, y + 2)], fill=(150, 150, 150))
    draw.text((20, y + 8), "TOTAL EUR", fill=(0, 0, 0), font=bold)
    draw.text((140, y + 8), "72.39", fill=(0, 0, 0), font=bold, anchor="ra")
    y += 30
    for line in ("CARD  **** 4821", "AUTH 083311   APPROVED", "AUTH 083312   APPROVED"):
        draw.text((20, y), line, fill=(40, 40, 40), font=small)
        y += 12
    draw.ellipse([14, y - 15, 146, y + 1], outline=(200, 30, 30), width=2)  # someone circled it
    for x in range(30, 130, 4):  # barcode
        draw.line([(x, 192), (x, 212)], fill=(20, 20, 20), width=1 + (x * 7 % 3 == 0))
    draw.text((80, 216), "THANK YOU!", fill=(40, 40, 40), font=small, anchor="mt")
    image.save(path, "PNG", optimize=True)


def make_error_dialog(path: Path) -> None:
    """A screenshot of a checkout error dialog with a red X (PNG, 320x200)."""
    width, height = 320, 200
    image = Image.new("RGB", (width, height), (36, 92, 150))
    draw = ImageDraw.Draw(image)
    for y in range(height):  # desktop gradient
        draw.line([(0, y), (width, y)], fill=(36 + y // 8, 92 + y // 10, 150 + y // 6))
    draw.rectangle([0, 184, width, height], fill=(30, 30, 36))  # taskbar
    draw.rectangle([4, 188, 40, 197], fill=(70, 120, 200))

    box = (40, 30, 280, 160)
    draw.rectangle([box[0] + 4, box[1] + 4, box[2] + 4, box[3] + 4], fill=(20, 40, 70))  # shadow
    draw.rectangle(box, fill=(240, 240, 240), outline=(120, 120, 120))
    draw.rectangle([box[0], box[1], box[2], box[1] + 18], fill=(60, 60, 70))
    draw.text((box[0] + 6, box[1] + 4), "ShopApp - Checkout", fill=(255, 255, 255), font=font(10))
    draw.rectangle([box[2] - 16, box[1] + 3, box[2] - 4, box[1] + 15], fill=(200, 60, 60))
    draw.line([(box[2] - 13, box[1] + 6), (box[2] - 7, box[1] + 12)], fill=(255, 255, 255), width=2)
    draw.line([(box[2] - 13, box[1] + 12), (box[2] - 7, box[1] + 6)], fill=(255, 255, 255), width=2)

    cx, cy, r = 78, 82, 20
    draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=(210, 30, 36), outline=(150, 10, 14), width=2)
    draw.line([(cx - 9, cy - 9), (cx + 9, cy + 9)], fill=(255, 255, 255), width=5)
    draw.line([(cx - 9, cy + 9), (cx + 9, cy - 9)], fill=(255, 255, 255), width=5)
    draw.text((110, 64), "Payment failed", fill=(20, 20, 20), font=font(14))
    draw.text((110, 86), "Error 502: Bad Gateway", fill=(60, 60, 60), font=font(10))
    draw.text((110, 100), "Please try again later.", fill=(60, 60, 60), font=font(10))
    draw.rectangle([206, 128, 266, 150], fill=(225, 225, 225), outline=(40, 110, 200), width=2)
    draw.text((236, 139), "OK", fill=(20, 20, 20), font=font(11), anchor="mm")
    image.save(path, "PNG", optimize=True)


# --------------------------------------------------------------------------- audio


def make_voicemail(path: Path) -> None:
    """A synthetic 'voicemail': a beep, then voiced syllables with pauses and line noise (16 kHz mono, 2 s)."""
    rate, seconds = 16000, 2.0
    t = np.arange(int(rate * seconds)) / rate
    signal = np.zeros_like(t)
    beep = t < 0.15
    signal[beep] = 0.35 * np.sin(2 * np.pi * 1000 * t[beep])

    generator = rng(22)
    start = 0.30
    for word in range(5):
        for _ in range(int(generator.integers(1, 4))):  # 1-3 syllables a word
            length = float(generator.uniform(0.08, 0.16))
            pitch = float(generator.uniform(130, 190))
            span = (t >= start) & (t < start + length)
            local = t[span] - start
            envelope = np.sin(np.pi * local / length) ** 2
            f0 = pitch * (1 + 0.06 * np.sin(2 * np.pi * 5 * local))  # intonation wobble
            phase = 2 * np.pi * np.cumsum(f0) / rate
            voiced = sum(np.sin(k * phase) / k for k in range(1, 6))  # a few harmonics
            signal[span] += 0.25 * envelope * voiced
            start += length + 0.02
        start += 0.06 + 0.04 * (word % 3)  # pause between words
        if start > seconds - 0.2:
            break

    signal += 0.01 * generator.standard_normal(t.size)  # phone-line hiss
    signal += 0.01 * np.sin(2 * np.pi * 50 * t)  # mains hum
    sf.write(path, np.clip(signal, -1, 1).astype(np.float32), rate, subtype="PCM_16")


def make_siren(path: Path) -> None:
    """A wailing siren passing from left to right (44.1 kHz stereo FLAC, 1.5 s)."""
    rate, seconds = 44100, 1.5
    t = np.arange(int(rate * seconds)) / rate
    frequency = 900 + 350 * np.sin(2 * np.pi * 1.3 * t)  # wail
    phase = 2 * np.pi * np.cumsum(frequency) / rate
    tone = 0.5 * np.sin(phase) + 0.15 * np.sin(3 * phase)
    loudness = 0.4 + 0.6 * np.exp(-(((t - 0.8) / 0.5) ** 2))  # approaches, then recedes
    pan = np.clip(t / seconds, 0, 1)
    left = tone * loudness * np.cos(pan * np.pi / 2)
    right = tone * loudness * np.sin(pan * np.pi / 2)
    noise = 0.002 * rng(33).standard_normal((t.size, 2))
    stereo = np.stack([left, right], axis=1) + noise
    sf.write(path, np.clip(stereo, -1, 1).astype(np.float32), rate, format="FLAC", subtype="PCM_16")


# --------------------------------------------------------------------------- video


def write_mp4(
    path: Path,
    frames: list[np.ndarray],
    fps: int,
    audio: np.ndarray | None = None,
    audio_rate: int = 44100,
) -> None:
    """H.264 (yuv420p) video, plus an AAC track when `audio` (float32 [channels, samples]) is given."""
    height, width = frames[0].shape[:2]
    with av.open(str(path), mode="w", format="mp4", options={"fflags": "+bitexact"}) as container:
        video = container.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.codec_context.thread_count = 1
        video.options = {"crf": "28", "preset": "medium", "tune": "animation"}
        sound = None
        if audio is not None:
            layout = "stereo" if audio.shape[0] == 2 else "mono"
            sound = container.add_stream("aac", rate=audio_rate, layout=layout)
            sound.codec_context.thread_count = 1
            sound.bit_rate = 64000

        for index, pixels in enumerate(frames):
            # Convert here rather than inside encode(): the encoder's own conversion made x264's
            # output vary from run to run.
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24").reformat(format="yuv420p")
            frame.pts, frame.time_base = index, Fraction(1, fps)
            container.mux(video.encode(frame))
        container.mux(video.encode(None))

        if sound is not None and audio is not None:
            chunk = 1024
            for offset in range(0, audio.shape[1], chunk):
                samples = np.ascontiguousarray(audio[:, offset : offset + chunk], dtype=np.float32)
                frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout=sound.layout.name)
                frame.sample_rate = audio_rate
                frame.pts, frame.time_base = offset, Fraction(1, audio_rate)
                container.mux(sound.encode(frame))
            container.mux(sound.encode(None))


def delivery_frames(width: int, height: int, count: int) -> Iterator[np.ndarray]:
    """A delivery van crossing a street, with a flashing warning light."""
    for index in range(count):
        image = Image.new("RGB", (width, height), (150, 200, 235))
        draw = ImageDraw.Draw(image)
        draw.rectangle([0, 56, width, height], fill=(90, 90, 96))  # road
        for x in range(-((index * 3) % 24), width, 24):
            draw.rectangle([x, 74, x + 12, 76], fill=(235, 220, 120))
        draw.rectangle([8, 22, 38, 56], fill=(190, 170, 150))  # houses
        draw.rectangle([84, 30, 118, 56], fill=(170, 140, 120))
        draw.polygon([(84, 30), (101, 16), (118, 30)], fill=(140, 60, 50))
        x = -40 + index * (width + 50) // count
        draw.rectangle([x, 44, x + 34, 66], fill=(240, 240, 240), outline=(40, 40, 40))
        draw.rectangle([x + 34, 50, x + 44, 66], fill=(220, 60, 40), outline=(40, 40, 40))
        draw.rectangle([x + 36, 52, x + 42, 58], fill=(180, 220, 250))
        draw.ellipse([x + 4, 62, x + 12, 70], fill=(20, 20, 20))
        draw.ellipse([x + 30, 62, x + 38, 70], fill=(20, 20, 20))
        draw.text((x + 4, 48), "PKG", fill=(200, 40, 40), font=font(9))
        if index % 6 < 3:  # warning light, in time with the beeps
            draw.ellipse([x + 14, 38, x + 20, 44], fill=(255, 170, 0))
        yield np.asarray(image)


def delivery_soundtrack(seconds: float, rate: int) -> np.ndarray:
    """Engine rumble panned with the van, plus a reversing beep twice a second (stereo)."""
    t = np.arange(int(rate * seconds)) / rate
    rumble = 0.12 * np.sin(2 * np.pi * 70 * t) * (1 + 0.3 * np.sin(2 * np.pi * 9 * t))
    beep_on = (t % 0.5) < 0.2
    beep = 0.3 * np.sin(2 * np.pi * 1200 * t) * beep_on
    noise = 0.015 * rng(44).standard_normal(t.size)
    pan = np.clip(t / seconds, 0, 1)
    mono = rumble + beep + noise
    left = mono * np.cos(pan * np.pi / 2)
    right = mono * np.sin(pan * np.pi / 2)
    return np.clip(np.stack([left, right]), -1, 1).astype(np.float32)


def ball_frames(width: int, height: int, count: int, fps: int) -> Iterator[np.ndarray]:
    """A red ball bouncing across a room under gravity, losing height each bounce."""
    radius, floor = 7, height - 8
    x, y, vx, vy, gravity = 10.0, 12.0, 40.0, 0.0, 400.0
    dt = 1 / fps
    for _ in range(count):
        image = Image.new("RGB", (width, height), (238, 232, 214))
        draw = ImageDraw.Draw(image)
        draw.rectangle([0, floor, width, height], fill=(150, 110, 80))
        squash = max(0.0, 1 - (floor - radius - y) / 6) * 2
        shadow = max(2, int(radius * (1 - (floor - y) / height)))
        draw.ellipse([x - shadow, floor - 1, x + shadow, floor + 2], fill=(110, 80, 60))
        draw.ellipse(
            [x - radius - squash, y - radius + squash, x + radius + squash, y + radius],
            fill=(210, 40, 40),
            outline=(120, 20, 20),
        )
        draw.ellipse([x - 4, y - 5, x - 1, y - 2], fill=(255, 190, 190))
        yield np.asarray(image)
        vy += gravity * dt
        x, y = x + vx * dt, y + vy * dt
        if y > floor - radius:
            y, vy = floor - radius, -abs(vy) * 0.8
        if x > width - radius or x < radius:
            vx = -vx
            x = min(max(x, radius), width - radius)


def make_delivery_clip(path: Path) -> None:
    """Video with sound: 128x96, 12 fps, 36 frames (3 s), AAC 44.1 kHz stereo."""
    fps, count, rate = 12, 36, 44100
    frames = list(delivery_frames(128, 96, count))
    write_mp4(path, frames, fps, delivery_soundtrack(count / fps, rate), rate)


def make_bouncing_ball(path: Path) -> None:
    """Silent video: 96x64, 15 fps, 36 frames (2.4 s), no audio stream."""
    fps, count = 15, 36
    write_mp4(path, list(ball_frames(96, 64, count, fps)), fps)


# --------------------------------------------------------------------------- records


def load_records(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def state_text(state: Any) -> str:
    """Parquet holds the state as text: a string stays itself, anything else becomes JSON text."""
    if isinstance(state, str):
        if state.lstrip().startswith(("{", "[")):
            raise ValueError(f"a text state must not start with '{{' or '[' (it would be read as JSON): {state[:40]!r}")
        return state
    return json.dumps(state, ensure_ascii=False)


def write_parquet(records: list[dict[str, Any]], path: Path) -> None:
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("state", pa.string()),
            ("questions", pa.string()),
            *((name, pa.list_(pa.string())) for name in MEDIA_FIELDS),
        ]
    )
    columns: dict[str, list[Any]] = {
        "id": [record["id"] for record in records],
        "state": [state_text(record["state"]) for record in records],
        "questions": [json.dumps(record["questions"], ensure_ascii=False) for record in records],
    }
    for name in MEDIA_FIELDS:
        columns[name] = [list(record.get(name, [])) for record in records]
    pq.write_table(pa.table(columns, schema=schema), path, compression="zstd")


# --------------------------------------------------------------------------- checks


def check_media(path: Path) -> str:
    """Decode a media file completely with PyAV and describe it."""
    with av.open(str(path)) as container:
        videos = len(container.streams.video)
        audios = len(container.streams.audio)
        frames = sum(1 for _ in container.decode(video=0)) if videos else 0
    with av.open(str(path)) as container:
        samples = sum(frame.samples for frame in container.decode(audio=0)) if audios else 0
    if path.suffix == ".mp4":
        return f"{videos} video stream ({frames} frames), {audios} audio stream(s) ({samples} samples)"
    if audios:
        return f"audio, {samples} samples"
    return f"image, {frames} frame"


def main() -> None:
    MEDIA.mkdir(exist_ok=True)
    makers = {
        "parcel.jpg": make_parcel,
        "receipt.png": make_receipt,
        "error_dialog.png": make_error_dialog,
        "voicemail.wav": make_voicemail,
        "siren.flac": make_siren,
        "delivery_clip.mp4": make_delivery_clip,
        "bouncing_ball.mp4": make_bouncing_ball,
    }
    for name, make in makers.items():
        make(MEDIA / name)
        print(f"media/{name}: {(MEDIA / name).stat().st_size} bytes, {check_media(MEDIA / name)}")

    with av.open(str(MEDIA / "delivery_clip.mp4")) as container:
        assert container.streams.audio, "delivery_clip.mp4 must have a soundtrack"
    with av.open(str(MEDIA / "bouncing_ball.mp4")) as container:
        assert not container.streams.audio, "bouncing_ball.mp4 must be silent"

    records = load_records(RECORDS_JSONL)
    for record in records:
        for name in MEDIA_FIELDS:
            for entry in record.get(name, []):
                if not (HERE / entry).is_file():
                    raise FileNotFoundError(f"record {record['id']}: {name} entry {entry} does not exist")
    write_parquet(records, RECORDS_PARQUET)
    print(f"{RECORDS_PARQUET.name}: {len(records)} records")


if __name__ == "__main__":
    main()
