"""The stall watchdog of a `--ray` run: a job whose blocks stop coming back stops itself, with
everything committed so far kept, instead of hanging a cron job forever.

The dataset is consumed on a helper thread; the driver waits for each block at most
`--stall-timeout` seconds. When nothing arrives in time it says what Ray is waiting for (pending
resource demands, alive actors) and raises `Stalled`, which exits 1 and tells the user to rerun.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from clef_cli.errors import ClefError

T = TypeVar("T")
DEFAULT_STALL_TIMEOUT = 1800.0
_END = object()


class Stalled(ClefError):
    """No block came back for the stall timeout (exit 1; a rerun continues from the checkpoint)."""


class Watched(Iterator[T]):
    """Yields the items of `source` (consumed on a daemon thread); raises `Stalled` when none
    arrives for `timeout` seconds. `close()` asks the thread to stop at its next item, which
    closes `source` so that Ray Data shuts its actors down."""

    def __init__(self, source: Iterable[T], timeout: float, describe: Callable[[], str]) -> None:
        self.timeout = timeout
        self.describe = describe
        self._items: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._closing = threading.Event()
        self.stalled = False
        self._thread = threading.Thread(target=self._consume, args=(source,), name="clef-ray-blocks", daemon=True)
        self._thread.start()

    def _consume(self, source: Iterable[T]) -> None:
        iterator = iter(source)
        try:
            for item in iterator:
                while not self._closing.is_set():
                    try:
                        self._items.put(item, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if self._closing.is_set():
                    break
            self._put_end(_END)
        except BaseException as error:  # handed to the driver thread, which raises it
            self._put_end(error)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    def _put_end(self, item: Any) -> None:
        while not self._closing.is_set():
            try:
                self._items.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def __next__(self) -> T:
        try:
            item = self._items.get(timeout=self.timeout)
        except queue.Empty:
            self.stalled = True
            self._closing.set()
            message = f"no block came back from Ray for {self.timeout:g} s; Ray is waiting for: {self.describe()}"
            raise Stalled(message) from None
        if item is _END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self, wait: float = 30.0) -> None:
        """Stop consuming; wait (a little) for the source to be closed, unless it is stuck."""
        self._closing.set()
        if not self.stalled:
            self._thread.join(wait)


def waiting_for() -> str:
    """What Ray is waiting for right now, in one line: pending resource demands and this job's
    actors by state (for the stall message; best effort, since these are Ray's internal status calls)."""
    import ray

    parts: list[str] = []
    try:
        from ray.autoscaler.v2.sdk import get_cluster_status

        status = get_cluster_status(ray.get_runtime_context().gcs_address)
        demands = [
            f"{request.count} x {request.bundle}"
            for demand in status.resource_demands.ray_task_actor_demand
            for request in demand.bundles_by_count
        ]
        parts.append("pending demands: " + (", ".join(demands) if demands else "none"))
    except Exception as error:  # diagnostics must never hide the stall itself
        parts.append(f"pending demands: unknown ({type(error).__name__})")
    try:
        from ray._private import state

        job = ray.get_runtime_context().get_job_id()
        by_state: dict[str, list[str]] = {}
        for actor in state.actors().values():
            if actor.get("JobID") in (job, None) and actor.get("State") != "DEAD":
                by_state.setdefault(str(actor.get("State")).lower(), []).append(str(actor.get("ActorClassName")))
        counts = [f"{len(names)} {kind} ({', '.join(sorted(set(names)))})" for kind, names in by_state.items()]
        parts.append("actors: " + (", ".join(counts) or "none"))
    except Exception as error:
        parts.append(f"actors: unknown ({type(error).__name__})")
    try:
        free = ray.available_resources()
        parts.append(f"free: {free.get('CPU', 0):g} CPU, {free.get('GPU', 0):g} GPU")
    except Exception:
        pass
    return "; ".join(parts)
