"""Decoding media exactly as the reference does, behind limits that stop hostile inputs early.

Images: Pillow, RGB. Audio: the first audio stream through PyAV's resampler to 16 kHz mono float32
(its stereo mix-down and its filter are part of the contract; priming samples stay). Video: the
first video stream at 2 fps, frames capped at 262144 pixels with even sides, an even frame count,
plus the soundtrack when there is one.

Where the bytes come from (`open_source`): a local path (fenced by `locations/fence` under
--media-root), a data: URL, an http(s) URL through the one checked fetcher (`remote_fetch`), or
an object in a store (`remote_objects`, confined to the input's folder and --media-root URIs),
the remote ones read from the job's copy (`remote_spool`) when it has one; or the record itself,
which may carry the bytes (`InlineBytes`: decoded as the same bytes in a file, under the same
limits) or 16 kHz mono samples (`InlineSamples`, taken as they are, as the reference takes raw
samples).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np

from clef_cli.encoding.inline_media import inline_samples, not_samples, open_inline
from clef_cli.encoding.media_limits import MediaError, MediaLimits
from clef_cli.encoding.remote_objects import object_bytes
from clef_cli.encoding.remote_spool import RemoteSpool
from clef_cli.inputs.media_cells import InlineSamples, MediaEntry
from clef_cli.locations.fence import MediaBase, open_confined, place
from clef_cli.locations.remote_fetch import FetchError, fetch
from clef_cli.locations.uris import LocationProblem, shown

AUDIO_SAMPLE_RATE = 16000
VIDEO_FPS = 2.0
MAX_FRAME_PIXELS = 256 * 32 * 32
T = TypeVar("T")


@dataclass(frozen=True)
class DecodedVideo:
    frames: np.ndarray
    """uint8 [frames, height, width, 3], an even number of frames."""
    soundtrack: np.ndarray | None
    """16 kHz mono float32, or None when the file has no audio stream."""


# --------------------------------------------------------------------------- sources


DATA_URL_TYPES = {"images": ("image/",), "audio": ("audio/", "video/"), "videos": ("video/",)}
"""The MIME types a data: URL may declare in each media field (audio may be a video's soundtrack);
no type, or application/octet-stream, leaves it to the content."""


Source = str | io.BytesIO | BinaryIO | InlineSamples
"""What a decoder reads: a path, fetched, decoded or inline bytes, a file opened inside a media
root, or pre-decoded audio samples (only `decode_audio` takes those)."""


def open_source(entry: MediaEntry, base_dir: MediaBase, limits: MediaLimits, field: str | None = None) -> Source:
    """A local path (checked; an open file under --media-root) or the bytes of a data: / http(s)
    URL, of an object in a store (`remote_objects`) or of the record's own cell, within the byte
    limit, once the one fence (`fence.place`) allowed the entry. The caller closes it
    (`close_source`)."""
    if not isinstance(entry, str):
        return open_inline(entry, limits)
    try:
        where = place(entry, base_dir, limits.roots)
    except LocationProblem as problem:
        raise MediaError(str(problem), transient=problem.transient) from None
    if where.kind == "data":
        _check_data_url_type(entry, field)
        return io.BytesIO(_data_url_bytes(entry, limits))
    if where.kind == "url":
        return io.BytesIO(remote_bytes(entry, limits))
    if where.kind == "object":
        return io.BytesIO(object_bytes(str(where.location), limits))
    return _local_file(Path(where.location), where.shown, limits)


def _local_file(path: Path, name: str, limits: MediaLimits) -> Source:
    """A local file the fence allowed: opened inside --media-root when there are local roots,
    else its path once checked; messages name it as the record wrote it (`name`)."""
    if limits.media_roots:
        try:
            return open_confined(path, limits.media_roots, limits.max_file_bytes, name)
        except LocationProblem as problem:
            raise MediaError(str(problem)) from None
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise MediaError(f"file not found: {name}") from None
    except OSError as error:  # a symlink loop, a path too long, no permission
        raise MediaError(f"cannot read {name}: {error.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise MediaError(f"not a regular file: {name}")
    if info.st_size > limits.max_file_bytes:
        raise MediaError(f"file is {info.st_size} bytes, over the limit of {limits.max_file_bytes}: {name}")
    return str(path)


def as_written(error: MediaError, source: Source, entry: MediaEntry) -> MediaError:
    """`error` naming the medium as the record wrote it: a decoder (PyAV, Pillow) quotes the path
    it opened, which is the host's, not the record's."""
    if isinstance(source, str) and isinstance(entry, str) and source in str(error):
        return MediaError(str(error).replace(source, shown(entry)), transient=error.transient)
    return error


def close_source(source: Source) -> None:
    if not isinstance(source, (str, InlineSamples)):
        source.close()


def remote_bytes(url: str, limits: MediaLimits) -> bytes:
    """The bytes of an http(s) medium: the ones the job fetched while keying it (so they are
    the bytes its key hashes), else fetched now through the one checked fetcher."""
    if not limits.allow_remote:
        raise MediaError("http(s) media are refused; pass --allow-remote-media to fetch them")
    try:
        spooled = RemoteSpool(limits.remote_spool).stored(url) if limits.remote_spool is not None else None
        return spooled if spooled is not None else fetch(url, limits.fetch_policy())
    except FetchError as error:
        raise MediaError(str(error), transient=error.transient) from None


def _check_data_url_type(entry: str, field: str | None) -> None:
    """A data: URL that says it holds another kind of media (or text) is refused, not guessed at."""
    mime = entry[5:].partition(",")[0].partition(";")[0].strip().lower()
    allowed = DATA_URL_TYPES.get(field or "")
    if not mime or mime == "application/octet-stream" or allowed is None:
        return
    if not mime.startswith(allowed):
        expected = " or ".join(prefix + "*" for prefix in allowed)
        raise MediaError(f"a data: URL of type {mime!r} in {field} (expected {expected})")


def _data_url_bytes(entry: str, limits: MediaLimits) -> bytes:
    header, _, payload = entry.partition(",")
    if ";base64" not in header:
        raise MediaError("data: URLs must be base64-encoded")
    if len(payload) * 3 // 4 > limits.max_file_bytes:
        raise MediaError(f"data: URL is over the limit of {limits.max_file_bytes} bytes")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("data: URL is not valid base64") from None


# --------------------------------------------------------------------------- images


def decode_image(source: Source, limits: MediaLimits) -> Any:
    """A PIL RGB image; the pixel count is checked from the header before decoding."""
    return _with_image(source, limits, lambda image: image.convert("RGB"))


def image_size(source: Source, limits: MediaLimits) -> tuple[int, int]:
    """(width, height) from the header alone, under the same checks as `decode_image`: an image's
    token count depends only on its size, so a run can plan it without decoding its pixels."""
    return _with_image(source, limits, lambda image: image.size)


def _with_image(source: Source, limits: MediaLimits, use: Callable[[Any], T]) -> T:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(not_samples(source, "an image")) as image:
            width, height = image.size
            if width * height > limits.max_image_pixels:
                raise MediaError(
                    f"image is {width}x{height} = {width * height} pixels, over the limit of {limits.max_image_pixels}"
                )
            return use(image)
    except UnidentifiedImageError:
        raise MediaError("not a decodable image") from None
    except Image.DecompressionBombError as error:
        raise MediaError(f"image refused: {error}") from None
    except (OSError, ValueError, SyntaxError) as error:
        raise MediaError(f"cannot decode image: {error}") from None


# --------------------------------------------------------------------------- audio


def _rewind(source: Source) -> Source:
    if not isinstance(source, str):
        source.seek(0)
    return source


def _open_container(source: Source) -> Any:
    import av

    try:
        return av.open(_rewind(source), mode="r")
    except (av.error.FFmpegError, OSError, ValueError) as error:
        raise MediaError(f"cannot open media: {error}") from None


class _AudioCollector:
    """16 kHz mono float32 samples of one audio stream, fed frame by frame (so that a video's
    soundtrack is decoded in the same demux pass as its frames)."""

    def __init__(self, max_seconds: float) -> None:
        import av

        self.resampler = av.AudioResampler(format="flt", layout="mono", rate=AUDIO_SAMPLE_RATE)
        self.max_seconds = max_seconds
        self.max_samples = int(max_seconds * AUDIO_SAMPLE_RATE)
        self.chunks: list[np.ndarray] = []
        self.total = 0

    def add(self, frame: Any) -> None:
        for resampled in self.resampler.resample(frame):
            chunk = resampled.to_ndarray().reshape(-1)
            self.total += chunk.shape[0]
            if self.total > self.max_samples:
                raise MediaError(f"audio is longer than the limit of {self.max_seconds:g} s")
            self.chunks.append(chunk)

    def samples(self) -> np.ndarray:
        for resampled in self.resampler.resample(None):
            self.chunks.append(resampled.to_ndarray().reshape(-1))
        if not self.chunks:
            raise MediaError("audio stream holds no samples")
        samples = np.concatenate(self.chunks).astype(np.float32, copy=False)
        if not np.isfinite(samples).all():
            bad = int(np.count_nonzero(~np.isfinite(samples)))
            raise MediaError(f"audio holds non-finite samples (NaN or infinity): {bad} of {samples.shape[0]}")
        return samples


def _decode_audio_stream(container: Any, max_seconds: float) -> np.ndarray:
    import av

    collector = _AudioCollector(max_seconds)
    try:
        for frame in container.decode(container.streams.audio[0]):
            collector.add(frame)
        return collector.samples()
    except av.error.FFmpegError as error:
        raise MediaError(f"cannot decode audio: {error}") from None


def decode_audio(source: Source, limits: MediaLimits) -> np.ndarray:
    """16 kHz mono float32 samples of the first audio stream (or the record's own samples)."""
    if isinstance(source, InlineSamples):
        return inline_samples(source, limits)
    with _open_container(source) as container:
        if not container.streams.audio:
            raise MediaError("no audio stream")
        _check_duration(container, container.streams.audio[0], limits.max_audio_seconds, "audio")
        return _decode_audio_stream(container, limits.max_audio_seconds)


def _check_duration(container: Any, stream: Any, max_seconds: float, kind: str) -> None:
    """Refuse early when the header already says the stream is too long."""
    seconds = None
    if stream.duration is not None and stream.time_base is not None:
        seconds = float(stream.duration * stream.time_base)
    elif container.duration is not None:
        seconds = container.duration / 1_000_000
    if seconds is not None and seconds > max_seconds:
        raise MediaError(f"{kind} is {seconds:.1f} s long, over the limit of {max_seconds:g} s")


# --------------------------------------------------------------------------- video


def capped_frame_size(width: int, height: int) -> tuple[int, int]:
    """The reference's per-frame cap: scale to at most 262144 pixels, even sides of at least 2."""
    if width * height <= MAX_FRAME_PIXELS:
        return width, height
    scale = math.sqrt(MAX_FRAME_PIXELS / (width * height))
    return max(2, round(width * scale / 2) * 2), max(2, round(height * scale / 2) * 2)


class _FrameCollector:
    """Frames at 2 fps: the first frame at or after each multiple of 0.5 s, converted to RGB (and
    capped) only when kept."""

    def __init__(self, limits: MediaLimits) -> None:
        self.limits = limits
        self.frames: list[np.ndarray] = []

    def add(self, frame: Any) -> None:
        limits = self.limits
        time = frame.time
        if time is None:
            return
        if time > limits.max_video_seconds:
            raise MediaError(f"video is longer than the limit of {limits.max_video_seconds:g} s")
        if time < len(self.frames) / VIDEO_FPS:
            return
        if frame.width * frame.height > limits.max_image_pixels:
            raise MediaError(f"a video frame is over the limit of {limits.max_image_pixels} pixels")
        new_width, new_height = capped_frame_size(frame.width, frame.height)
        self.frames.append(_frame_rgb(frame, new_width, new_height))

    def stacked(self) -> np.ndarray:
        if not self.frames:
            raise MediaError("video stream holds no frames")
        if len(self.frames) % 2:
            self.frames.append(self.frames[-1])
        return np.stack(self.frames)


def _check_video_stream(container: Any, stream: Any, limits: MediaLimits) -> None:
    width, height = stream.codec_context.width, stream.codec_context.height
    if width * height > limits.max_image_pixels:
        raise MediaError(f"video frames are {width}x{height}, over the limit of {limits.max_image_pixels} pixels")
    _check_duration(container, stream, limits.max_video_seconds, "video")


def _frame_rgb(frame: Any, width: int, height: int) -> np.ndarray:
    if (width, height) == (frame.width, frame.height):
        return frame.to_ndarray(format="rgb24")
    return frame.to_ndarray(format="rgb24", width=width, height=height)


DECODE_THREADS = int(os.environ.get("CLEF_DECODE_THREADS", "1"))
"""FFmpeg threads per video decoder. One per encoding worker is right when the workers already
use every core; `set_decode_threads` raises it when a worker has more than one core."""


def set_decode_threads(threads: int) -> None:
    global DECODE_THREADS
    DECODE_THREADS = max(1, int(threads))


def decode_video(source: Source, limits: MediaLimits) -> DecodedVideo:
    """Frames at 2 fps (capped, even count) and the soundtrack, if the file has one, from one
    open and one demux pass (frame threading when this process may use several cores)."""
    import av

    with _open_container(not_samples(source, "a video")) as container:
        if not container.streams.video:
            raise MediaError("no video stream")
        video = container.streams.video[0]
        _check_video_stream(container, video, limits)
        if DECODE_THREADS > 1:
            video.thread_type = "AUTO"
            video.thread_count = DECODE_THREADS
        audio = container.streams.audio[0] if container.streams.audio else None
        frames = _FrameCollector(limits)
        soundtrack = _AudioCollector(limits.max_video_seconds) if audio is not None else None
        streams = (video, audio) if audio is not None else (video,)
        kind = "video"
        try:
            for packet in container.demux(*streams):
                if packet.stream.index == video.index:
                    kind = "video"
                    for frame in packet.decode():
                        frames.add(frame)
                else:
                    kind = "audio"
                    for frame in packet.decode():
                        soundtrack.add(frame)  # type: ignore[union-attr]
            kind = "video"
            stacked = frames.stacked()
            kind = "audio"
            samples = soundtrack.samples() if soundtrack is not None else None
        except av.error.FFmpegError as error:
            raise MediaError(f"cannot decode {kind}: {error}") from None
    return DecodedVideo(stacked, samples)
