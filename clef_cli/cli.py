"""The `clef` command line: parses options, shows progress on stderr, maps errors to exit codes.

All work happens in the library; every command here is a thin shell around it. Exit codes:
0 success, 1 fatal error, 2 usage error, 3 finished but some records failed, 4 train-head's gate
refused the head, 130 interrupted.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from clef_cli import __version__
from clef_cli.errors import ClefError, RecordError, UsageError
from clef_cli.media import MediaLimits
from clef_cli.parquet_rows import StructNulls
from clef_cli.progress import Progress
from clef_cli.ray_watchdog import DEFAULT_STALL_TIMEOUT

EXIT_OK, EXIT_FATAL, EXIT_USAGE, EXIT_RECORDS_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

app = typer.Typer(
    name="clef",
    help="Score records with Cloudflare's Clef-Omni decision model: a probability for every allowed "
    "option of every question, in Parquet.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)

T = TypeVar("T")

# ----------------------------------------------------------------------------- shared options

ModelOption = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Release folder or hub id (found through the HF cache; HF_HOME and HF_HUB_OFFLINE apply).",
        envvar="CLEF_MODEL",
    ),
]
RevisionOption = Annotated[str | None, typer.Option("--revision", help="Hub revision (branch, tag or commit).")]
MaxLengthOption = Annotated[
    int | None,
    typer.Option(
        "--max-length",
        min=16,
        help="Prompt token budget; the state is cut to fit. Default: the model's "
        "(64000 Clef-Omni, 16384 Clef/Clef-Flash).",
        show_default=False,
    ),
]
OverflowOption = Annotated[
    str,
    typer.Option(
        "--on-overflow",
        help="When the state does not fit: 'truncate' cuts it (the reference's behaviour), 'error' refuses the record.",
    ),
]
StructNullsOption = Annotated[
    StructNulls,
    typer.Option(
        "--struct-nulls",
        case_sensitive=False,
        help="What a null inside a Parquet struct column of state or questions means. A struct column gives "
        "every row the keys of every record, so by default ('refuse') such a record is refused rather than "
        "scored on a prompt it may not have meant. 'absent': the record has no such key. 'null': the record "
        "set it to null. JSON-text and map columns keep each record's own keys and need no choice.",
    ),
]
QuestionsOption = Annotated[
    Path | None,
    typer.Option("--questions", "-q", help="JSON file with one question schema for records that carry none."),
]
MaxImagePixelsOption = Annotated[
    int, typer.Option("--max-image-pixels", min=1, help="Largest image (or video frame) accepted, in pixels.")
]
MaxAudioSecondsOption = Annotated[
    float, typer.Option("--max-audio-seconds", min=0.1, help="Longest audio clip accepted, in seconds.")
]
MaxVideoSecondsOption = Annotated[
    float, typer.Option("--max-video-seconds", min=0.1, help="Longest video accepted, in seconds.")
]
MaxFileBytesOption = Annotated[
    str, typer.Option("--max-file-bytes", help="Largest media file accepted (bytes, or with K/M/G suffix).")
]
AllowRemoteOption = Annotated[
    bool,
    typer.Option(
        "--allow-remote-media",
        help="Fetch http(s) media URLs. Off by default: records may come from untrusted sources.",
    ),
]
VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="Show tracebacks for errors.")]
DEFAULT_LIMITS = MediaLimits()


def parse_size(text: str) -> int:
    """`256M` -> 268435456; plain numbers are bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    cleaned = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        if cleaned and cleaned[-1] in units:
            return int(float(cleaned[:-1]) * units[cleaned[-1]])
        return int(cleaned)
    except ValueError:
        raise UsageError(f"not a size: {text!r} (use bytes or a K/M/G suffix)") from None


def media_limits(
    max_image_pixels: int, max_audio_seconds: float, max_video_seconds: float, max_file_bytes: str, allow_remote: bool
) -> MediaLimits:
    return MediaLimits(
        max_image_pixels=max_image_pixels,
        max_audio_seconds=max_audio_seconds,
        max_video_seconds=max_video_seconds,
        max_file_bytes=parse_size(max_file_bytes),
        allow_remote=allow_remote,
    )


def overflow_policy(value: str) -> Any:
    from clef_cli.prompt import OverflowPolicy

    try:
        return OverflowPolicy(value)
    except ValueError:
        raise UsageError(f"--on-overflow must be 'truncate' or 'error', not {value!r}") from None


def run_guarded(verbose: bool, body: Callable[[], T]) -> T:
    """Run a command body; user mistakes and job failures become one line and an exit code."""
    try:
        return body()
    except UsageError as error:
        stderr.print(f"error: {error}", markup=False)
        raise typer.Exit(EXIT_USAGE) from None
    except ClefError as error:
        if verbose:
            traceback.print_exc()
        stderr.print(f"error: {error}", markup=False)
        raise typer.Exit(EXIT_FATAL) from None
    except KeyboardInterrupt:
        stderr.print("interrupted", markup=False)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except typer.Exit:
        raise
    except Exception as error:
        if verbose:
            traceback.print_exc()
        else:
            stderr.print(f"error: {type(error).__name__}: {error} (run with -v for the traceback)", markup=False)
        raise typer.Exit(EXIT_FATAL) from None


def version_callback(value: bool) -> None:
    if value:
        stdout.print(f"clef {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Score records with Cloudflare's Clef-Omni decision model."""


# ----------------------------------------------------------------------------- score


class RichProgress(Progress):
    """Records, tokens/s, ETA and errors so far, on stderr; silent when stderr is not a terminal."""

    def __init__(self, enabled: bool) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.enabled = enabled
        self.tokens = 0
        self.failed = 0
        self.started = time.monotonic()
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[errors]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=stderr,
            transient=False,
            disable=not enabled,
        )
        self._task: Any = None

    def start(self, total: int | None, done: int) -> None:
        self.started = time.monotonic()
        self._progress.start()
        self._task = self._progress.add_task("records", total=total, completed=done, rate="", errors="")

    def advance(self, records: int, tokens: int, failed: int) -> None:
        if self._task is None:
            return
        self.tokens += tokens
        self.failed += failed
        elapsed = max(time.monotonic() - self.started, 1e-6)
        self._progress.update(
            self._task,
            advance=records,
            rate=f"{self.tokens / elapsed:,.0f} tok/s",
            errors=f"{self.failed} errors" if self.failed else "",
        )

    def note(self, message: str) -> None:
        if self.enabled:
            self._progress.console.print(message, markup=False, style="dim")

    def stop(self) -> None:
        self._progress.stop()


def _install_stop_handlers(stop: threading.Event) -> None:
    """First SIGINT/SIGTERM: finish and commit the current batch, then exit 130. Second: abort."""

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        stderr.print("stopping after the current batch (press Ctrl-C again to abort)", markup=False)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _print_summary(summary: Any) -> None:
    if summary.interrupted:
        stderr.print(
            f"interrupted: {summary.committed} records committed this run; rerun the same command to continue",
            markup=False,
        )
        return
    rate = summary.tokens / summary.seconds if summary.seconds else 0.0
    stats = summary.stats
    busy = f", model busy {stats.model_busy:.0%}" if stats.measured else ""
    stderr.print(
        f"{summary.scored} scored, {summary.failed} failed of {summary.records} records "
        f"({summary.forwarded} run through the model, {summary.resumed} from the checkpoint); "
        f"{summary.tokens} tokens in {summary.seconds:.1f} s ({rate:,.0f} tok/s{busy}) -> {summary.output}",
        markup=False,
    )
    advice = stats.advice()
    if advice:
        stderr.print(advice, markup=False)
    for error in summary.first_errors[:3]:
        stderr.print(f"  error: {error}", markup=False)


def _print_dry_run(report: Any, settings: Any) -> None:
    from clef_cli.pipeline import human_size

    stdout.print(f"records: {report.records} ({report.valid} valid, {report.invalid} invalid)")
    if report.already_done:
        stdout.print(f"already in the checkpoint: {report.already_done} (not planned again)")
    percentiles = report.percentiles()
    if percentiles:
        stdout.print("prompt tokens: " + ", ".join(f"{key} {value}" for key, value in percentiles.items()))
        stdout.print(f"total prompt tokens: {sum(report.lengths)}")
    stdout.print(
        f"batches: {report.batches} ({report.audio_in_video_batches} with audio-in-video) under "
        f"{settings.max_batch_tokens} padded tokens and at most {settings.max_batch_size} records each"
    )
    stdout.print(f"padding waste: {report.padding_waste:.2%}")
    if settings.hidden_states == "keep":
        stdout.print(f"hidden states on disk: about {human_size(report.hidden_state_bytes)}")
    for error in report.first_errors:
        stdout.print(f"invalid: {error}")


def _run_on_ray(
    settings: Any,
    address: str | None,
    num_workers: int,
    gpus_per_worker: float | None,
    cpus_per_worker: float | None,
    block_records: int,
    stall_timeout: float,
    quiet: bool,
    progress: Any,
    stop: threading.Event,
) -> Any:
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UsageError('--ray needs Ray: pip install "clef-cli[ray]"') from None
    import torch

    from clef_cli.ray_job import RayScoreJob, RaySettings

    if gpus_per_worker is None:
        gpus_per_worker = 1.0 if settings.device != "cpu" and torch.cuda.is_available() else 0.0
    cluster = RaySettings(
        address=None if address in (None, "local") else address,
        num_workers=num_workers,
        gpus_per_worker=gpus_per_worker,
        cpus_per_worker=cpus_per_worker,
        block_records=block_records,
        stall_timeout=stall_timeout,
        quiet=quiet,
    )
    return RayScoreJob(settings, cluster, progress, stop=stop).run()


@app.command("score")
def score(
    inputs: Annotated[
        list[str],
        typer.Argument(
            help="JSONL, JSON or Parquet files, or folders of Parquet parts: local paths or URIs "
            "(file:///abs/path, s3://bucket/key, gs://..., anything pyarrow's filesystems open)."
        ),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output Parquet file (written atomically).")],
    model: ModelOption = "Cloudflare/clef-omni",
    revision: RevisionOption = None,
    questions: QuestionsOption = None,
    max_length: MaxLengthOption = None,
    on_overflow: OverflowOption = "truncate",
    struct_nulls: StructNullsOption = StructNulls.refuse,
    max_batch_tokens: Annotated[
        int, typer.Option("--max-batch-tokens", min=1, help="Padded tokens per forward (batch size x longest).")
    ] = 32768,
    max_batch_size: Annotated[int, typer.Option("--max-batch-size", min=1, help="Records per forward.")] = 64,
    device: Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")] = "auto",
    dtype: Annotated[
        str, typer.Option("--dtype", help="auto (bf16 on a GPU, fp32 on CPU), bfloat16, float16 or float32.")
    ] = "auto",
    layout: Annotated[
        str, typer.Option("--layout", help="wide: one row per record; long: one row per record, question, label.")
    ] = "wide",
    keep_columns: Annotated[
        str | None, typer.Option("--keep-columns", help="Input columns to pass through, comma-separated.")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Score only the first N records.")] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=0,
            help="Background encoding processes (0: inline). Default: none on the CPU; beside a GPU, every "
            "usable core but one, bounded by memory (see README).",
        ),
    ] = None,
    window: Annotated[int, typer.Option("--window", min=1, help="Records planned and length-sorted together.")] = 8192,
    checkpoint: Annotated[
        Path | None, typer.Option("--checkpoint", help="Checkpoint folder (default: OUTPUT.ckpt beside the output).")
    ] = None,
    hidden_states: Annotated[
        str, typer.Option("--hidden-states", help="keep: store final hidden states (for --rehead); drop: results only.")
    ] = "keep",
    hidden_dtype: Annotated[
        str, typer.Option("--hidden-dtype", help="Stored hidden-state precision: bfloat16, float16 or float32.")
    ] = "bfloat16",
    restart: Annotated[bool, typer.Option("--restart", help="Discard an existing checkpoint and start over.")] = False,
    rehead: Annotated[
        Path | None,
        typer.Option("--rehead", help="Re-score the checkpoint's hidden states with the joint head in this folder."),
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
        typer.Option("--quiet", help="No progress display; with --ray, Ray's own output goes to CHECKPOINT/ray.log."),
    ] = False,
    stats_json: Annotated[
        Path | None,
        typer.Option(
            "--stats-json",
            help="Write where the time went (stage seconds, model busy, tokens, records, padding waste, "
            "encode rates per modality) to this JSON file.",
        ),
    ] = None,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Run on Ray Data across GPUs and machines: `--ray` alone starts (or joins) a local cluster, "
            "`--ray ADDRESS` connects to one (needs clef-cli[ray]).",
        ),
    ] = False,
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="Ray cluster address (implies --ray).")
    ] = None,
    num_workers: Annotated[int, typer.Option("--num-workers", min=1, help="--ray: scoring actors.")] = 1,
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
        int,
        typer.Option("--block-records", min=1, help="--ray: records handed to an actor at a time."),
    ] = 256,
    stall_timeout: Annotated[
        float,
        typer.Option(
            "--stall-timeout",
            min=1,
            help="--ray: stop (exit 1, everything committed kept) when no block comes back for this many seconds.",
        ),
    ] = DEFAULT_STALL_TIMEOUT,
    max_image_pixels: MaxImagePixelsOption = DEFAULT_LIMITS.max_image_pixels,
    max_audio_seconds: MaxAudioSecondsOption = DEFAULT_LIMITS.max_audio_seconds,
    max_video_seconds: MaxVideoSecondsOption = DEFAULT_LIMITS.max_video_seconds,
    max_file_bytes: MaxFileBytesOption = "256M",
    allow_remote_media: AllowRemoteOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Score records into Parquet: one row per input record, in input order, with a probability
    for every option of every question. Resumes from its checkpoint when rerun."""

    def body() -> int:
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
            overflow=overflow_policy(on_overflow),
            struct_nulls=struct_nulls,
            limits=media_limits(
                max_image_pixels, max_audio_seconds, max_video_seconds, max_file_bytes, allow_remote_media
            ),
            max_batch_tokens=max_batch_tokens,
            max_batch_size=max_batch_size,
            device=device,
            dtype=None if dtype == "auto" else dtype,
            layout=layout,
            keep_columns=columns,
            limit=limit,
            workers=workers,
            window=window,
            checkpoint=checkpoint,
            hidden_states=hidden_states,
            hidden_dtype=hidden_dtype,
            restart=restart,
            rehead=rehead,
            calibration=calibration,
        )
        progress = RichProgress(enabled=not quiet and stderr.is_terminal)
        stop = threading.Event()
        if dry_run:
            report = ScoreJob(settings, progress).dry_run()
            progress.stop()
            _print_dry_run(report, settings)
            return EXIT_OK
        _install_stop_handlers(stop)
        try:
            if rehead is not None:
                from clef_cli.rehead import rehead as run_rehead

                summary = run_rehead(settings, progress)
            elif ray or ray_address:
                summary = _run_on_ray(
                    settings,
                    ray_address,
                    num_workers,
                    gpus_per_worker,
                    cpus_per_worker,
                    block_records,
                    stall_timeout,
                    quiet or not stderr.is_terminal,
                    progress,
                    stop,
                )
            else:
                summary = ScoreJob(settings, progress, stop=stop).run()
        finally:
            progress.stop()
        _print_summary(summary)
        if stats_json is not None:
            summary.final_stats().write_json(stats_json)
        if summary.interrupted:
            return EXIT_INTERRUPTED
        return EXIT_RECORDS_FAILED if summary.failed else EXIT_OK

    code = run_guarded(verbose, body)
    raise typer.Exit(code)


# ----------------------------------------------------------------------------- eval / calibrate

GoldOption = Annotated[
    Path | None,
    typer.Option(
        "--gold", help="Gold labels: JSONL, JSON list, CSV or Parquet; `id` plus a `labels` object or wide columns."
    ),
]
GoldColumnOption = Annotated[
    str | None,
    typer.Option("--gold-column", help="Take gold from this column of the scored file (kept with --keep-columns)."),
]
BinsOption = Annotated[int, typer.Option("--bins", min=1, help="Equal-width confidence bins for ECE.")]


def _write_json(path: Path, document: Any) -> None:
    from clef_cli.atomic import write_atomically

    text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    write_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))


@app.command("eval")
def evaluate(
    scored: Annotated[Path, typer.Argument(help="Parquet written by `clef score` (wide or long layout).")],
    gold: GoldOption = None,
    gold_column: GoldColumnOption = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write every metric as JSON here.")] = None,
    report: Annotated[Path | None, typer.Option("--report", help="Write a self-contained HTML report here.")] = None,
    bins: BinsOption = 15,
    target_accuracy: Annotated[
        float, typer.Option("--target-accuracy", help="Accuracy the confidence threshold must reach.")
    ] = 0.95,
    calibration: Annotated[
        Path | None, typer.Option("--calibration", help="Evaluate as if this `clef calibrate` file had been applied.")
    ] = None,
    by: Annotated[
        str | None, typer.Option("--by", help="Repeat everything per value of this passed-through column.")
    ] = None,
    verbose: VerboseOption = False,
) -> None:
    """Accuracy, calibration and an accept-without-review threshold per question, against gold labels.

    \b
    Examples:
      clef eval out.parquet --gold sample_data/posts_gold.jsonl
      clef eval out.parquet --gold gold.csv --json metrics.json --report report.html --target-accuracy 0.9
    """

    def body() -> int:
        from clef_cli.quality import jobs, tables

        inputs = jobs.read_inputs(scored, gold, gold_column)
        tables.print_problems(stderr, inputs.gold.problems)
        result = jobs.run_eval(inputs, bins, target_accuracy, jobs.read_calibration(calibration), by)
        tables.print_problems(stderr, (), result.warnings)
        stdout.print(tables.eval_table(result.metrics))
        for value, group in result.metrics.get("by", {}).get("groups", {}).items():
            stdout.print(tables.eval_table(group, title=f"{by} = {value}"))
        if json_path is not None:
            _write_json(json_path, result.metrics)
        if report is not None:
            from clef_cli.quality.report import write_report

            write_report(report, result.metrics, result.labelled.questions, bins, target_accuracy)
        return EXIT_OK

    raise typer.Exit(run_guarded(verbose, body))


@app.command("calibrate")
def calibrate(
    scored: Annotated[Path, typer.Argument(help="Parquet written by `clef score` (wide or long layout).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Calibration file to write (JSON).")],
    gold: GoldOption = None,
    gold_column: GoldColumnOption = None,
    method: Annotated[
        str,
        typer.Option("--method", help="auto (by 5-fold cross-fitted log loss), global, type or question."),
    ] = "auto",
    bins: BinsOption = 15,
    verbose: VerboseOption = False,
) -> None:
    """Fit temperature scaling (p = softmax(logit / T)) to gold labels; apply it with
    `clef score --calibration` or `clef eval --calibration`.

    \b
    Examples:
      clef calibrate out.parquet --gold sample_data/posts_gold.jsonl -o cal.json
      clef score sample_data/posts.jsonl -q sample_data/questions.json -o c.parquet \\
        --checkpoint out.parquet.ckpt --calibration cal.json
    """

    def body() -> int:
        from clef_cli.quality import jobs, tables

        inputs = jobs.read_inputs(scored, gold, gold_column)
        tables.print_problems(stderr, inputs.gold.problems)
        run, _ = jobs.run_calibrate(inputs, method, bins)
        stdout.print(tables.calibrate_table(run))
        if not run.improved:
            stdout.print(f"{method}: calibration does not improve the cross-fitted log loss", markup=False)
        stdout.print(tables.temperatures_line(run), markup=False)
        _write_json(output, run.calibration.as_json())
        return EXIT_OK

    raise typer.Exit(run_guarded(verbose, body))


# ----------------------------------------------------------------------------- checkpoint

checkpoint_app = typer.Typer(help="Inspect job checkpoints.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(checkpoint_app, name="checkpoint")


@checkpoint_app.command("info")
def checkpoint_info(
    directory: Annotated[Path, typer.Argument(help="A checkpoint folder (OUTPUT.parquet.ckpt).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    verbose: VerboseOption = False,
) -> None:
    """Show a checkpoint: records done, size on disk, the model and the settings it was made with."""

    def body() -> None:
        from clef_cli.checkpoint import Checkpoint
        from clef_cli.pipeline import human_size

        info = Checkpoint.open_existing(directory).info()
        if as_json:
            sys.stdout.write(json.dumps(info, indent=2) + "\n")
            return
        stdout.print(f"checkpoint: {info['path']}")
        stdout.print(
            f"records done: {info['records_done']} in {info['shards']} shards "
            f"({info['shards_with_hidden_states']} with hidden states)"
        )
        stdout.print(f"size on disk: {human_size(info['size_bytes'])}")
        stdout.print(f"model: {info['model'].get('id')}")
        for key, value in sorted(info["settings"].items()):
            stdout.print(f"{key}: {json.dumps(value)}")
        for item in info["inputs"]:
            stdout.print(f"input: {item['path']} ({item['bytes']} bytes)")

    run_guarded(verbose, body)


# ----------------------------------------------------------------------------- train-head

EXIT_GATE_REFUSED = 4


class TrainHeadProgress:
    """One bar over every epoch of every fold and of the final run (terminal), or one line per
    finished run (otherwise); stage lines always."""

    def __init__(self, enabled: bool, total_epochs: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.enabled = enabled
        self.live = enabled and stderr.is_terminal
        self._bar = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=stderr, disable=not self.live,
        )  # fmt: skip
        self._task = self._bar.add_task("training", total=total_epochs)
        if self.live:
            self._bar.start()

    def stage(self, message: str) -> None:
        if self.enabled:
            self._bar.console.print(message, style="bold", markup=False)

    def epoch(self, run: str, epoch: int, epochs: int, loss: float) -> None:
        if self.live:
            self._bar.update(self._task, advance=1, description=f"{run} epoch {epoch + 1}/{epochs} loss {loss:.4f}")
        elif self.enabled and epoch + 1 == epochs:
            stderr.print(f"  {run}: {epochs} epochs, final training loss {loss:.4f}", markup=False)

    def stop(self) -> None:
        self._bar.stop()


def _print_gate(report: dict[str, Any]) -> None:
    held = report["held_out"]
    from rich import box

    base, trained = held["base"], held["trained"]
    table = Table(title="held-out (k-fold cross-fitted)", title_justify="left", box=box.SIMPLE)
    for column in ("", "base head", "trained head"):
        table.add_column(column, no_wrap=True)
    with_ci = lambda row, name: f"{row[name]:.4f} [{row[name + '_ci95'][0]:.4f}, {row[name + '_ci95'][1]:.4f}]"  # noqa: E731
    table.add_row("log loss (95% CI)", with_ci(base, "log_loss"), with_ci(trained, "log_loss"))
    table.add_row("Brier (95% CI)", with_ci(base, "brier"), with_ci(trained, "brier"))
    table.add_row("accuracy", f"{base['accuracy']:.3f}", f"{trained['accuracy']:.3f}")
    for question, value in base["accuracy_by_question"].items():
        table.add_row(f"  {question}", f"{value:.3f}", f"{trained['accuracy_by_question'][question]:.3f}")
    stderr.print(table)
    difference = held["log_loss_difference"]
    gate = report["gate"]
    verdict = "passed" if gate["passed"] else ("failed, written anyway (--force)" if gate["forced"] else "failed")
    stderr.print(
        f"{report['gold']['records']} gold records; held-out log loss difference (trained - base) "
        f"{difference['mean']:+.4f}, 95% CI [{difference['ci95'][0]:+.4f}, {difference['ci95'][1]:+.4f}]: "
        f"gate {verdict}",
        markup=False,
    )


@app.command("train-head")
def train_head_command(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint of a `clef score` job run with hidden states kept.")],
    gold: Annotated[Path, typer.Option("--gold", help="Gold labels (JSONL, JSON, CSV or Parquet; as clef eval).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for the trained head (release layout).")],
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="Release the job was scored with (default: from the checkpoint)."),
    ] = None,
    revision: RevisionOption = None,
    base_head: Annotated[
        Path | None, typer.Option("--base-head", help="Head folder to start from and beat (default: the release's).")
    ] = None,
    epochs: Annotated[int, typer.Option("--epochs", min=1, help="Passes over the training records.")] = 10,
    lr: Annotated[float, typer.Option("--lr", min=0.0, help="Peak AdamW learning rate (warm-up, then cosine).")] = 5e-5,
    batch_tokens: Annotated[
        int, typer.Option("--batch-tokens", min=1, help="Padded tokens per training batch (length-sorted batches).")
    ] = 16384,
    label_smoothing: Annotated[
        float, typer.Option("--label-smoothing", min=0.0, max=0.99, help="Label smoothing of the cross-entropy.")
    ] = 0.05,
    brier_weight: Annotated[float, typer.Option("--brier-weight", min=0.0, help="Weight of the Brier term.")] = 1.0,
    folds: Annotated[int, typer.Option("--folds", min=2, help="Folds of the held-out gate (split by record).")] = 5,
    seed: Annotated[int, typer.Option("--seed", help="Seed of folds, batch order and bootstrap.")] = 0,
    device: Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")] = "auto",
    force: Annotated[bool, typer.Option("--force", help="Write the head even when the gate fails.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress on stderr.")] = False,
    verbose: VerboseOption = False,
) -> None:
    """Fit the joint head to your gold labels from a checkpoint's stored hidden states (the
    thinker never runs), gated by k-fold held-out proof: HEAD_DIR is written only when the
    held-out log loss beats the base head's with a bootstrap 95% interval of the difference below
    zero; otherwise the numbers are printed and the exit code is 4 (--force writes anyway).

    Examples:

    \b
      clef score records.jsonl -o out.parquet
      clef train-head out.parquet.ckpt --gold gold.jsonl -o my-head
      clef train-head out.parquet.ckpt --gold gold.jsonl -o my-head --epochs 20 --lr 1e-4 --folds 10
      clef score records.jsonl -o out2.parquet --checkpoint out.parquet.ckpt --rehead my-head
    """

    def body() -> int:
        from clef_cli.quality.head_training import FitSettings
        from clef_cli.quality.train_head import GateRefused, TrainHeadSettings, train_head

        settings = TrainHeadSettings(
            checkpoint=checkpoint,
            gold=gold,
            output=output,
            model=model,
            base_head=base_head,
            revision=revision,
            fit=FitSettings(
                epochs=epochs,
                lr=lr,
                batch_tokens=batch_tokens,
                label_smoothing=label_smoothing,
                brier_weight=brier_weight,
            ),
            folds=folds,
            seed=seed,
            device=device,
            force=force,
        )
        progress = TrainHeadProgress(enabled=not quiet, total_epochs=epochs * (folds + 1))
        try:
            result = train_head(settings, progress)
        except GateRefused as refused:
            progress.stop()
            _print_gate(refused.report)
            stderr.print(f"error: {refused}", markup=False)
            return EXIT_GATE_REFUSED
        finally:
            progress.stop()
        _print_gate(result.report)
        stderr.print(f"wrote {output} ({result.report['new_head']['parameters']} parameters)", markup=False)
        return EXIT_OK

    raise typer.Exit(run_guarded(verbose, body))


# ----------------------------------------------------------------------------- inspect-spans


@app.command("inspect-spans")
def inspect_spans(
    record_file: Annotated[
        str, typer.Argument(help="A JSONL, JSON or Parquet file of records (a local path or a URI).")
    ],
    model: ModelOption = "Cloudflare/clef-omni",
    revision: RevisionOption = None,
    index: Annotated[int | None, typer.Option("--index", "-i", min=0, help="Record position (0-based).")] = None,
    record_id: Annotated[str | None, typer.Option("--id", help="Record id (instead of --index).")] = None,
    max_length: MaxLengthOption = None,
    on_overflow: OverflowOption = "truncate",
    struct_nulls: StructNullsOption = StructNulls.refuse,
    questions: QuestionsOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON (with input_ids).")] = False,
    max_image_pixels: MaxImagePixelsOption = DEFAULT_LIMITS.max_image_pixels,
    max_audio_seconds: MaxAudioSecondsOption = DEFAULT_LIMITS.max_audio_seconds,
    max_video_seconds: MaxVideoSecondsOption = DEFAULT_LIMITS.max_video_seconds,
    max_file_bytes: MaxFileBytesOption = "256M",
    allow_remote_media: AllowRemoteOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Show how one record is encoded: the prompt with question and option spans highlighted,
    a table of every span and the token totals. Loads only the tokenizer and processor files,
    never the weights."""

    def body() -> None:
        from clef_cli.families import family_of
        from clef_cli.prompt import PromptEncoder
        from clef_cli.readers import load_questions_file
        from clef_cli.records import InvalidRecord
        from clef_cli.release import load_processor, resolve_release
        from clef_cli.spans import span_report

        if index is not None and record_id is not None:
            raise UsageError("give --index or --id, not both")
        limits = media_limits(
            max_image_pixels, max_audio_seconds, max_video_seconds, max_file_bytes, allow_remote_media
        )
        policy = overflow_policy(on_overflow)
        schema = load_questions_file(questions) if questions else None
        record = _select_record(record_file, schema, index, record_id, struct_nulls)
        if isinstance(record, InvalidRecord):
            raise ClefError(record.error)
        release = resolve_release(model, revision=revision, with_weights=False, require_head=False)
        processor = load_processor(release)
        family = family_of(release)
        encoder = PromptEncoder(processor, max_length=max_length, overflow=policy, limits=limits, family=family)
        try:
            encoded = encoder.encode(record)
        except RecordError as error:
            raise ClefError(str(error)) from None
        report = span_report(encoded, processor.tokenizer)
        if as_json:
            sys.stdout.write(json.dumps(report, ensure_ascii=False) + "\n")
        else:
            _print_span_view(encoded, processor.tokenizer, report)

    run_guarded(verbose, body)


def _select_record(
    path: str, schema: Any, index: int | None, record_id: str | None, struct_nulls: StructNulls
) -> Any:
    from clef_cli.readers import read_records

    wanted_index = 0 if index is None and record_id is None else index
    for record in read_records([path], questions=schema, struct_nulls=struct_nulls):
        if record_id is not None and record.id == record_id:
            return record
        if wanted_index is not None and record.index == wanted_index:
            return record
    if record_id is not None:
        raise UsageError(f"no record with id {record_id!r} in {path}")
    raise UsageError(f"{path} has no record at index {wanted_index}")


QUESTION_STYLES = ("bold magenta", "bold cyan", "bold yellow", "bold blue")
OPTION_STYLES = ("black on green", "black on bright_yellow", "black on bright_cyan", "black on bright_magenta")


def _print_span_view(encoded: Any, tokenizer: Any, report: dict[str, Any]) -> None:
    from clef_cli.spans import prompt_pieces

    prompt = Text()
    for piece in prompt_pieces(encoded, tokenizer):
        if piece.kind == "question":
            prompt.append(piece.text, style=f"{QUESTION_STYLES[piece.question % len(QUESTION_STYLES)]} underline")
        elif piece.kind == "option":
            prompt.append(piece.text, style=OPTION_STYLES[piece.option % len(OPTION_STYLES)])
        elif piece.kind == "media":
            prompt.append(piece.text, style="bold red")
        else:
            prompt.append(piece.text, style="dim")
    stdout.rule(f"record {report['id']} (index {report['index']})")
    stdout.print(prompt)
    stdout.rule("spans")
    table = Table(show_lines=False)
    for column in ("question", "option", "tokens", "count", "text"):
        table.add_column(column, overflow="fold")
    for q, question in enumerate(report["questions"]):
        style = QUESTION_STYLES[q % len(QUESTION_STYLES)]
        start, end = question["question_span"]
        table.add_row(
            Text(question["question_id"], style=style),
            Text(f"({question['type']})", style="dim"),
            f"[{start}, {end})",
            str(question["tokens"]),
            Text(question["text"]),
        )
        for o, option in enumerate(question["options"]):
            start, end = option["span"]
            table.add_row(
                "",
                Text(option["option_id"], style=OPTION_STYLES[o % len(OPTION_STYLES)]),
                f"[{start}, {end})",
                str(option["tokens"]),
                Text(option["text"]),
            )
    stdout.print(table)
    for question in report["questions"]:
        if question["ignored_criteria"]:
            ignored = ", ".join(question["ignored_criteria"])
            stdout.print(f"[yellow]{question['question_id']}: criteria keys ignored: {ignored}[/yellow]")
    media = report["media_tokens"]
    stdout.print(
        f"prompt tokens: {report['prompt_tokens']} of max length {report['max_length']}\n"
        f"media tokens: image {media['image']}, audio {media['audio']}, video {media['video']}"
        f"{' (audio in video)' if report['use_audio_in_video'] else ''}\n"
        f"state tokens: {report['state_tokens']} kept, {report['state_tokens_cut']} cut"
    )


RAY_ADDRESS_PREFIXES = ("ray://", "auto", "local", "http://", "https://")


def _ray_argv(argv: list[str]) -> list[str]:
    """`--ray [ADDRESS]`: an optional value, which Typer options cannot express, becomes
    `--ray --ray-address ADDRESS` when the next word looks like an address."""
    rewritten: list[str] = []
    words = iter(range(len(argv)))
    for position in words:
        word = argv[position]
        if word.startswith("--ray="):
            rewritten += ["--ray", "--ray-address", word.split("=", 1)[1]]
            continue
        rewritten.append(word)
        if word == "--ray" and position + 1 < len(argv):
            following = argv[position + 1]
            host_port = ":" in following and "/" not in following and not following.startswith("-")
            if following.startswith(RAY_ADDRESS_PREFIXES) or host_port:
                rewritten += ["--ray-address", following]
                next(words)
    return rewritten


def main() -> None:
    """Console-script entry point."""
    app(args=_ray_argv(sys.argv[1:]), prog_name="clef")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
