"""Fit a `--ray` plan to the cluster before any work, so a job can never wait forever for CPUs or
GPUs that its own actors hold.

Ray Data's read and re-blocking tasks each take one CPU while the scoring actors hold theirs for
the whole job. If the actors take every CPU, the reads are never scheduled and the job hangs
silently. So one CPU stays free for Ray Data; the actors share the rest (at most one CPU each
unless `--cpus-per-worker` says otherwise), and a plan that cannot fit is refused in one line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from clef_cli.errors import UsageError

DATA_TASK_CPUS = 1.0
"""CPUs kept free for Ray Data's read and re-blocking tasks (each asks for one CPU)."""
EPSILON = 1e-9


@dataclass(frozen=True)
class ActorResources:
    """What each scoring actor asks Ray for."""

    cpus: float
    gpus: float


def fit_actors(
    nodes: Sequence[dict[str, float]], num_workers: int, cpus_per_worker: float | None, gpus_per_worker: float
) -> ActorResources:
    """The per-actor CPUs and GPUs for `num_workers` actors on nodes with these resources, or a
    UsageError naming the numbers and the fix. `cpus_per_worker=None` fits the actors into the
    CPUs left after Ray Data's share (at most one each)."""
    total_cpus = sum(node.get("CPU", 0.0) for node in nodes)
    total_gpus = sum(node.get("GPU", 0.0) for node in nodes)
    if gpus_per_worker > 0:
        slots = sum(math.floor(node.get("GPU", 0.0) / gpus_per_worker + EPSILON) for node in nodes)
        if slots < num_workers:
            raise UsageError(
                f"the Ray plan needs {num_workers} actors x {gpus_per_worker:g} GPU, but the cluster has "
                f"{total_gpus:g} GPUs (room for {slots} actors); use --ray-actors {max(slots, 1)}"
                + (" or a smaller --gpus-per-worker" if slots else ", or --gpus-per-worker 0 to run on CPUs")
            )
    spare = total_cpus - DATA_TASK_CPUS
    if cpus_per_worker is None:
        if spare < -EPSILON:
            raise UsageError(
                f"the Ray cluster has {total_cpus:g} CPUs; Ray Data's read tasks need {DATA_TASK_CPUS:g} "
                "(add a node with CPUs, or run without --ray)"
            )
        cpus_per_worker = round(min(1.0, max(spare, 0.0) / num_workers), 4)
    needed = num_workers * cpus_per_worker + DATA_TASK_CPUS
    if needed > total_cpus + EPSILON:
        fitting = math.floor(max(spare, 0.0) / cpus_per_worker + EPSILON) if cpus_per_worker else num_workers
        fixes = [f"--ray-actors {fitting}"] if fitting >= 1 else []
        fixes.append(f"--cpus-per-worker {max(spare, 0.0) / num_workers:.3g}")
        fixes.append("no --cpus-per-worker (fit automatically)")
        raise UsageError(
            f"the Ray plan needs {num_workers} actors x {cpus_per_worker:g} CPU + {DATA_TASK_CPUS:g} CPU for Ray "
            f"Data's read tasks = {needed:g} CPUs, but the cluster has {total_cpus:g}; it would wait forever. "
            f"Use {' or '.join(fixes)}"
        )
    if not any(
        node.get("CPU", 0.0) + EPSILON >= cpus_per_worker and node.get("GPU", 0.0) + EPSILON >= gpus_per_worker
        for node in nodes
    ):
        raise UsageError(
            f"no Ray node has {cpus_per_worker:g} CPUs and {gpus_per_worker:g} GPUs for one actor; "
            "lower --cpus-per-worker or --gpus-per-worker"
        )
    return ActorResources(cpus=cpus_per_worker, gpus=gpus_per_worker)


def check_engine_gpus(gpus_per_worker: float, tensor_parallel_size: int | None) -> None:
    """vLLM spans `--tensor-parallel-size` GPUs, all of them its actor's (its worker is a child of
    the actor, which Ray gives the GPUs): fewer would fail the load in every actor, so refuse it here.
    On CPUs (no GPU per actor) there is nothing to count."""
    if gpus_per_worker and tensor_parallel_size and gpus_per_worker < tensor_parallel_size:
        raise UsageError(
            f"--tensor-parallel-size {tensor_parallel_size} spans {tensor_parallel_size} GPUs of one actor, but "
            f"--gpus-per-worker is {gpus_per_worker:g}: use --gpus-per-worker {tensor_parallel_size} (the default "
            "with --engine vllm)"
        )


def alive_nodes() -> list[dict[str, float]]:
    """The resources of every alive node of the connected cluster."""
    import ray

    return [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]
