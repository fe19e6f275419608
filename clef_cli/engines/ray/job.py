"""`clef score --ray`: the same scorer on a Ray Data actor pool, across GPUs and machines.

Ray Data reads the inputs in parallel tasks (Parquet row groups, JSONL byte ranges; local paths
or URIs that pyarrow's filesystems understand), each row carrying its global record index. An
actor pool (the model loaded once per actor) validates, encodes and scores each block in
length-sorted token-budget batches, exactly as the single-process job does. The driver commits
every returned block to the job's checkpoint, so a rerun skips what is done, and writes the same
Parquet output as the single-process path, in input order.

Nothing imports Ray unless this module is used (`pip install "clef-cli[ray]"`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from clef_cli import faults
from clef_cli.choices import DEFAULT_BLOCK_RECORDS
from clef_cli.engines.choice import local_engine
from clef_cli.engines.ray.actor import ENGINE_VERSION, ScoreActor
from clef_cli.engines.ray.hidden import check_every_node_sees, commit_block
from clef_cli.engines.ray.logs import RAY_LOG, ray_output_to
from clef_cli.engines.ray.reading import Slice, plan_slices, read_slice
from clef_cli.engines.ray.resources import (
    DATA_TASK_CPUS,
    ActorResources,
    alive_nodes,
    check_engine_gpus,
    fit_actors,
)
from clef_cli.engines.ray.watchdog import DEFAULT_STALL_TIMEOUT, Stalled, Watched, waiting_for
from clef_cli.errors import ClefError, RecordError
from clef_cli.inputs.parquet_rows import RECORD_COLUMNS
from clef_cli.inputs.readers import read_limits
from clef_cli.inputs.seen_ids import SeenIds
from clef_cli.job.lifecycle import open_job
from clef_cli.job.output import passthrough_types
from clef_cli.job.plan import JobPlan, plan_job
from clef_cli.job.settings import ScoreSettings
from clef_cli.job.summary import JobSummary
from clef_cli.model.backbone import resolve_dtype
from clef_cli.progress import Progress
from clef_cli.results import RESULT_SCHEMA
from clef_cli.store.checkpoint import Checkpoint
from clef_cli.store.keep_policy import DROP, KeepPolicy
from clef_cli.store.ledger import ToRun


@dataclass
class RaySettings:
    address: str | None = None
    """A Ray cluster address; None starts (or joins) a local one."""
    num_workers: int = 1
    gpus_per_worker: float = 0.0
    cpus_per_worker: float | None = None
    """None: share the CPUs that Ray Data's read tasks leave (at most one per actor)."""
    block_records: int = DEFAULT_BLOCK_RECORDS
    """Records handed to an actor at a time (each block is length-sorted into batches)."""
    stall_timeout: float = DEFAULT_STALL_TIMEOUT
    """Seconds without a block back from the actors before the job stops itself (exit 1)."""
    quiet: bool = False
    """Send Ray's own output to ray.log in the checkpoint folder instead of stderr."""


# ----------------------------------------------------------------------------- the driver

INLINE_LIMIT = "RAY_max_direct_call_object_size"
"""Ray's setting: task results up to this many bytes go inline to their owner, the driver."""
READ_INLINE_BYTES = 8 << 10
ACTOR_INLINE_BYTES = 100 << 10
"""Ray's default, kept for the actors' scored blocks, which the driver commits as they come."""


def job_runtime_env() -> dict[str, Any]:
    """The runtime environment of every task of a `--ray` job. Ray Data reads and re-blocks the
    input ahead of the actors, and the driver owns every block; with Ray's default every waiting
    block of short records sat inline in the driver's heap, so its memory grew with the job (1M
    text records: ~210 MiB). Above 8 KiB they wait in the object store, which is bounded and
    spills to disk. The actors keep Ray's default (`actor_inline_env`): a scored block read from the
    object store would map its pages into the driver (1M records: 137 MiB of shared pages)."""
    return {"env_vars": {INLINE_LIMIT: str(READ_INLINE_BYTES)}}


def actor_inline_env() -> dict[str, str]:
    return {INLINE_LIMIT: str(ACTOR_INLINE_BYTES)}


def _connect(address: str | None) -> bool:
    """Join (or start) the cluster; True when this call started Ray, so the job shuts it down."""
    import logging

    import ray

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # clef draws its own progress; Ray's would interleave
    context.enable_auto_log_stats = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    if ray.is_initialized():
        return False
    try:
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=False,
            ignore_reinit_error=True,
            runtime_env=job_runtime_env(),
        )
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise ClefError(f"cannot reach the Ray cluster {address or '(local)'}: {error}") from None
    return True


def actor_error(error: Exception) -> str:
    """The one line that says why a Ray task or actor failed, for a cron job's stderr: Ray's
    message carries the whole remote traceback (and Ray Data's advice after it); the line that
    matters is clef's own error (its message says it all), else the last exception line."""
    lines = [line for line in str(error).splitlines() if line.strip() and not line.startswith(" ")]
    clef = [line.split(": ", 1)[1] for line in lines if line.startswith("clef_cli.") and ": " in line]
    raised = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b[^ ]*: ", line)]
    own = [line for line in raised if not line.startswith("ray.")]  # the cause, not Ray's wrapper
    return (clef or own or raised or lines or [type(error).__name__])[-1]


def mark_duplicates(results: Iterable[pa.Table]) -> Iterator[pa.Table]:
    """Records whose id an earlier record already used become errors, as in a local run: the
    rows in input order, a chunk at a time (the ids seen are bounded in memory: `SeenIds`)."""
    seen = SeenIds()
    try:
        for chunk in results:
            duplicates: dict[int, str] = {}
            ids, indices = chunk.column("id").to_pylist(), chunk.column("record_index").to_pylist()
            for record_id, index in zip(ids, indices, strict=True):
                if record_id is None:  # a record whose id cannot be read: its row's id is null
                    continue
                first = seen.first_use(record_id, index)
                if first is not None:
                    error = RecordError(record_id, "id", f"duplicate record id (first used by record {first})")
                    duplicates[index] = str(error)
            yield _marked(chunk, duplicates) if duplicates else chunk
    finally:
        seen.close()


def _marked(chunk: pa.Table, duplicates: dict[int, str]) -> pa.Table:
    empty = {"prompt_tokens": None, "state_tokens_cut": None, "answers": None}
    rows = [
        {**row, **empty, "error": duplicates[row["record_index"]]} if row["record_index"] in duplicates else row
        for row in chunk.to_pylist()
    ]
    return pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)


class RayScoreJob:
    """The driver of a `--ray` run: plan slices, stream blocks through the actors, commit, write."""

    def __init__(
        self,
        settings: ScoreSettings,
        ray_settings: RaySettings,
        progress: Progress | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.settings = settings
        self.ray_settings = ray_settings
        self.progress = progress or Progress()
        self.stop = stop or threading.Event()
        self.summary = JobSummary(output=settings.output)
        self.keep = KeepPolicy(settings.hidden_states)
        check_engine_gpus(ray_settings.gpus_per_worker, settings.vllm.tensor_parallel_size if settings.vllm else None)
        self.engine = local_engine(settings)
        """The engine's start-up checks run here; its scorer is built in each actor (actor.py)."""
        self.engine_version = ""
        """The version of the engine the actors ran (vLLM's), from the blocks they return."""

    def run(self) -> JobSummary:
        device = torch.device("cuda" if self.ray_settings.gpus_per_worker else "cpu")
        dtype = str(resolve_dtype(self.settings.dtype, device)).removeprefix("torch.")
        plan = plan_job(self.settings, self.engine.preflight, progress=self.progress)
        with open_job(plan, self.progress, dtype, stop=self.stop) as job:
            settings = self.settings = job.settings
            self.summary = job.summary
            passthrough = (
                passthrough_types(job.plan.sources, settings.keep_columns, settings.limit)
                if settings.keep_columns
                else None
            )
            if job.ledger.counts.run:
                self.keep = job.keep_policy()
                self._on_cluster(job.checkpoint, job.ledger.to_run, job.plan)
            # a stop request, before or while it writes: interrupted instead
            return job.finish(mark_duplicates(job.results()), self._engine_metadata(), passthrough)

    def _engine_metadata(self) -> dict[str, str]:
        """`clef.engine`: ray (the HF engine's actors, as before there was a choice), else ray+ENGINE
        with `clef.ENGINE_version`, the version the actors ran ("" when none ran)."""
        engine = self.settings.engine
        if engine == "hf":
            return {"clef.engine": "ray"}
        return {"clef.engine": f"ray+{engine}", f"clef.{engine}_version": self.engine_version}

    def _on_cluster(self, checkpoint: Checkpoint, to_run: ToRun, plan: JobPlan) -> None:
        """Connect, fit the plan to the cluster, score; Ray's output in ray.log when quiet."""
        import ray

        settings, cluster = self.settings, self.ray_settings
        log = checkpoint.path / RAY_LOG if cluster.quiet else None
        with ray_output_to(log):
            started_ray = _connect(cluster.address)
            try:
                actors = fit_actors(
                    alive_nodes(), cluster.num_workers, cluster.cpus_per_worker, cluster.gpus_per_worker
                )
                if settings.hidden_states != DROP and checkpoint.needs_shared_disk:
                    check_every_node_sees(checkpoint.shards_path)
                slices = plan_slices(list(plan.sources), settings.limit)
                self.progress.start(len(to_run), len(to_run) - to_run.count)
                self._stream(ray, slices, checkpoint, to_run, plan.questions, actors)
            except (ray.exceptions.ActorDiedError, ray.exceptions.RayTaskError) as error:  # its start, a dead worker
                died = isinstance(error, ray.exceptions.ActorDiedError)
                what = "a scoring actor died" if died else "a Ray task failed"
                raise ClefError(f"{what}: {actor_error(error)}; {self._kept(checkpoint, log)}") from None
            except Stalled as error:
                raise Stalled(f"{error}; {self._kept(checkpoint, log)}") from None
            finally:
                if started_ray:
                    ray.shutdown()
                self.engine.close()  # vLLM: the files of actors Ray killed on this node go too

    def _kept(self, checkpoint: Checkpoint, log: Path | None) -> str:
        """What a failed run leaves, and what to do."""
        where = f" (Ray's log: {log})" if log else ""
        return (
            f"the {self.summary.committed} records committed this run are kept in {checkpoint.path}; "
            f"rerun the same command to continue{where}"
        )

    def _stream(
        self,
        ray: Any,
        slices: list[Slice],
        checkpoint: Checkpoint,
        to_run: ToRun,
        questions: Any,
        actors: ActorResources,
    ) -> None:
        """Only the records the driver's ledger marks (stored keys and duplicates filtered out)
        are read and dispatched; the read tasks get one byte per record saying which."""
        settings, cluster = self.settings, self.ray_settings
        done = to_run.done_bytes()
        hidden_dir = checkpoint.hidden_target if settings.hidden_states != DROP else None
        arguments = {"settings": settings, "questions": questions, "hidden_dir": hidden_dir, "keep": self.keep}
        env = actor_inline_env() | faults.ray_env() | self.engine.actor_env()
        dataset = (
            ray.data.from_items([slice.__dict__ for slice in slices])
            .flat_map(
                read_slice,
                fn_kwargs={
                    "done": done,
                    "limit": settings.limit,
                    "struct_nulls": settings.struct_nulls,
                    "nested": settings.columns.nested_columns if settings.columns else RECORD_COLUMNS,
                    "limits": read_limits(settings.read_limits, settings.columns),
                },
                num_cpus=DATA_TASK_CPUS,
            )
            .repartition(target_num_rows_per_block=cluster.block_records)  # spread blocks over the actors
            .map_batches(
                ScoreActor,
                fn_constructor_kwargs=arguments | {"log_dir": str(checkpoint.path.resolve())},
                batch_size=cluster.block_records,
                batch_format="pyarrow",
                compute=ray.data.ActorPoolStrategy(size=cluster.num_workers),
                num_gpus=actors.gpus,
                num_cpus=actors.cpus,
                runtime_env={"env_vars": env},
            )
        )
        batches = dataset.iter_batches(batch_format="pyarrow", batch_size=None)
        blocks = Watched(batches, cluster.stall_timeout, waiting_for)
        try:
            self._commit_blocks(blocks, checkpoint)
        finally:
            blocks.close()

    def _commit_blocks(self, blocks: Watched[pa.Table], checkpoint: Checkpoint) -> None:
        for block in blocks:
            if block.num_rows == 0:
                continue
            self.engine_version = block.column(ENGINE_VERSION)[0].as_py() or self.engine_version
            block = block.drop_columns([ENGINE_VERSION])
            commit_block(checkpoint, block)
            faults.after_commit()
            self.summary.committed += block.num_rows
            failed = block.num_rows - block.column("error").null_count
            scored = block.num_rows - failed
            self.summary.forwarded += scored
            self.summary.failed += failed
            tokens = sum(value or 0 for value in block.column("prompt_tokens").to_pylist())
            self.summary.tokens += tokens
            self.progress.advance(block.num_rows, tokens, failed)
            if self.stop.is_set():
                return
