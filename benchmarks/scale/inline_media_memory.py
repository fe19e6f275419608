"""Does inline media keep memory flat? Peak RSS of `clef score` over a `datasets` image table
(about 100 KiB of PNG a record, in a `{bytes, path}` Image column) at two sizes.

    python benchmarks/scale/inline_media_memory.py                  # 1k and 20k records
    python benchmarks/scale/inline_media_memory.py --sizes 500,5000

Each size runs in a fresh process (its peak RSS, getrusage's maxrss, is its own), on the tiny
fixture model on the CPU, with `--hidden-states drop` and no encoding workers: reading, keying,
planning, decoding, the forward, the head, commits and the output are all clef's own. The table
cycles 64 distinct noise images (incompressible PNGs of ~100 KiB) under distinct states, so
every record is its own prompt; Parquet's dictionary keeps the file small, but every row read
is a full 100 KiB cell in memory, as in a table of distinct images. The goal: the larger size's
peak at most 1.2x the smaller's (issue 47, as the text benchmark in docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "tests" / "fixtures" / "tiny-clef-omni"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Is this urgent?"}}
IMAGE_SIDE = 185
"""A noise PNG of 185x185 RGB is ~100 KiB (noise does not compress)."""


def write_table(path: Path, count: int, distinct: int = 64, files: bool = False) -> int:
    """`count` records under `datasets`' Image features (`files`: the same records as JSONL with
    the images in files beside it, the baseline); returns the bytes of one image."""
    import datasets
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    rng = np.random.default_rng(7)
    images = []
    for _ in range(distinct):
        buffer = io.BytesIO()
        pixels = rng.integers(0, 256, (IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buffer, "PNG")
        images.append(buffer.getvalue())
    if files:
        for number, data in enumerate(images):
            (path.parent / f"{number}.png").write_bytes(data)
        with (path.parent / "table.jsonl").open("w") as handle:
            for i in range(count):
                record = {"id": f"r{i}", "state": f"ticket {i}", "images": [f"{i % distinct}.png"]}
                handle.write(json.dumps(record) + "\n")
        return len(images[0])
    features = datasets.Features(
        {"id": datasets.Value("string"), "state": datasets.Value("string"), "photo": datasets.Image()}
    )
    schema = features.arrow_schema
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, count, 1000):
            rows = [
                {"id": f"r{i}", "state": f"ticket {i}", "photo": {"bytes": images[i % distinct], "path": None}}
                for i in range(start, min(count, start + 1000))
            ]
            writer.write_table(pa.Table.from_pylist(rows, schema=schema))
    return len(images[0])


def child(table: Path, folder: Path) -> dict:
    """One night in this process (of the JSONL baseline where the folder has one)."""
    from clef_cli.engines.local.pipeline import ScoreJob, ScoreSettings
    from clef_cli.inputs.columns import ColumnMapping

    (folder / "questions.json").write_text(json.dumps(QUESTIONS))
    files = (folder / "table.jsonl").exists()
    table = folder / "table.jsonl" if files else table
    mapping = None if files else ColumnMapping((("images", "photo"),))
    settings = ScoreSettings(
        inputs=[table], output=folder / "out.parquet", model=str(MODEL), device="cpu", dtype="float32", workers=0,
        hidden_states="drop", questions=folder / "questions.json", columns=mapping, max_length=4096,
    )  # fmt: skip
    started = time.perf_counter()
    summary = ScoreJob(settings).run()
    return {
        "records": summary.records,
        "failed": summary.failed,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "wall_s": time.perf_counter() - started,
    }


def measure(size: int, folder: Path, files: bool = False) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    image_bytes = write_table(folder / "table.parquet", size, files=files)
    command = [sys.executable, __file__, "--child", str(folder)]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"size {size} failed ({done.returncode}): {done.stderr[-3000:]}")
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    result["image_bytes"] = image_bytes
    print(f"{size:>7,} records{' (files)' if files else ''}: peak RSS {result['peak_rss_mib']:,.0f} MiB "
          f"({result['failed']} failed, {result['wall_s']:.0f} s, {image_bytes / 1024:.0f} KiB an image)")  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,20000")
    parser.add_argument("--files", action="store_true", help="the same records with the images in files")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child / "table.parquet", args.child)))
        return
    sizes = [int(value) for value in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        report = {str(size): measure(size, Path(tmp) / str(size), args.files) for size in sizes}
    first, last = report[str(sizes[0])], report[str(sizes[-1])]
    ratio = last["peak_rss_mib"] / first["peak_rss_mib"]
    print(f"peak RSS {sizes[-1]:,} / {sizes[0]:,}: {ratio:.2f}x (goal <= 1.2x)")
    if args.json:
        args.json.write_text(json.dumps(report | {"ratio": ratio}, indent=2) + "\n")


if __name__ == "__main__":
    main()
