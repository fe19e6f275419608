"""CPU time per stage of one `clef score` run, for bench_scale.py: each stage's own thread CPU
(`time.thread_time`, nested stages counted only in the innermost), so other load on the machine
and the other threads do not count in it.

Stages: read (records parsed from the input), key (the ledger: keying records against the
store, their reading excluded), plan (prompts planned and batched, their reading excluded),
forward (the simulated forward and the joint head), commit (shards written, the index updated,
waiting for the committer), output (the Parquet output from the store). The rest of the run's
process CPU (start-up, imports, untimed bookkeeping) is `other`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

STAGES = ("read", "key", "plan", "forward", "commit", "output")
CLEF_STAGES = {"forward": "forward", "head": "forward", "commit_wait": "commit", "output_write": "output"}
"""clef's own stats stages (clef_cli/stats.py) -> this benchmark's stage."""


class StageCpu:
    """Exclusive thread CPU seconds per stage, summed over every thread."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self._local = threading.local()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        stack = self._local.__dict__.setdefault("stack", [])
        started = time.thread_time()
        stack.append(0.0)
        try:
            yield
        finally:
            elapsed = time.thread_time() - started
            nested = stack.pop()
            with self._lock:
                self.seconds[name] += elapsed - nested
            if stack:
                stack[-1] += elapsed

    def wrap(self, function: Callable[..., Any], name: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.stage(name):
                return function(*args, **kwargs)

        return timed

    def iterate(self, items: Iterator[Any], name: str) -> Iterator[Any]:
        """`items`, each step timed as `name` (a generator's work happens in its next())."""
        iterator = iter(items)
        while True:
            with self.stage(name):
                try:
                    item = next(iterator)
                except StopIteration:
                    return
            yield item

    def install(self) -> None:
        """Time clef's stages by wrapping the functions that do them (this process only)."""
        import clef_cli.job.lifecycle as job
        from clef_cli.engines.local import executor, planning
        from clef_cli.engines.local.encode_pool import EncodePool
        from clef_cli.stats import JobStats
        from clef_cli.store.checkpoint import Checkpoint
        from clef_cli.store.ledger import Ledger

        read_records = job.read_records
        job.read_records = lambda *args, **kwargs: self.iterate(read_records(*args, **kwargs), "read")
        Ledger.build = self.wrap(Ledger.build, "key")
        EncodePool.plan = self.wrap(EncodePool.plan, "plan")
        EncodePool.encode = self.wrap(EncodePool.encode, "plan")
        executor.BatchExecutor.plan = self.wrap(executor.BatchExecutor.plan, "plan")
        windows = planning.planned_windows
        planning.planned_windows = lambda *args, **kwargs: self.iterate(windows(*args, **kwargs), "plan")
        import clef_cli.engines.local.pipeline as pipeline

        pipeline.planned_windows = planning.planned_windows
        Checkpoint.commit = self.wrap(Checkpoint.commit, "commit")
        stage = JobStats.stage

        @contextlib.contextmanager
        def timed_stage(stats: JobStats, name: str) -> Iterator[None]:
            with self.stage(CLEF_STAGES[name]) if name in CLEF_STAGES else contextlib.nullcontext(), stage(stats, name):
                yield

        JobStats.stage = timed_stage
