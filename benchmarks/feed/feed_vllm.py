"""bench_feed.py --engine vllm: clef's vLLM engine around a simulated device at the real width.

The vLLM worker is started as in a real run, through clef's client, but as vllm_stand_in.py: the
real worker module with its engine replaced by a stand-in that sleeps tokens / rate seconds and
returns hidden states `[L, --hidden-size]`. The joint head is a random one of that width (the
tiny release's head reads 64-wide states), so the states cross the process boundary, and the
head, the store and the output run, at Clef-Omni's size.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STAND_IN = HERE / "vllm_stand_in.py"
HEAD_WIDTH = 256
"""The random head's width: its cost is the head's, left out of the efficiency figure that counts."""


def _real_width_head(hidden_size: int) -> Any:
    import torch

    from clef_cli.model.head import HeadConfig, JointSchemaHead

    torch.manual_seed(0)
    config = HeadConfig(hidden_size, HEAD_WIDTH, routing_layers=2, layers=2, heads=4, feedforward=2 * HEAD_WIDTH)
    return JointSchemaHead(config).eval()


class HeadOnDevice:
    """The head as device work: on a GPU it runs there, in milliseconds, so its CPU cost here is
    left out by replacing its forward with one that costs nothing (the layout is still built)."""

    def __init__(self, head: Any) -> None:
        self.real = head
        self.enabled = False

    def __call__(self, hidden_states: Any, lexical_rows: Any, layout: Any) -> Any:
        import torch

        if self.enabled:
            return torch.zeros(int(layout.option_record.shape[0]))
        return self.real(hidden_states, lexical_rows, layout)


HEAD = HeadOnDevice(None)
STEADY: dict[str, float] = {}
"""The main thread's and the process's CPU time at the run's first request to the worker: the
figures per token are counted from there (start-up, imports and the first window's planning are
the run's `startup_s`, not a cost per token)."""


def _mark_steady() -> None:
    if not STEADY:
        STEADY.update(thread=time.thread_time(), process=time.process_time())


def install(rate: float, hidden_size: int, device_log: Path) -> None:
    """Point clef's vLLM client at the stand-in worker and give the scorer a head of the real width."""
    import torch

    from clef_cli.engines.vllm import client, scorer

    os.environ["CLEF_VLLM_PYTHON"] = sys.executable
    os.environ["CLEF_BENCH_DEVICE_RATE"] = str(rate)
    os.environ["CLEF_BENCH_HIDDEN_SIZE"] = str(hidden_size)
    os.environ["CLEF_BENCH_DEVICE_LOG"] = str(device_log)
    client.WORKER = STAND_IN
    build_request = scorer.vllm_request

    def with_expanded_ids(encoded: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        request = build_request(encoded, *args, **kwargs)
        if encoded.record.has_media:  # the stand-in cannot expand placeholders as vLLM's processor does
            request["bench_ids"] = list(encoded.input_ids)
        return request

    scorer.vllm_request = with_expanded_ids
    load = scorer.load_vllm_scorer

    def real_width(*args: Any, **kwargs: Any) -> Any:
        loaded = load(*args, **kwargs)
        vocab = loaded.backbone.lexical_rows.shape[0]
        loaded.head = HEAD
        HEAD.real = _real_width_head(hidden_size)
        loaded.backbone.lexical_rows = torch.randn(vocab, hidden_size, generator=torch.Generator().manual_seed(1))
        loaded.backbone.hidden_size = hidden_size
        return loaded

    scorer.load_vllm_scorer = real_width
    name = "submit" if hasattr(client.VllmWorker, "submit") else "hidden"  # "hidden": the design before issue 37
    first_request = getattr(client.VllmWorker, name)

    def marked(self: Any, *args: Any) -> Any:
        _mark_steady()
        return first_request(self, *args)

    setattr(client.VllmWorker, name, marked)


def device_seconds(device_log: Path) -> float:
    """The stand-in's busy time so far (the sum of its sleeps)."""
    try:
        return sum(float(line) for line in device_log.read_text().split())
    except FileNotFoundError:
        return 0.0


def hidden_bytes(store: Path) -> int:
    return sum(path.stat().st_size for path in store.rglob("*") if path.is_file() and "hidden" in path.name)


def run_job(
    path: Path, folder: Path, workers: int, window: int, hidden_states: str, device_log: Path, dtype: str = "bfloat16"
) -> dict:
    """Two runs through the stand-in: with the head on this CPU, and with the head as device work
    (`busy_head_excluded` and the CPU figures `_head_excluded` are from that one)."""
    HEAD.enabled = False
    with_head = _run(path, folder, workers, window, hidden_states, device_log, dtype)
    HEAD.enabled = True
    without = _run(path, folder, workers, window, hidden_states, device_log, dtype)
    HEAD.enabled = False
    with_head["busy_head_excluded"] = without["busy"]
    for key in ("main_thread_cpu_us_per_token", "main_process_cpu_us_per_token", "disk_mb_per_s_got"):
        with_head[key + "_head_excluded"] = without[key]
    with_head["run_head_excluded"] = without
    return with_head


def _run(path: Path, folder: Path, workers: int, window: int, hidden_states: str, device_log: Path, dtype: str) -> dict:
    """One `clef score --engine vllm` run through the stand-in: busy, CPU per token, disk rates."""
    from benchmarks.score.bench_score import MODEL
    from clef_cli.engines.vllm.job import VllmScoreJob
    from clef_cli.job.plan import store_of
    from clef_cli.job.settings import ScoreSettings

    out = folder / f"out-vllm-{workers}-{hidden_states}.parquet"
    settings = ScoreSettings(
        inputs=[path],
        output=out,
        model=str(MODEL),
        workers=workers,
        window=window,
        restart=True,
        engine="vllm",
        hidden_states=hidden_states,
        device="cpu",
        dtype=dtype,
    )
    device_log.write_text("")
    STEADY.clear()
    summary = VllmScoreJob(settings).run()
    main_cpu, process_cpu = time.thread_time() - STEADY["thread"], time.process_time() - STEADY["process"]
    stats = summary.final_stats()
    busy_seconds = device_seconds(device_log)
    steady = stats.scoring_seconds - stats.first_forward_seconds
    head = stats.stages["head"]
    tokens = max(1, summary.tokens)
    written = hidden_bytes(store_of(settings).folder)
    return {
        "main_thread_cpu_s": main_cpu,
        "main_thread_cpu_s_per_1k_tokens": 1000 * main_cpu / tokens,
        "main_thread_cpu_us_per_token": 1e6 * main_cpu / tokens,
        "main_process_cpu_us_per_token": 1e6 * process_cpu / tokens,
        "tokens": summary.tokens,
        "busy": min(1.0, busy_seconds / steady) if steady > 0 else 0.0,
        "device_s": busy_seconds,
        "hidden_bytes_written": written,
        "disk_mb_per_s_needed": written / max(1e-9, busy_seconds) / 1e6,
        "disk_mb_per_s_got": written / max(1e-9, steady) / 1e6,
        "model_busy": stats.model_busy,
        "startup_s": stats.first_forward_seconds,
        "scoring_s": stats.scoring_seconds,
        "encode_wait_s": stats.stages["encode_wait"],
        "forward_s": stats.stages["forward"],
        "head_s": head,
        "commit_wait_s": stats.stages["commit_wait"],
        "records": summary.records,
        "failed": summary.failed,
        "media_bytes_per_batch": 0.0,
        "main_copied_bytes_per_batch": 0.0,
    }
