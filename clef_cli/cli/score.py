"""`clef score`: parse the options, refuse combinations that cannot work, run the engine the
options choose (local, Ray, or rehead), print the summary."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated

import typer
from typer._click.core import ParameterSource  # Typer's vendored click

from clef_cli.choices import HiddenDtype, HiddenStates, Layout, OverflowPolicy
from clef_cli.cli.console import stderr
from clef_cli.cli.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_RECORDS_FAILED
from clef_cli.cli.options import (
    DeviceOption,
    Dtype,
    MaxLengthOption,
    ModelOption,
    OverflowOption,
    QuestionsOption,
    RevisionOption,
    StructNullsOption,
    with_media_limits,
    writable_file,
    writable_file_or_stdout,
)
from clef_cli.cli.progress import RichProgress, install_stop_handlers, print_dry_run, print_summary
from clef_cli.errors import UsageError
from clef_cli.media import MediaLimits
from clef_cli.parquet_rows import StructNulls
from clef_cli.ray_watchdog import DEFAULT_STALL_TIMEOUT

RAY_ONLY = ("ray_address", "ray_actors", "gpus_per_worker", "cpus_per_worker", "block_records", "stall_timeout")


def refuse_impossible(ctx: typer.Context, ray: bool, rehead: Path | None) -> None:
    """Refuse, before any work, options that cannot apply: Ray's without --ray (an address from
    RAY_ADDRESS alone is fine: Ray clusters set it for every process), and --rehead with --ray."""
    if not ray:
        for name in RAY_ONLY:
            if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
                option = next(param for param in ctx.command.params if param.name == name).opts[0]
                raise UsageError(f"{option} applies to Ray runs only: add --ray")
    elif rehead is not None:
        raise UsageError("--rehead runs the head alone on stored hidden states: drop --ray")


def score(
    ctx: typer.Context,
    inputs: Annotated[
        list[str],
        typer.Argument(
            help="JSONL, JSON or Parquet files, or folders of Parquet parts: local paths or URIs "
            "(file:///abs/path, s3://bucket/key, gs://..., anything pyarrow's filesystems open)."
        ),
    ],
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            callback=writable_file,
            help="Output Parquet file (written atomically; a symlink's target, or streamed into a named pipe).",
        ),
    ],
    model: ModelOption = "Cloudflare/clef-omni",
    revision: RevisionOption = None,
    questions: QuestionsOption = None,
    max_length: MaxLengthOption = None,
    on_overflow: OverflowOption = OverflowPolicy.truncate,
    struct_nulls: StructNullsOption = StructNulls.refuse,
    max_batch_tokens: Annotated[
        int, typer.Option("--max-batch-tokens", min=1, help="Padded tokens per forward (batch size x longest).")
    ] = 32768,
    max_batch_size: Annotated[int, typer.Option("--max-batch-size", min=1, help="Records per forward.")] = 64,
    device: DeviceOption = "auto",
    dtype: Annotated[Dtype, typer.Option("--dtype", help="auto: bf16 on a GPU, fp32 on the CPU.")] = Dtype.auto,
    layout: Annotated[
        Layout, typer.Option("--layout", help="wide: one row per record; long: one row per record, question, label.")
    ] = Layout.wide,
    keep_columns: Annotated[
        str | None, typer.Option("--keep-columns", help="Input columns to pass through, comma-separated.")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Score only the first N records.")] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=0,
            help="Background processes that decode media and encode prompts for the model (0: inline). Default: "
            "none on the CPU; beside a GPU, every usable core but one, bounded by memory (see README). "
            "Not Ray's scoring actors: see --ray-actors.",
        ),
    ] = None,
    window: Annotated[int, typer.Option("--window", min=1, help="Records planned and length-sorted together.")] = 8192,
    checkpoint: Annotated[
        Path | None, typer.Option("--checkpoint", help="Checkpoint folder (default: OUTPUT.ckpt beside the output).")
    ] = None,
    hidden_states: Annotated[
        HiddenStates,
        typer.Option("--hidden-states", help="keep: store final hidden states (for --rehead); drop: results only."),
    ] = HiddenStates.keep,
    hidden_dtype: Annotated[
        HiddenDtype, typer.Option("--hidden-dtype", help="Stored hidden-state precision.")
    ] = HiddenDtype.bfloat16,
    restart: Annotated[bool, typer.Option("--restart", help="Discard an existing checkpoint and start over.")] = False,
    rehead: Annotated[
        Path | None,
        typer.Option(
            "--rehead",
            help="Re-score the checkpoint's hidden states with the joint head in this folder (no thinker; not "
            "with --ray).",
        ),
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            "--calibration",
            help="A `clef calibrate` file: probabilities, answers and confidences are written temperature-scaled "
            "(logits stay raw). Applied to the output only, so rerunning a finished job with another -o recalibrates "
            "it from the checkpoint without the model.",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate and plan everything, print the plan; load no weights.")
    ] = False,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet", "-q", help="No progress display; with --ray, Ray's own output goes to CHECKPOINT/ray.log."
        ),
    ] = False,
    stats_json: Annotated[
        Path | None,
        typer.Option(
            "--stats-json",
            callback=writable_file_or_stdout,
            help="Write where the time went (stage seconds, model busy, tokens, records, padding waste, "
            "encode rates per modality) to this JSON file (- for stdout).",
        ),
    ] = None,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Run on Ray Data across GPUs and machines (needs clef-cli[ray]): joins the cluster at "
            "--ray-address, or starts a local one. The options below marked --ray need it.",
        ),
    ] = False,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            envvar="RAY_ADDRESS",
            help="--ray: the cluster to join (ray://head:10001, auto, or local for a new local cluster).",
        ),
    ] = None,
    ray_actors: Annotated[
        int, typer.Option("--ray-actors", min=1, help="--ray: scoring actors, each with its own model copy.")
    ] = 1,
    gpus_per_worker: Annotated[
        float | None, typer.Option("--gpus-per-worker", min=0, help="--ray: GPUs per actor (default 1 with CUDA).")
    ] = None,
    cpus_per_worker: Annotated[
        float | None,
        typer.Option(
            "--cpus-per-worker",
            min=0,
            help="--ray: CPUs per actor (default: share what Ray Data's read tasks leave, at most 1 each).",
        ),
    ] = None,
    block_records: Annotated[
        int, typer.Option("--block-records", min=1, help="--ray: records handed to an actor at a time.")
    ] = 256,
    stall_timeout: Annotated[
        float,
        typer.Option(
            "--stall-timeout",
            min=1,
            help="--ray: stop (exit 1, everything committed kept) when no block comes back for this many seconds.",
        ),
    ] = DEFAULT_STALL_TIMEOUT,
    limits: MediaLimits | None = None,  # replaced by the five media-limit options (with_media_limits)
) -> None:
    """Score records into Parquet: one row per input record, in input order, with a probability
    for every option of every question. Resumes from its checkpoint when rerun.

    \b
    Examples:
      clef score sample_data/records.jsonl -o out.parquet
      clef score sample_data/posts.jsonl --questions sample_data/questions.json -o posts.parquet --device cpu
      clef score s3://bucket/records/ -o out.parquet --ray --ray-address ray://head-node:10001 --ray-actors 16
    """
    refuse_impossible(ctx, ray, rehead)
    from clef_cli.output import check_keep_columns
    from clef_cli.pipeline import ScoreJob, ScoreSettings

    columns = tuple(name.strip() for name in (keep_columns or "").split(",") if name.strip())
    check_keep_columns(columns)
    settings = ScoreSettings(
        inputs=inputs,
        output=output,
        model=model,
        revision=revision,
        questions=questions,
        max_length=max_length,
        overflow=on_overflow,
        struct_nulls=struct_nulls,
        limits=limits,
        max_batch_tokens=max_batch_tokens,
        max_batch_size=max_batch_size,
        device=device,
        dtype=None if dtype is Dtype.auto else dtype.value,
        layout=layout.value,
        keep_columns=columns,
        limit=limit,
        workers=workers,
        window=window,
        checkpoint=checkpoint,
        hidden_states=hidden_states.value,
        hidden_dtype=hidden_dtype.value,
        restart=restart,
        rehead=rehead,
        calibration=calibration,
    )
    progress = RichProgress(enabled=not quiet and stderr.is_terminal)
    if dry_run:
        report = ScoreJob(settings, progress).dry_run()
        progress.stop()
        print_dry_run(report, settings)
        return
    stop = threading.Event()
    install_stop_handlers(stop)
    try:
        if rehead is not None:
            from clef_cli.rehead import rehead as run_rehead

            summary = run_rehead(settings, progress)
        elif ray:
            cluster = ray_settings(
                settings.device, ray_address, ray_actors, gpus_per_worker, cpus_per_worker, block_records,
                stall_timeout, quiet or not stderr.is_terminal,
            )  # fmt: skip
            from clef_cli.ray_job import RayScoreJob

            summary = RayScoreJob(settings, cluster, progress, stop=stop).run()
        else:
            summary = ScoreJob(settings, progress, stop=stop).run()
    finally:
        progress.stop()
    print_summary(summary)
    if stats_json is not None:
        summary.final_stats().write_json(stats_json)
    if summary.interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)
    raise typer.Exit(EXIT_RECORDS_FAILED if summary.failed else EXIT_OK)


def ray_settings(
    device: str,
    address: str | None,
    actors: int,
    gpus_per_worker: float | None,
    cpus_per_worker: float | None,
    block_records: int,
    stall_timeout: float,
    quiet: bool,
) -> object:
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UsageError('--ray needs Ray: pip install "clef-cli[ray]"') from None
    import torch

    from clef_cli.ray_job import RaySettings

    if gpus_per_worker is None:
        gpus_per_worker = 1.0 if device != "cpu" and torch.cuda.is_available() else 0.0
    return RaySettings(
        address=None if address in (None, "local") else address,
        num_workers=actors,
        gpus_per_worker=gpus_per_worker,
        cpus_per_worker=cpus_per_worker,
        block_records=block_records,
        stall_timeout=stall_timeout,
        quiet=quiet,
    )


command = with_media_limits(score)
