"""Planted tasks for `clef train-head`: records whose answer the prompt carries in one place, so
a head that reads the stored states can learn it and one that does not cannot. Shared by
tests/test_train_head.py and benchmarks/quality/bench_planted.py.

- keyword: one of three keywords once among 15-50 filler words; `desk` (choice) follows it.
- long: the same, among 260-320 filler words (about 1,000 prompt tokens with the tiny tokenizer).
- image: neutral text and one image, a red, green or blue square on white; `colour` (choice).
- count: 15-30 filler words with the word "alarm" 0-3 times; `alarms` (score, levels 0-3).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

KEYWORDS = {"invoice": "money", "login": "access", "parcel": "post"}
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 30), "blue": (30, 30, 220)}
FILLER = (
    "the a report about some thing that happened today in town with people and more news after we saw it there"
).split()
TASKS = ("keyword", "long", "image", "count")


def _keyword_record(rng: random.Random, words: tuple[int, int]) -> tuple[dict, dict]:
    keyword = rng.choice(sorted(KEYWORDS))
    text = rng.choices(FILLER, k=rng.randint(*words) - 1)
    text.insert(rng.randint(0, len(text)), keyword)
    question = {"type": "choice", "instructions": "Which desk takes it?", "criteria": dict.fromkeys(KEYWORDS.values())}
    return {"state": " ".join(text), "questions": {"desk": question}}, {"desk": KEYWORDS[keyword]}


def _count_record(rng: random.Random) -> tuple[dict, dict]:
    count = rng.randrange(4)
    text = rng.choices(FILLER, k=rng.randint(15, 30))
    for _ in range(count):
        text.insert(rng.randint(0, len(text)), "alarm")
    question = {"type": "score", "instructions": "How many alarms?", "criteria": ["none", "one", "two", "three"]}
    return {"state": " ".join(text), "questions": {"alarms": question}}, {"alarms": count}


def _image_record(rng: random.Random, folder: Path, number: int) -> tuple[dict, dict]:
    from PIL import Image

    colour = rng.choice(sorted(COLOURS))
    image = Image.new("RGB", (64, 64), (255, 255, 255))
    side = rng.randint(24, 40)
    left, top = rng.randint(0, 64 - side), rng.randint(0, 64 - side)
    image.paste(COLOURS[colour], (left, top, left + side, top + side))
    name = f"square-{number}.png"
    image.save(folder / name)
    question = {"type": "choice", "instructions": "What colour is the square?", "criteria": dict.fromkeys(COLOURS)}
    text = " ".join(rng.choices(FILLER, k=rng.randint(5, 10)))
    return {"state": text, "questions": {"colour": question}, "images": [name]}, {"colour": colour}


def planted_task(task: str, count: int, folder: Path, seed: int = 7) -> tuple[Path, list[dict]]:
    """Write `count` records of `task` to folder/in.jsonl (images beside it); returns the path
    and each record's gold row (id plus the planted answer)."""
    rng = random.Random(seed)
    records, gold = [], []
    for number in range(count):
        if task == "keyword":
            record, answer = _keyword_record(rng, (15, 50))
        elif task == "long":
            record, answer = _keyword_record(rng, (260, 320))
        elif task == "image":
            record, answer = _image_record(rng, folder, number)
        elif task == "count":
            record, answer = _count_record(rng)
        else:
            raise ValueError(f"unknown planted task {task}")
        records.append({"id": f"r{number}", **record})
        gold.append({"id": f"r{number}", **answer})
    path = folder / "in.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path, gold


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path
