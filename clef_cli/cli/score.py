"""`clef score`: parse the options, refuse combinations that cannot work, run the engine the
options choose (local, Ray, or rehead), print the summary."""

from __future__ import annotations

import threading
import typing
from pathlib import Path
from typing import Any

import typer

from clef_cli.choices import (
    DEFAULT_BLOCK_RECORDS,
    DEFAULT_KEEP_BELOW,
    DEFAULT_KEEP_SAMPLE,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_SYNC_EVERY,
    DEFAULT_SYNC_FAILURE_LIMIT,
    DEFAULT_WINDOW,
    Engine,
    HiddenDtype,
    HiddenStates,
    Layout,
    OverflowPolicy,
    SpecialTokens,
)
from clef_cli.cli.console import stderr
from clef_cli.cli.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_RECORDS_FAILED
from clef_cli.cli.line_progress import DEFAULT_LOG_EVERY, LogEveryOption
from clef_cli.cli.media_options import with_media_limits
from clef_cli.cli.options import (
    PANEL_ENGINE,
    PANEL_RAY,
    ColumnsOption,
    DeviceOption,
    Dtype,
    MaxLengthOption,
    ModelOption,
    OverflowOption,
    QuestionsOption,
    RevisionOption,
    SpecialTokensOption,
    StateColumnsOption,
    StructNullsOption,
    parameter_source,
)
from clef_cli.cli.progress import job_progress, print_dry_run, print_summary
from clef_cli.cli.score_options import (
    AllowEmptyOption,
    BlockRecordsOption,
    CalibrationOption,
    CpuKvCacheOption,
    CpusPerWorkerOption,
    DryRunOption,
    EnforceEagerOption,
    EngineOption,
    GpuMemoryUtilizationOption,
    GpusPerWorkerOption,
    HiddenDtypeOption,
    HiddenStatesOption,
    InputsArgument,
    KeepBelowOption,
    KeepColumnsOption,
    KeepSampleOption,
    LayoutOption,
    LimitOption,
    MaxBatchSizeOption,
    MaxBatchTokensOption,
    MaxModelLenOption,
    MaxRecordBytesOption,
    Needs,
    OutputOption,
    RayActorsOption,
    RayAddressOption,
    RayOption,
    RestartOption,
    ScoreDtypeOption,
    ScoreQuietOption,
    StallTimeoutOption,
    StatsJsonOption,
    TensorParallelSizeOption,
    VerifyMediaOption,
    WindowOption,
    WorkersOption,
    ray_settings,
    score_settings,
)
from clef_cli.cli.stopping import STOPS
from clef_cli.cli.store_options import (
    CacheDirOption,
    CheckpointOption,
    ConfirmRestartOption,
    KeepStagedOutputOption,
    ReheadOption,
    SyncEveryOption,
    SyncFailureLimitOption,
)
from clef_cli.encoding.media import MediaLimits
from clef_cli.engines.ray.watchdog import DEFAULT_STALL_TIMEOUT
from clef_cli.errors import UsageError
from clef_cli.inputs.parquet_rows import StructNulls
from clef_cli.inputs.record_size import MAX_RECORD_BYTES
from clef_cli.job.settings import ScoreSettings
from clef_cli.locations.overlap import refuse_inside_store, refuse_overlap
from clef_cli.progress import Progress
from clef_cli.release import DEFAULT_MODEL


def refuse_impossible(ctx: typer.Context, ray: bool, rehead: Path | None, engine: Engine = Engine.hf) -> None:
    """Refuse, before any work, options that mean nothing in this run: Ray's without --ray (an
    address from RAY_ADDRESS alone is fine: Ray clusters set it for every process), vLLM's
    without --engine vllm, --keep-below and --keep-sample without --hidden-states selective, the
    keep policy's options with --rehead (it keeps every state it computes) and --rehead with --ray.
    --engine vllm with --rehead is fine: a rehead takes the store's own engine for the states it
    lacks, so --engine vllm there only says what the store holds; with --ray each actor runs vLLM."""
    params = {param.name: param for param in ctx.command.params}
    needs = option_needs()
    option = {name: param.opts[0] for name, param in params.items()}
    for name in ctx.params:
        if parameter_source(ctx, name) != "COMMANDLINE":
            continue
        panel = getattr(params[name], "rich_help_panel", None)
        if panel == PANEL_RAY and name != "ray" and not ray:
            raise UsageError(f"{option[name]} applies to Ray runs only: add --ray")
        if panel == PANEL_ENGINE and name != "engine" and engine is not Engine.vllm:
            raise UsageError(f"{option[name]} applies to the vLLM engine only: add --engine vllm")
        if Needs.no_rehead in needs.get(name, ()) and rehead is not None:
            raise UsageError(
                f"{option[name]} does not go with --rehead (a rehead reads the stored hidden states and keeps "
                f"those it computes): drop {option[name]}"
            )
        if Needs.selective in needs.get(name, ()) and ctx.params["hidden_states"] is not HiddenStates.selective:
            raise UsageError(f"{option[name]} applies to --hidden-states selective only: add --hidden-states selective")
    if ray and rehead is not None:
        raise UsageError("--rehead runs the head alone on stored hidden states: drop --ray")


def option_needs() -> dict[str, tuple[Needs, ...]]:
    """What each of score's options needs, as its `Annotated` alias says (`score_options.Needs`)."""
    hints = typing.get_type_hints(score, include_extras=True)
    return {name: tuple(m for m in typing.get_args(hint)[1:] if isinstance(m, Needs)) for name, hint in hints.items()}


def score(
    ctx: typer.Context,
    inputs: InputsArgument,
    output: OutputOption,
    model: ModelOption = DEFAULT_MODEL,
    revision: RevisionOption = None,
    questions: QuestionsOption = None,
    columns: ColumnsOption = None,
    state_columns: StateColumnsOption = None,
    max_length: MaxLengthOption = None,
    max_record_bytes: MaxRecordBytesOption = MAX_RECORD_BYTES,
    on_overflow: OverflowOption = OverflowPolicy.truncate,
    struct_nulls: StructNullsOption = StructNulls.refuse,
    special_tokens: SpecialTokensOption = SpecialTokens.text,
    max_batch_tokens: MaxBatchTokensOption = DEFAULT_MAX_BATCH_TOKENS,
    max_batch_size: MaxBatchSizeOption = DEFAULT_MAX_BATCH_SIZE,
    device: DeviceOption = "auto",
    dtype: ScoreDtypeOption = Dtype.auto,
    layout: LayoutOption = Layout.wide,
    keep_columns: KeepColumnsOption = None,
    limit: LimitOption = None,
    allow_empty: AllowEmptyOption = False,
    workers: WorkersOption = None,
    window: WindowOption = DEFAULT_WINDOW,
    checkpoint: CheckpointOption = None,
    cache_dir: CacheDirOption = None,
    sync_every: SyncEveryOption = DEFAULT_SYNC_EVERY,
    sync_failure_limit: SyncFailureLimitOption = DEFAULT_SYNC_FAILURE_LIMIT,
    keep_staged_output: KeepStagedOutputOption = False,
    hidden_states: HiddenStatesOption = HiddenStates.keep,
    keep_below: KeepBelowOption = DEFAULT_KEEP_BELOW,
    keep_sample: KeepSampleOption = DEFAULT_KEEP_SAMPLE,
    hidden_dtype: HiddenDtypeOption = HiddenDtype.bfloat16,
    restart: RestartOption = False,
    confirm_restart: ConfirmRestartOption = False,
    verify_media: VerifyMediaOption = False,
    rehead: ReheadOption = None,
    calibration: CalibrationOption = None,
    dry_run: DryRunOption = False,
    quiet: ScoreQuietOption = False,
    log_every: LogEveryOption = DEFAULT_LOG_EVERY,
    stats_json: StatsJsonOption = None,
    ray: RayOption = False,
    ray_address: RayAddressOption = None,
    ray_actors: RayActorsOption = 1,
    gpus_per_worker: GpusPerWorkerOption = None,
    cpus_per_worker: CpusPerWorkerOption = None,
    block_records: BlockRecordsOption = DEFAULT_BLOCK_RECORDS,
    stall_timeout: StallTimeoutOption = DEFAULT_STALL_TIMEOUT,
    engine: EngineOption = Engine.hf,
    max_model_len: MaxModelLenOption = None,
    gpu_memory_utilization: GpuMemoryUtilizationOption = None,
    tensor_parallel_size: TensorParallelSizeOption = None,
    cpu_kv_cache_gib: CpuKvCacheOption = None,
    enforce_eager: EnforceEagerOption = False,
    limits: MediaLimits | None = None,  # replaced by the five media-limit options (with_media_limits)
) -> None:
    """Score records into Parquet: one row per input record, in input order, with a probability
    for every option of every question. Prompts already in the checkpoint (a store keyed by
    prompt: an interrupted run, last night's table) are not run again.
    """
    refuse_impossible(ctx, ray, rehead, engine)
    settings = score_settings(ctx.params, limits)
    refuse_overlap("--stats-json", stats_json, settings.inputs)
    refuse_inside_store("--stats-json", [stats_json], settings.checkpoint)
    progress = job_progress(quiet, log_every, dry_run)
    if dry_run:
        return show_plan(settings, progress)
    if rehead is not None and parameter_source(ctx, "model") == "DEFAULT":
        settings.model = None  # the model the checkpoint names, as train-head takes it
    summary = run_engine(settings, ctx.params, progress, quiet=quiet or not stderr.is_terminal)
    if stats_json is not None:  # first: a reader that stops reading the summary must not cost the file
        summary.final_stats().write_json(stats_json)
    print_summary(summary, settings.layout)
    if summary.interrupted or STOPS.requested():  # a request as the job ended counts too
        raise typer.Exit(EXIT_INTERRUPTED)
    raise typer.Exit(EXIT_RECORDS_FAILED if summary.failed else EXIT_OK)


def show_plan(settings: ScoreSettings, progress: Progress) -> None:
    """--dry-run: validate and plan everything, print the plan, load no weights."""
    from clef_cli.engines.choice import local_engine

    report = local_engine(settings, progress).dry_run()
    progress.stop()
    print_dry_run(report, settings)


def run_engine(settings: ScoreSettings, options: dict[str, Any], progress: Progress, quiet: bool) -> Any:
    """The engine the options choose (rehead, Ray or local), stopping cleanly on Ctrl-C/SIGTERM:
    a request at any moment of the job is its summary's `interrupted` (cli/stopping.py)."""
    with STOPS.deferring() as stop:
        try:
            summary = _engine_run(settings, options, progress, quiet, stop)
        finally:
            progress.stop()
        if stop.is_set():
            summary.interrupted = True
        return summary


def _engine_run(
    settings: ScoreSettings, options: dict[str, Any], progress: Progress, quiet: bool, stop: threading.Event
) -> Any:
    if settings.rehead is not None:
        from clef_cli.engines.rehead import rehead

        return rehead(settings, progress, stop=stop)
    if options["ray"]:
        from clef_cli.engines.ray.job import RayScoreJob

        cluster = ray_settings(options, settings.device, quiet)
        return RayScoreJob(settings, cluster, progress, stop=stop).run()
    from clef_cli.engines.choice import local_engine

    return local_engine(settings, progress, stop=stop).run()


command = with_media_limits(score)
