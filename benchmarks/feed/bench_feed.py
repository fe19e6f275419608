"""Does the model wait for the CPU? The real pipeline around a simulated device.

    python benchmarks/feed/bench_feed.py                       # all sets, small sizes (a few minutes)
    python benchmarks/feed/bench_feed.py --sets video --scale 4 --json feed.json

The thinker's forward is replaced by a stand-in that sleeps padded_tokens / --device-rate seconds
and returns zero hidden states of the right shape (it lives here, never in the product);
everything around it is clef's own: planning, encoding workers, spool, the joint head,
checkpoint commits with hidden states, the Parquet output. The media are generated on the fly
(cached in --media-dir): 1280x720 JPEGs, 30 s 44.1 kHz stereo WAVs, 20 s 720p H.264 + AAC MP4s
at about 2.5 Mbit/s, and text of log-normal length.

Per set it reports:
- the single-process encode rate per core: prompt tokens per CPU second of one process with one
  thread (CPU time, so that other load on the machine does not lower it; the wall-clock rate is
  reported beside it);
- busy at --workers 0, 1, 2: the simulated device's busy time (padded tokens / rate) over the
  time from the first forward to the last commit (steady state; the start-up before it, spawning
  workers and planning the first window, is `startup_s`). `model_busy` is clef's own figure
  (forward and head, whatever their CPU overheads, over the whole scoring time);
- efficiency = busy / min(1, workers x per-core rate / device rate): how close the pipeline gets
  to what its cores can feed; and the same with the joint head's time left out of the steady
  time (`efficiency_head_excluded`): the head runs on this CPU between forwards, where a GPU runs
  it in milliseconds, so that figure is the one that says whether a GPU would wait for the CPU;
- the main thread's CPU seconds per 1,000 prompt tokens (`time.thread_time`, so other load on the
  machine does not count; it includes the head, which runs on this CPU here);
- per batch with media: its media bytes, and the bytes the main process copied for it (tensors
  of the batch and of its records that are not in shared memory: a collate or a spool read on
  the main thread, where a batch a worker collated is only mapped).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: `benchmarks.` and clef_cli
from benchmarks.score.bench_score import MODEL, QUESTIONS, iter_text_records, write_jsonl

SETS = ("text", "image", "audio", "video", "mixed")
DEFAULT_RECORDS = {"text": 300, "image": 32, "audio": 24, "video": 12, "mixed": 24}
DISTINCT_FILES = {"image": 6, "audio": 3, "video": 2}


# ----------------------------------------------------------------------------- media


def make_image(path: Path, seed: int) -> None:
    """A 1280x720 photo-like JPEG (smooth gradients, shapes and sensor noise; ~200-400 KB)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:720, 0:1280].astype(np.float32)
    base = np.stack([(x / 5 + seed * 40) % 256, (y / 3 + seed * 70) % 256, ((x + y) / 8) % 256], axis=-1)
    pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    draw = ImageDraw.Draw(image)
    for _ in range(40):
        x0, y0 = int(rng.integers(0, 1200)), int(rng.integers(0, 680))
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        draw.ellipse((x0, y0, x0 + int(rng.integers(20, 300)), y0 + int(rng.integers(20, 200))), fill=color)
    image.save(path, quality=90)


def make_audio(path: Path, seed: int, seconds: float = 30.0, rate: int = 44100) -> None:
    """30 s of 44.1 kHz stereo: drifting tones under noise, 16-bit WAV."""
    import soundfile

    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    left = 0.3 * np.sin(2 * np.pi * (220 + 40 * seed) * t * (1 + 0.01 * np.sin(t)))
    right = 0.3 * np.sin(2 * np.pi * (330 + 25 * seed) * t)
    stereo = np.stack([left, right], axis=1) + rng.normal(0, 0.05, (t.size, 2))
    soundfile.write(str(path), np.clip(stereo, -1, 1).astype(np.float32), rate, subtype="PCM_16")


def make_video(path: Path, seed: int, seconds: int = 20, fps: int = 25) -> None:
    """20 s of 1280x720 H.264 at about 2.5 Mbit/s with a 44.1 kHz stereo AAC soundtrack."""
    import av

    rng = np.random.default_rng(seed)
    texture = rng.integers(0, 256, (720 + 64, 1280 + 64, 3), dtype=np.uint8)
    y, x = np.mgrid[0:720, 0:1280]
    with av.open(str(path), mode="w") as container:
        video = container.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = 1280, 720, "yuv420p"
        video.bit_rate = 2_500_000
        video.options = {"preset": "veryfast"}
        audio = container.add_stream("aac", rate=44100)
        audio.layout = "stereo"
        audio.bit_rate = 128_000
        for index in range(seconds * fps):
            shift = index % 64
            frame = texture[shift : shift + 720, shift : shift + 1280].copy()
            frame[..., 0] = (frame[..., 0] // 2 + ((x + 4 * index) % 256) // 2).astype(np.uint8)
            frame[..., 2] = (frame[..., 2] // 2 + ((y + 2 * index) % 256) // 2).astype(np.uint8)
            container.mux(video.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(video.encode(None))
        samples_per_frame = 1024
        total = seconds * 44100
        t = np.arange(total) / 44100
        sound = (0.2 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
        stereo = np.stack([sound, sound[::-1]])
        for start in range(0, total, samples_per_frame):
            chunk = np.ascontiguousarray(stereo[:, start : start + samples_per_frame])
            frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="stereo")
            frame.sample_rate = 44100
            frame.pts = start
            frame.time_base = Fraction(1, 44100)
            container.mux(audio.encode(frame))
        container.mux(audio.encode(None))


def media_files(folder: Path, sets: list[str]) -> dict[str, list[str]]:
    """The generated files the sets need (made once per --media-dir)."""
    folder.mkdir(parents=True, exist_ok=True)
    makers = {"image": (make_image, ".jpg"), "audio": (make_audio, ".wav"), "video": (make_video, ".mp4")}
    needed = set(makers) if "mixed" in sets else set(sets)
    files: dict[str, list[str]] = {}
    for kind, (make, suffix) in makers.items():
        if kind not in needed:
            continue
        files[kind] = []
        for seed in range(DISTINCT_FILES[kind]):
            path = folder / f"{kind}{seed}{suffix}"
            if not path.exists():
                started = time.perf_counter()
                partial = path.with_suffix(".part" + suffix)
                make(partial, seed)
                partial.rename(path)
                print(f"  made {path.name} ({path.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - started:.1f} s)")
            files[kind].append(str(path))
    return files


MEDIA_FIELDS = {"image": "images", "audio": "audio", "video": "videos"}


def set_records(name: str, count: int, files: dict[str, list[str]], seed: int = 5) -> list[dict]:
    """`count` records of one set: text alone, one media kind, or a mix of everything."""
    rng = random.Random(seed)
    records = list(iter_text_records(count, seed))
    for record in records:
        record["questions"] = QUESTIONS
        kinds = [name] if name in MEDIA_FIELDS else []
        if name == "mixed":
            kinds = rng.choice([[], ["image"], ["audio"], ["video"], ["image", "audio"]])
        if name != "text":
            record["state"] = " ".join(record["state"].split()[:60])  # media records: a short caption
        for kind in kinds:
            record[MEDIA_FIELDS[kind]] = [rng.choice(files[kind])]
    return records


# ----------------------------------------------------------------------------- measurements


def encode_rate(path: Path) -> dict[str, float]:
    """One process, one thread: prompt tokens per second of encoding (wall and CPU time)."""
    import torch

    from clef_cli.encoding.prompt import PromptEncoder
    from clef_cli.inputs.readers import read_records
    from clef_cli.release import load_processor, resolve_release

    torch.set_num_threads(1)
    encoder = PromptEncoder(load_processor(resolve_release(str(MODEL))), max_length=64000)
    records = list(read_records([path]))
    encoder.encode(records[0])  # warm-up
    tokens, wall, cpu = 0, time.perf_counter(), time.process_time()
    for record in records:
        tokens += encoder.encode(record).length
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"tokens": tokens, "tokens_per_s_wall": tokens / wall, "tokens_per_s_cpu": tokens / cpu}


def main_process_bytes(batch) -> tuple[int, int]:
    """(media bytes in the batch, bytes of the batch's and its records' tensors that the main
    process allocated and filled itself): a tensor in shared memory was written by a worker and
    only mapped here; any other one (a collate, a spool read) was copied on the main thread."""
    tensors = list(batch.media.values()) + [value for record in batch.records for value in record.media.values()]
    seen: set[int] = set()
    copied = 0
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.data_ptr() in seen or tensor.is_shared():
            continue
        seen.add(storage.data_ptr())
        copied += storage.nbytes()
    return sum(value.nbytes for value in batch.media.values()), copied


class SimulatedDevice:
    """Stands in for the thinker: sleeps padded_tokens / rate seconds, returns zero hidden states."""

    def __init__(self, hidden_size: int, rate: float) -> None:
        self.hidden_size, self.rate = hidden_size, rate
        self.reset()

    def reset(self) -> None:
        self.device_seconds = 0.0
        """The time a real device at `rate` would have been busy (padded tokens / rate)."""
        self.batches = self.media_bytes = self.copied_bytes = 0

    def __call__(self, batch) -> object:  # a clef_cli.encoding.batching.ModelBatch
        import torch

        rows, length = batch.input_ids.shape
        media, copied = main_process_bytes(batch)
        if media:
            self.batches += 1
            self.media_bytes += media
            self.copied_bytes += copied
        self.device_seconds += rows * length / self.rate
        time.sleep(rows * length / self.rate)
        return torch.zeros(rows, length, self.hidden_size)


def simulated_scorer(rate: float):
    from clef_cli.model.scoring import load_scorer

    scorer = load_scorer(str(MODEL), device="cpu")
    scorer.backbone.hidden_states = SimulatedDevice(scorer.backbone.hidden_size, rate)
    return scorer


def run_job(
    path: Path, folder: Path, workers: int, window: int, scorer, restart: bool = True, **more: object
) -> dict[str, float]:
    """The real pipeline (background commits with hidden states, Parquet output) around the
    stand-in; a fresh checkpoint unless `restart` is False (a second night over the same store);
    `more`: other settings (a store in a bucket: benchmarks/store/bench_store_feed.py)."""
    from clef_cli.engines.local.pipeline import ScoreJob, ScoreSettings

    out = folder / f"out-{workers}.parquet"
    settings = ScoreSettings(
        inputs=[path], output=out, model=str(MODEL), workers=workers, window=window, restart=restart, **more
    )
    device = scorer.backbone.hidden_states
    device.reset()
    main_cpu = time.thread_time()
    summary = ScoreJob(settings, scorer=scorer).run()
    main_cpu = time.thread_time() - main_cpu
    stats = summary.final_stats()
    steady = stats.scoring_seconds - stats.first_forward_seconds
    media_batches = max(1, device.batches)
    return {
        "main_thread_cpu_s": main_cpu,
        "main_thread_cpu_s_per_1k_tokens": 1000 * main_cpu / max(1, summary.tokens),
        "media_bytes_per_batch": device.media_bytes / media_batches,
        "main_copied_bytes_per_batch": device.copied_bytes / media_batches,
        "tokens": summary.tokens,
        "busy": min(1.0, device.device_seconds / steady) if steady > 0 else 0.0,
        "busy_head_excluded": _busy_head_excluded(device.device_seconds, steady, stats.stages["head"]),
        "device_s": device.device_seconds,
        "model_busy_steady": (stats.stages["forward"] + stats.stages["head"]) / steady if steady > 0 else 0.0,
        "model_busy": stats.model_busy,
        "startup_s": stats.first_forward_seconds,
        "scoring_s": stats.scoring_seconds,
        "encode_wait_s": stats.stages["encode_wait"],
        "forward_s": stats.stages["forward"],
        "head_s": stats.stages["head"],
        "commit_wait_s": stats.stages["commit_wait"],
        "padding_waste": stats.padding_waste,
        "records": summary.records,
        "failed": summary.failed,
    }


def _busy_head_excluded(device_seconds: float, steady: float, head: float) -> float:
    """Busy over the steady time less the joint head's: the head runs on this CPU between
    forwards (0.1 s a batch of 19 images here) where a GPU runs it in milliseconds, so this is
    the share of its time a GPU would have waited for nothing but its inputs."""
    return min(1.0, device_seconds / (steady - head)) if steady > head else 0.0


def job_runner(args: argparse.Namespace, folder: Path):
    """The measurement of one run: the HF engine around SimulatedDevice, or the vLLM engine
    around its stand-in worker (feed_vllm.py)."""
    if args.engine == "hf":
        scorer = simulated_scorer(args.device_rate)
        return lambda path, out, workers, window: run_job(path, out, workers, window, scorer)
    from benchmarks.feed import feed_vllm

    device_log = folder / "device.log"
    feed_vllm.install(args.device_rate, args.hidden_size, device_log)
    return lambda path, out, workers, window: feed_vllm.run_job(
        path, out, workers, window, args.hidden_states, device_log, args.dtype
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device-rate", type=float, default=40000, help="simulated prefill tokens/s (default 40000)")
    parser.add_argument("--sets", default=",".join(SETS), help="comma-separated: " + ", ".join(SETS))
    parser.add_argument("--workers", default="0,1,2", help="worker counts to measure (default 0,1,2)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every set's record count")
    parser.add_argument("--windows", type=int, default=4, help="split each set into about this many planning windows")
    parser.add_argument("--media-dir", type=Path, default=Path(tempfile.gettempdir()) / "clef-bench-feed-media")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf", help="hf, or vllm through a stand-in worker")
    parser.add_argument("--hidden-size", type=int, default=2048, help="--engine vllm: the states' width (default 2048)")
    parser.add_argument("--hidden-states", choices=("keep", "drop"), default="keep", help="--engine vllm: the policy")
    parser.add_argument(
        "--dtype", default="bfloat16", help="--engine vllm: the compute dtype the states cross in (default: a GPU's)"
    )
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    names = [name.strip() for name in args.sets.split(",") if name.strip()]
    worker_counts = [int(value) for value in args.workers.split(",")]
    print(f"simulated device: {args.device_rate:,.0f} tokens/s; {len(os.sched_getaffinity(0))} usable cores")
    files = media_files(args.media_dir, names)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        measure = job_runner(args, Path(tmp))
        for name in names:
            folder = Path(tmp) / name
            folder.mkdir()
            count = max(2, round(DEFAULT_RECORDS[name] * args.scale))
            path = write_jsonl(folder / "records.jsonl", set_records(name, count, files))
            rate = encode_rate(path)
            per_core = rate["tokens_per_s_cpu"]
            # a window must hold a few records per worker, or the workers cannot all be busy at once
            window = max(math.ceil(count / args.windows), 2 * max(worker_counts))
            runs = {str(w): measure(path, folder, w, window) for w in worker_counts}
            busy = {w: run["busy"] for w, run in runs.items()}
            busy_without_head = {w: run["busy_head_excluded"] for w, run in runs.items()}
            feedable = {w: min(1.0, int(w) * per_core / args.device_rate) for w in busy if int(w) > 0}
            efficiency = {w: busy[w] / feedable[w] for w in feedable}
            efficiency_without_head = {w: busy_without_head[w] / feedable[w] for w in feedable}
            results[name] = {
                "encode_tokens_per_s_per_core": per_core,
                "busy": busy,
                "efficiency": efficiency,
                "busy_head_excluded": busy_without_head,
                "efficiency_head_excluded": efficiency_without_head,
                "records": count,
                "tokens": rate["tokens"],
                "encode_tokens_per_s_wall": rate["tokens_per_s_wall"],
                "load_average": os.getloadavg()[0],
                "cores_to_feed_device": args.device_rate / per_core,
                "runs": runs,
            }
            cpu = ", ".join(f"w{w} {run['main_thread_cpu_s_per_1k_tokens']:.3f}" for w, run in runs.items())
            copied = ", ".join(f"w{w} {run['main_copied_bytes_per_batch'] / 1e6:.0f}" for w, run in runs.items())
            shown = ", ".join(f"w{w} {b:.2f}" for w, b in busy.items())
            eff = ", ".join(f"w{w} {e:.2f}" for w, e in efficiency.items())
            eff += " (head excluded: " + ", ".join(f"w{w} {e:.2f}" for w, e in efficiency_without_head.items()) + ")"
            print(
                f"{name:<6} {count:>4} records {rate['tokens']:>8} tokens; encode {per_core:>10,.0f} tok/s/core "
                f"(wall {rate['tokens_per_s_wall']:,.0f}, load {os.getloadavg()[0]:.1f}); busy {shown}; "
                f"efficiency {eff}; main-thread CPU s per 1k tokens {cpu}; MB copied per media batch {copied}",
                flush=True,
            )
            if args.engine == "vllm":
                for w, run in runs.items():
                    print(
                        f"       w{w}: main thread {run['main_thread_cpu_us_per_token']:.2f} CPU us/token "
                        f"({run['main_thread_cpu_us_per_token_head_excluded']:.2f} with the head on the device), "
                        f"main process {run['main_process_cpu_us_per_token']:.2f} "
                        f"({run['main_process_cpu_us_per_token_head_excluded']:.2f}); disk "
                        f"{run['disk_mb_per_s_needed']:.0f} MB/s needed, {run['disk_mb_per_s_got']:.0f} MB/s got "
                        f"({run['disk_mb_per_s_got_head_excluded']:.0f})",
                        flush=True,
                    )
    report = {"device_rate": args.device_rate, "engine": args.engine, "sets": results}
    if args.engine == "vllm":
        report |= {"hidden_size": args.hidden_size, "hidden_states": args.hidden_states, "dtype": args.dtype}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    shown = ("busy", "efficiency", "efficiency_head_excluded")
    brief = {name: {key: result[key] for key in shown} for name, result in results.items()}
    print(json.dumps({"device_rate": args.device_rate, "sets": brief}))


if __name__ == "__main__":
    main()
