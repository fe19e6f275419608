"""`clef score`'s own options, written once as `Annotated` aliases in groups (what to read and
write, how to batch, the checkpoint, Ray), and the builders that turn the parsed values into the
library's settings. The command itself only lists the aliases and calls the engine."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import Enum
from typing import Annotated, Any, TypeVar

import typer

from clef_cli.choices import Engine, HiddenDtype, HiddenStates, Layout
from clef_cli.cli.options import (
    PANEL_BATCHING,
    PANEL_ENGINE,
    PANEL_INPUTS,
    PANEL_OUTPUT,
    PANEL_RAY,
    PANEL_STORE,
    PATH_OR_URI,
    Dtype,
    read_location,
    size,
    writable_file_or_stdout,
    writable_location,
)
from clef_cli.encoding.media import MediaLimits
from clef_cli.errors import UsageError
from clef_cli.inputs.record_size import MAX_RECORD_BYTES
from clef_cli.job.settings import MIN_CPU_KV_CACHE_GIB, ScoreSettings, VllmOptions

T = TypeVar("T")

# What to read and write
InputsArgument = Annotated[
    list[str],
    typer.Argument(
        callback=read_location,
        help="JSONL, JSON, Parquet, CSV or TSV files (.jsonl.gz, .jsonl.zst, .csv.gz: compressed), "
        "folders of parts (Hive key=value folders too), quoted globs ('parts/*.parquet'), or - for "
        "JSONL or Parquet on stdin: local paths or URIs (file:///abs/path, s3://bucket/key, gs://..., anything "
        "pyarrow's filesystems open).",
    ),
]
OutputOption = Annotated[
    str,
    typer.Option(
        "--output",
        "-o",
        callback=writable_location,
        metavar=PATH_OR_URI,
        rich_help_panel=PANEL_OUTPUT,
        help="Output Parquet file (written atomically; a symlink's target, or streamed into a named pipe), "
        "or an object URI (s3://bucket/out/x.parquet: uploaded whole at the end; needs --checkpoint).",
    ),
]
LayoutOption = Annotated[
    Layout,
    typer.Option(
        "--layout",
        rich_help_panel=PANEL_OUTPUT,
        help="wide: one row per record; long: one row per record, question, label; flat: one row "
        "per record, a column per question's answer, confidence and option probability.",
    ),
]
KeepColumnsOption = Annotated[
    str | None,
    typer.Option(
        "--keep-columns", rich_help_panel=PANEL_OUTPUT, help="Input columns to pass through, comma-separated."
    ),
]
LimitOption = Annotated[
    int | None, typer.Option("--limit", min=1, rich_help_panel=PANEL_INPUTS, help="Score only the first N records.")
]
AllowEmptyOption = Annotated[
    bool,
    typer.Option(
        "--allow-empty",
        rich_help_panel=PANEL_INPUTS,
        help="Inputs with no record write an output of 0 rows (replacing the last one); without it they are "
        "refused (exit 2) and nothing is written, so a failed export never wipes yesterday's table.",
    ),
]
CalibrationOption = Annotated[
    str | None,
    typer.Option(
        "--calibration",
        callback=read_location,
        metavar=PATH_OR_URI,
        rich_help_panel=PANEL_OUTPUT,
        help="A `clef calibrate` file: probabilities, answers and confidences are written temperature-scaled "
        "(logits stay raw). Applied to the output only, so rerunning a finished job with another -o recalibrates "
        "it from the checkpoint without the model.",
    ),
]
StatsJsonOption = Annotated[
    str | None,
    typer.Option(
        "--stats-json",
        callback=writable_file_or_stdout,
        metavar=PATH_OR_URI,
        rich_help_panel=PANEL_OUTPUT,
        help="Write where the time went (stage seconds, model busy, tokens, records, padding waste, "
        "encode rates per modality) to this JSON file (- for stdout).",
    ),
]

# How to batch and run
MaxBatchTokensOption = Annotated[
    int,
    typer.Option(
        "--max-batch-tokens",
        min=1,
        rich_help_panel=PANEL_BATCHING,
        help="Padded tokens per forward (batch size x longest).",
    ),
]
MaxBatchSizeOption = Annotated[
    int, typer.Option("--max-batch-size", min=1, rich_help_panel=PANEL_BATCHING, help="Records per forward.")
]
ScoreDtypeOption = Annotated[
    Dtype, typer.Option("--dtype", rich_help_panel=PANEL_BATCHING, help="auto: bf16 on a GPU, fp32 on the CPU.")
]
WorkersOption = Annotated[
    int | None,
    typer.Option(
        "--workers",
        min=0,
        rich_help_panel=PANEL_BATCHING,
        help="Background processes that decode media and encode prompts for the model (0: inline). Default: "
        "none on the CPU; beside a GPU, every usable core but one, bounded by memory (see docs/scoring.md, "
        "Encoding workers). Not Ray's scoring actors: see --ray-actors.",
    ),
]
WindowOption = Annotated[
    int,
    typer.Option("--window", min=1, rich_help_panel=PANEL_BATCHING, help="Records planned and length-sorted together."),
]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Validate and plan everything, print the plan; load no weights.")
]
ScoreQuietOption = Annotated[
    bool,
    typer.Option("--quiet", "-q", help="No progress display; with --ray, Ray's own output goes to CHECKPOINT/ray.log."),
]


# The checkpoint (where it lives: cli/store_options.py)
class Needs(Enum):
    """What an option means nothing without, written beside it (`score.refuse_impossible` reads
    it): given without it, the option is refused before any work. Ray's and vLLM's options need
    --ray and --engine vllm by their section (PANEL_RAY, PANEL_ENGINE)."""

    selective = "selective"
    """--hidden-states selective."""
    no_rehead = "no rehead"
    """No --rehead: a rehead keeps every state it computes (`on_demand.states_settings`)."""


HiddenStatesOption = Annotated[
    HiddenStates,
    typer.Option(
        "--hidden-states",
        rich_help_panel=PANEL_STORE,
        help="keep: store every record's final hidden states (for --rehead and train-head); selective: only those "
        "of records less confident than --keep-below, plus a --keep-sample of the rest; drop: results only. "
        "Missing states are computed again when --rehead or train-head --records needs them.",
    ),
    Needs.no_rehead,
]
KeepBelowOption = Annotated[
    float,
    typer.Option(
        "--keep-below",
        rich_help_panel=PANEL_STORE,
        min=0.0,
        max=1.0,
        help="--hidden-states selective: keep the states of records whose confidence (as `clef review` orders: "
        "the least confident question's top probability) is below this.",
    ),
    Needs.selective,
    Needs.no_rehead,
]
KeepSampleOption = Annotated[
    float,
    typer.Option(
        "--keep-sample",
        rich_help_panel=PANEL_STORE,
        min=0.0,
        max=1.0,
        help="--hidden-states selective: and of this fraction of the rest, chosen by a hash of the record key "
        "(reruns choose alike).",
    ),
    Needs.selective,
    Needs.no_rehead,
]
HiddenDtypeOption = Annotated[
    HiddenDtype, typer.Option("--hidden-dtype", rich_help_panel=PANEL_STORE, help="Stored hidden-state precision.")
]
RestartOption = Annotated[
    bool, typer.Option("--restart", rich_help_panel=PANEL_STORE, help="Discard an existing checkpoint and start over.")
]
VerifyMediaOption = Annotated[
    bool,
    typer.Option(
        "--verify-media",
        rich_help_panel=PANEL_STORE,
        help="Hash every media file and object again to key it (objects are downloaded again), instead of "
        "trusting the checkpoint's cache of unchanged ones (a file's device, inode, size, mtime and ctime; an "
        "object's size and last-modified).",
    ),
]

# Ray (each needs --ray: its section, PANEL_RAY)
RayOption = Annotated[
    bool,
    typer.Option(
        "--ray",
        rich_help_panel=PANEL_RAY,
        help="Run on Ray Data across GPUs and machines (needs clef-cli[ray]): joins the cluster at "
        "--ray-address, or starts a local one; with --engine vllm each actor runs a vLLM worker of its own. "
        "The options below marked --ray need it.",
    ),
]
RayAddressOption = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        rich_help_panel=PANEL_RAY,
        envvar="RAY_ADDRESS",
        help="--ray: the cluster to join (ray://head:10001, auto, or local for a new local cluster).",
    ),
]
RayActorsOption = Annotated[
    int,
    typer.Option(
        "--ray-actors", min=1, rich_help_panel=PANEL_RAY, help="--ray: scoring actors, each with its own model copy."
    ),
]
GpusPerWorkerOption = Annotated[
    float | None,
    typer.Option(
        "--gpus-per-worker",
        min=0,
        rich_help_panel=PANEL_RAY,
        help="--ray: GPUs per actor (default with CUDA: 1, or --tensor-parallel-size with --engine vllm).",
    ),
]
CpusPerWorkerOption = Annotated[
    float | None,
    typer.Option(
        "--cpus-per-worker",
        min=0,
        rich_help_panel=PANEL_RAY,
        help="--ray: CPUs per actor (default: share what Ray Data's read tasks leave, at most 1 each).",
    ),
]
BlockRecordsOption = Annotated[
    int,
    typer.Option(
        "--block-records", min=1, rich_help_panel=PANEL_RAY, help="--ray: records handed to an actor at a time."
    ),
]
StallTimeoutOption = Annotated[
    float,
    typer.Option(
        "--stall-timeout",
        min=1,
        rich_help_panel=PANEL_RAY,
        help="--ray: stop (exit 1, everything committed kept) when no block comes back for this many seconds.",
    ),
]
# The engine (each vLLM option needs --engine vllm: its section, PANEL_ENGINE)
EngineOption = Annotated[
    Engine,
    typer.Option(
        "--engine",
        rich_help_panel=PANEL_ENGINE,
        help="hf: transformers in this process; vllm: vLLM as the backbone in its own environment "
        "($CLEF_VLLM_PYTHON, see docs/engines.md), clef's head on its hidden states; with --ray, one vLLM "
        "worker per actor.",
    ),
]
MaxModelLenOption = Annotated[
    int | None,
    typer.Option(
        "--max-model-len", min=1, rich_help_panel=PANEL_ENGINE, help="--engine vllm: longest prompt vLLM takes."
    ),
]
GpuMemoryUtilizationOption = Annotated[
    float | None,
    typer.Option(
        "--gpu-memory-utilization",
        min=0.01,
        max=1.0,
        rich_help_panel=PANEL_ENGINE,
        help="--engine vllm: share of GPU memory vLLM may take.",
    ),
]
TensorParallelSizeOption = Annotated[
    int | None,
    typer.Option(
        "--tensor-parallel-size",
        min=1,
        rich_help_panel=PANEL_ENGINE,
        help="--engine vllm: GPUs one model spans (with --ray: each actor's GPUs).",
    ),
]
CpuKvCacheOption = Annotated[
    int | None,
    typer.Option(
        "--cpu-kv-cache-gib",
        min=MIN_CPU_KV_CACHE_GIB,
        rich_help_panel=PANEL_ENGINE,
        help="--engine vllm on the CPU: KV-cache space in whole GiB.",
    ),
]
EnforceEagerOption = Annotated[
    bool,
    typer.Option(
        "--enforce-eager",
        rich_help_panel=PANEL_ENGINE,
        help="--engine vllm on a GPU: no compiled mode or CUDA graphs (the CPU build always runs eager).",
    ),
]

MaxRecordBytesOption = Annotated[
    int,
    typer.Option(
        "--max-record-bytes",
        parser=size,
        metavar="SIZE",
        show_default=f"{MAX_RECORD_BYTES >> 20}M",
        rich_help_panel=PANEL_INPUTS,
        help="Largest record read (bytes, or with K/M/G suffix): a bigger JSONL line, table cell or state is "
        "that record's error, read past without being held (so a .gz that inflates far costs nothing); a CSV "
        "row longer than this cannot be read.",
    ),
]


def folded(kind: type[T], options: Mapping[str, Any], **converted: Any) -> T:
    """`kind` (a settings dataclass) from the parsed options named as its fields, the values the
    CLI converts (`converted`) in their place: an option reaches the library by its name, with no
    list of names kept beside it, and a field no option names keeps the settings' own default."""
    names = {item.name for item in dataclasses.fields(kind) if item.init} - converted.keys()  # type: ignore[arg-type]
    return kind(**{name: options[name] for name in names & options.keys()}, **converted)


def score_settings(options: dict[str, Any], limits: MediaLimits | None) -> ScoreSettings:
    """The library's settings from the parsed options (Typer's `ctx.params`)."""
    from clef_cli.inputs.columns import parse_columns

    keep = tuple(name.strip() for name in (options["keep_columns"] or "").split(",") if name.strip())
    return folded(
        ScoreSettings,
        options,  # -o: a path, or an object's URI (`writable_location`)
        overflow=options["on_overflow"],
        limits=limits,
        dtype=None if options["dtype"] is Dtype.auto else options["dtype"].value,
        keep_columns=keep,
        columns=parse_columns(options["columns"], options["state_columns"]),
        vllm=folded(VllmOptions, options),
    )


def ray_settings(options: dict[str, Any], device: str, quiet: bool) -> object:
    """The Ray engine's settings; refuses at once when Ray is not installed."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UsageError('--ray needs Ray: pip install "clef-cli[ray]"') from None
    import torch

    from clef_cli.engines.ray.job import RaySettings

    gpus_per_worker = options["gpus_per_worker"]
    if gpus_per_worker is None:  # one model per actor: vLLM's spans --tensor-parallel-size GPUs
        per_model = (options["tensor_parallel_size"] or 1) if options["engine"] is Engine.vllm else 1
        gpus_per_worker = float(per_model) if device != "cpu" and torch.cuda.is_available() else 0.0
    address = options["ray_address"]
    return folded(
        RaySettings,
        options,
        address=None if address in (None, "local") else address,
        num_workers=options["ray_actors"],
        gpus_per_worker=gpus_per_worker,
        quiet=quiet,
    )
