"""The short text records of the scale benchmarks (bench_scale.py, scale_ray.py, scale_dry_run.py,
bench_media_night.py's questions): one module below them all, so none imports another for them."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

from benchmarks.score.bench_score import WORDS

QUESTIONS = {"urgent": {"type": "noul", "instructions": "Is this urgent?"}}


def iter_records(count: int, seed: int, prefix: str = "t") -> Iterator[dict]:
    """Short support-ticket-like states (4 to 24 words), so the per-record costs dominate."""
    rng = random.Random(seed)
    for index in range(count):
        state = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24)))
        yield {"id": f"{prefix}{index}", "state": f"{state} #{prefix}{index}", "questions": QUESTIONS}


def write_records(path: Path, count: int, new: int = 0) -> Path:
    """`count` records, then `new` records no earlier night had."""
    with path.open("w", encoding="utf-8") as handle:
        for record in iter_records(count, seed=7):
            handle.write(json.dumps(record) + "\n")
        for record in iter_records(new, seed=8, prefix="n"):
            handle.write(json.dumps(record) + "\n")
    return path
