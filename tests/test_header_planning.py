"""An image record is planned from its images' headers, without decoding a pixel (issue 24).

`PromptEncoder.plan` must give exactly the ids and spans `PromptEncoder.encode` gives (the
reference's own processor call), and `PromptEncoder.with_images` on that plan exactly its media
tensors, bit for bit, for both families, for sizes around every rounding edge of
`smart_resize`, for images it shrinks, refuses or enlarges, several images per record, every
Pillow mode that converts to RGB, and for the records whose images fail the same checks.
"""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest
import torch

from clef_cli.encoding.media import MediaLimits
from clef_cli.encoding.prompt import PromptEncoder
from clef_cli.errors import RecordError
from clef_cli.inputs.records import RecordBuilder

from .support.helpers import GOLDEN_MAX_LENGTH

ROOMY = 8192
"""Long enough for every record here (the golden length, 1024, refuses the large images)."""

SIZES = [
    (1, 1),
    (10, 40),
    (31, 33),
    (32, 32),
    (33, 31),
    (63, 65),
    (255, 257),
    (640, 480),
    (1280, 720),
    (720, 1280),
    (1001, 997),
    (3000, 2000),
    (8000, 30),
    (30, 7000),
]
"""Tiny (enlarged to the minimum), odd, square, portrait, over the maximum (shrunk), and too
elongated (refused by smart_resize)."""

QUESTIONS = {"kind": {"type": "choice", "instructions": "What is shown?", "criteria": {"cat": "a cat", "dog": "a dog"}}}


def _image(path: Path, size: tuple[int, int], mode: str, seed: int) -> Path:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    if mode == "P":
        image = image.quantize(16)
    elif mode != "RGB":
        image = image.convert(mode)
    image.save(path)
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("header-images")
    made = {f"{w}x{h}": _image(folder / f"{w}x{h}.png", (w, h), "RGB", w * h) for w, h in SIZES}
    for mode, suffix in [("L", "png"), ("RGBA", "png"), ("P", "gif"), ("RGB", "jpg"), ("CMYK", "jpg")]:
        made[f"{mode}.{suffix}"] = _image(folder / f"{mode}.{suffix}", (333, 222), mode, 7)
    return made


def _records(images: dict[str, Path]) -> list:
    entries = [[str(path)] for path in images.values()]
    entries.append([str(images["640x480"]), str(images["1x1"]), str(images["720x1280"])])
    payload = base64.b64encode(images["255x257"].read_bytes()).decode()
    entries.append([f"data:image/png;base64,{payload}"])
    builder = RecordBuilder()
    state = "a longer state " * 12
    raws = [{"id": f"r{n}", "state": state, "images": media, "questions": QUESTIONS} for n, media in enumerate(entries)]
    return [builder.build(raw, n, None) for n, raw in enumerate(raws)]


def _outcome(step, record):
    try:
        return step(record)
    except RecordError as error:
        return str(error)


def _assert_planned_as_encoded(encoder: PromptEncoder, records: list) -> int:
    """Every record planned as it encodes; returns how many could be scored."""
    scored = 0
    for record in records:
        planned, encoded = _outcome(encoder.plan, record), _outcome(encoder.encode, record)
        if isinstance(encoded, str):
            assert planned == encoded, record.id
            continue
        scored += 1
        assert planned is not None and not planned.media, record.id
        assert planned.input_ids == encoded.input_ids, record.id
        for name in ("questions", "media_span", "state_span", "state_tokens_cut", "use_audio_in_video"):
            assert getattr(planned, name) == getattr(encoded, name), (record.id, name)
        completed = encoder.with_images(planned)  # as a batch completes it: the image processor alone
        assert completed.input_ids == encoded.input_ids and completed.media.keys() == encoded.media.keys(), record.id
        for name, tensor in encoded.media.items():
            got = completed.media[name]
            assert got.dtype == tensor.dtype and torch.equal(got, tensor), (record.id, name)  # bit for bit
    return scored


def test_omni_image_records_plan_from_headers_exactly(processor, images):
    records = _records(images)
    scored = _assert_planned_as_encoded(PromptEncoder(processor, ROOMY), records)
    assert scored == len(records) - 2  # the two too-elongated images are refused, in both


def test_dense_image_records_plan_from_headers_exactly(images):
    from clef_cli.families import family_of
    from clef_cli.release import load_processor, resolve_release

    from .support.helpers import FIXTURES

    dense = resolve_release(str(FIXTURES / "tiny-clef-dense"))
    encoder = PromptEncoder(load_processor(dense), ROOMY, family=family_of(dense))
    records = _records(images)
    assert _assert_planned_as_encoded(encoder, records) == len(records) - 2


def test_limits_and_overflow_refuse_the_same_records_with_the_same_message(processor, images):
    records = _records(images)
    tight = PromptEncoder(processor, ROOMY, limits=MediaLimits(max_image_pixels=500_000))
    assert _assert_planned_as_encoded(tight, records) < len(records) - 2  # 1001x997 and larger are refused
    short = PromptEncoder(processor, GOLDEN_MAX_LENGTH)  # large images push the schema past the limit
    assert _assert_planned_as_encoded(short, records) < len(records) - 2
    truncating = PromptEncoder(processor, 340)  # small images fit, their states are cut
    assert _assert_planned_as_encoded(truncating, records) > 0
    assert any(getattr(_outcome(truncating.encode, record), "state_tokens_cut", 0) for record in records)


def test_golden_image_records_plan_exactly_and_other_media_need_a_full_encode(encoder, golden_records):
    planned = 0
    for record in golden_records:
        plan = encoder.plan(record)
        if not record.has_media or record.audio or record.videos:
            assert plan is None, record.id
            continue
        planned += 1
        assert plan is not None and plan.input_ids == encoder.encode(record).input_ids, record.id
    assert planned >= 1


def test_a_truncated_image_plans_and_fails_when_its_batch_encodes_it(processor, images, tmp_path):
    """Only a decode finds a body cut short: the plan counts it, and its batch's encode fails it
    as that record's error (so the job records it like any bad image)."""
    whole = images["RGB.jpg"].read_bytes()
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(whole[: len(whole) // 2])
    record = RecordBuilder().build({"id": "cut", "state": "s", "images": [str(cut)], "questions": QUESTIONS}, 0, None)
    encoder = PromptEncoder(processor, ROOMY)
    assert encoder.plan(record) is not None
    with pytest.raises(RecordError, match=r"'cut', field 'images\[0\]'"):
        encoder.encode(record)


def test_an_image_that_changes_size_after_planning_is_that_records_transient_error(processor, tmp_path):
    path = _image(tmp_path / "swapped.png", (640, 480), "RGB", 1)
    record = RecordBuilder().build({"id": "swap", "state": "s", "images": [str(path)], "questions": QUESTIONS}, 0, None)
    encoder = PromptEncoder(processor, ROOMY)
    planned = encoder.plan(record)
    _image(path, (1280, 720), "RGB", 2)  # replaced while the job runs
    with pytest.raises(RecordError, match="changed size") as raised:
        encoder.with_images(planned)
    assert raised.value.kind == "transient"
    _image(path, (640, 480), "RGB", 3)  # other pixels, the same size: the plan still holds
    assert torch.equal(encoder.with_images(planned).media["pixel_values"], encoder.encode(record).media["pixel_values"])
