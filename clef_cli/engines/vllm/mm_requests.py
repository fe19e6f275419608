"""What one record becomes as a vLLM request: the token ids clef's prompt encoder made, with the
expanded media segment put back to its placeholder text (one placeholder per item: vLLM expands
it again, from the same media and processor settings), the decoded media, and the processor
options of DESIGN.md (image size bounds; videos at 2 fps, frames as decoded, their soundtracks
as audio in video). The worker hands back vLLM's expanded ids, which must equal ours."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from clef_cli.encoding.encoded import EncodedRecord
from clef_cli.encoding.media import MediaLimits
from clef_cli.families.base import decode_entries
from clef_cli.release import Release


def vllm_request(
    encoded: EncodedRecord, release: Release, limits: MediaLimits, tokenize: Callable[[str], list[int]]
) -> dict[str, Any]:
    """The worker's prompt for one record (see the module's docstring). `tokenize`: the release's
    tokenizer, without special tokens, for the media segment's unexpanded placeholder text."""
    record = encoded.record
    if not record.has_media:
        return {"ids": np.asarray(encoded.input_ids, dtype=np.int32)}
    from clef_cli.encoding.media import AUDIO_SAMPLE_RATE, decode_audio, decode_image, decode_video
    from clef_cli.families import family_of
    from clef_cli.families.base import AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER

    family = family_of(release)
    media: dict[str, Any] = {}
    # the family's image options (Omni: size bounds; dense: none, the release's own) nested, so
    # they reach the image processor alone: given flat, the video processor takes them too and
    # makes other frame sizes than the HF engine (issue 33)
    kwargs: dict[str, Any] = {"images_kwargs": dict(family.image_kwargs)} if family.image_kwargs else {}
    if record.images:
        media["image"] = decode_entries(record, "images", decode_image, limits)
    clips = [(clip, AUDIO_SAMPLE_RATE) for clip in decode_entries(record, "audio", decode_audio, limits)]
    videos = decode_entries(record, "videos", decode_video, limits)
    if videos:
        media["video"] = [video.frames for video in videos]
        kwargs |= {"fps": 2.0, "do_sample_frames": False}
        if all(video.soundtrack is not None for video in videos):
            kwargs["use_audio_in_video"] = True
            clips += [(video.soundtrack, AUDIO_SAMPLE_RATE) for video in videos]
    if clips:
        media["audio"] = clips
    if clips or videos:  # Omni's segment: each placeholder with its own "\n", kind by kind
        text = "".join(
            [IMAGE_PLACEHOLDER + "\n"] * len(record.images)
            + [AUDIO_PLACEHOLDER + "\n"] * len(record.audio)
            + [VIDEO_PLACEHOLDER + "\n"] * len(videos)
        )
    else:  # images alone: the family's own segment (dense: IMAGE * n + "\n")
        text = family.image_text(len(record.images))
    start, end = encoded.media_span
    ids = [*encoded.input_ids[:start], *tokenize(text), *encoded.input_ids[end:]]
    return {"ids": np.asarray(ids, dtype=np.int32), "mm": media, "mm_kwargs": kwargs}
