"""Media made by the tests (nothing binary is committed): float WAVs, PNGs, header-only PNG bombs,
data: URLs and Matroska clips whose soundtrack may hold NaN."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from pathlib import Path

import av
import numpy as np
import soundfile
from PIL import Image

SECOND = np.arange(16000) / 16000
"""One second of sample times at 16 kHz."""


def wav_bytes(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples.astype(np.float32), 16000, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


def png_bytes(size: tuple[int, int] = (8, 8)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims `width` x `height` pixels and holds none (a decompression bomb's header)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + header
    ihdr = struct.pack(">I", len(header)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    end = struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
    return b"\x89PNG\r\n\x1a\n" + ihdr + end


def data_url(mime: str, payload: bytes) -> str:
    return f"data:{mime};base64," + base64.b64encode(payload).decode("ascii")


def video_with_soundtrack(path: Path, samples: np.ndarray) -> Path:
    """A Matroska file: four 64x64 frames and a float PCM soundtrack (which may hold NaN)."""
    with av.open(str(path), "w", format="matroska") as out:
        video = out.add_stream("mpeg4", rate=4)
        video.width, video.height, video.pix_fmt = 64, 64, "yuv420p"
        audio = out.add_stream("pcm_f32le", rate=16000)
        audio.layout = "mono"
        for step in range(4):
            frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), 40 * step, np.uint8), format="rgb24")
            for packet in video.encode(frame):
                out.mux(packet)
        sound = av.AudioFrame.from_ndarray(samples.astype(np.float32).reshape(1, -1), format="flt", layout="mono")
        sound.sample_rate = 16000
        for packet in [*audio.encode(sound), *video.encode(), *audio.encode()]:
            out.mux(packet)
    return path
