"""The second night over media that did not change: bytes read and time, with the store's stat
cache (store/media_stats.py) and without it (`--verify-media`, which hashes every file again as
every night did before the cache).

    python benchmarks/scale/bench_media_night.py                       # 10k images, 1k videos
    python benchmarks/scale/bench_media_night.py --images 1000 --videos 100 --json media.json

Each record has its own small generated file (96x96 PNGs of noise; 1 s 64x64 H.264 clips at
8 fps), so night 1 computes every record and night 2 has every file to key. Night 2 appends 1%
new records (new files). Each night is a fresh process (bench_scale.py's child: the real
pipeline around bench_feed's SimulatedDevice, `--hidden-states drop`, no encoding workers);
printed: its CPU seconds, the bytes it read through read() (/proc/self/io rchar: the JSONL, the
store and the media; page-cache hits included), and night 2's CPU over night 1's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: `benchmarks.` and clef_cli
from benchmarks.scale.bench_scale import run_night
from benchmarks.scale.scale_records import QUESTIONS


def make_image(path: Path, seed: int) -> None:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (96, 96, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format="PNG")


def make_video(path: Path, seed: int) -> None:
    import av

    rng = np.random.default_rng(seed)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=8)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        for _ in range(8):
            frame = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode(None))


def write_set(folder: Path, kind: str, count: int, new: int) -> tuple[Path, Path]:
    """Night 1's and night 2's JSONL (night 2: the same records and `new` more), and their files."""
    make, field, suffix = (make_image, "images", "png") if kind == "image" else (make_video, "videos", "mp4")
    media = folder / "media"
    media.mkdir(parents=True, exist_ok=True)
    lines = []
    for number in range(count + new):
        path = media / f"{kind}{number}.{suffix}"
        if not path.exists():
            make(path, number)
        record = {"id": f"{kind}{number}", "state": f"{kind} {number}", field: [str(path)], "questions": QUESTIONS}
        lines.append(json.dumps(record) + "\n")
    first, second = folder / "night1.jsonl", folder / "night2.jsonl"
    first.write_text("".join(lines[:count]), encoding="utf-8")
    second.write_text("".join(lines), encoding="utf-8")
    return first, second


def measure(kind: str, count: int, folder: Path, rate: float) -> dict:
    first, second = write_set(folder, kind, count, max(1, count // 100))
    media_bytes = sum(path.stat().st_size for path in (folder / "media").iterdir())
    store = folder / "store.ckpt"
    nights = {"night1": run_night(first, folder / "n1.parquet", store, rate)}
    nights["night2_verify_media"] = run_night(second, folder / "n2v.parquet", store, rate, verify_media=True)
    (folder / "store.ckpt").rename(folder / "verified.ckpt")  # night 2 proper starts from night 1's store
    nights["night1_again"] = run_night(first, folder / "n1b.parquet", store, rate)
    nights["night2"] = run_night(second, folder / "n2.parquet", store, rate)
    base = nights["night1"]["job_cpu_s"]
    print(f"{kind}: {count:,} records, {media_bytes / 2**20:,.1f} MiB of media")
    for name, night in nights.items():
        print(
            f"  {name}: {night['job_cpu_s']:.1f} CPU s ({night['job_cpu_s'] / base:.1%} of night 1), wall "
            f"{night['wall_s']:.1f} s, read {night['read_bytes'] / 2**20:,.1f} MiB; run {night['run']:,}, "
            f"reused {night['reused']:,}"
        )
    return {"records": count, "media_bytes": media_bytes, "nights": nights}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--videos", type=int, default=1_000)
    parser.add_argument("--device-rate", type=float, default=1e9)
    parser.add_argument("--folder", type=Path, help="keep media and stores here (default: a temporary folder)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report = {}
    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        for kind, count in (("image", args.images), ("video", args.videos)):
            if count:
                report[kind] = measure(kind, count, Path(tmp) / kind, args.device_rate)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
