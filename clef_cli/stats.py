"""Where a job's time goes: stage timers, the model-busy fraction, encode rates per modality.

The question a run must answer is "did the model ever wait for the CPU?". The job times each
stage on its main thread as it runs (the stages never overlap there, so they add up to at most
the wall time); the encoding workers time each record they plan. `JobStats` holds the totals and
writes them as JSON (`--stats-json`) for cron jobs to collect.

Definitions (docs/scoring.md, "Where the time goes"):
- scoring time: from the first record requested to the last commit, model loading excluded;
- model busy = (forward + head) / scoring time;
- encoding wait: the main thread waiting for planned windows or encoded batches (the model idle);
- padding waste = padded tokens / real tokens - 1, over the forwards this run made;
- encode rate of a modality = its records' prompt tokens / the seconds spent encoding them
  (wall time inside one worker, one thread: a per-core rate).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clef_cli.inputs.records import Record

STAGES = ("open_store", "keying", "startup", "load", "encode_wait", "forward", "head", "commit_wait", "output_write")
"""Timed stages of the main thread: opening the store (a bucket store: its cache brought up to
date) and keying the job's records (both before scoring, every engine), start-up (imports, the
processor, starting the encoding processes), model loading, waiting for inputs, the thinker's
forward, the joint head, waiting for the checkpoint committer, writing the output. The stages
from `startup` to `commit_wait` but `load` add up to the scoring time, less untimed bookkeeping."""
MODALITIES = ("text", "image", "audio", "video", "mixed")
ADVICE_THRESHOLD = 0.10
"""Encoding wait above this share of the scoring time prints one line of advice."""


def record_modality(record: Record) -> str:
    return modality(len(record.images), len(record.audio), len(record.videos))


def modality(images: int, audio: int, videos: int) -> str:
    """A record's modality for the encode-rate table: its one media kind, text, or mixed."""
    kinds = [name for name, count in (("image", images), ("audio", audio), ("video", videos)) if count]
    if not kinds:
        return "text"
    return kinds[0] if len(kinds) == 1 else "mixed"


@dataclass
class EncodeRate:
    records: int = 0
    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class JobStats:
    """Stage times and counts of one run (what this process measured; resumed records excluded)."""

    stages: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    wall_seconds: float = 0.0
    scoring_seconds: float = 0.0
    records: int = 0
    """Records run through the model in this run."""
    tokens: int = 0
    """Their prompt tokens."""
    forwards: int = 0
    padded_tokens: int = 0
    real_tokens: int = 0
    workers: int = 0
    backbone_on_cpu: bool = False
    """The backbone ran on the CPU: encoding workers take the cores it computes on."""
    counts: dict[str, int] = field(default_factory=dict)
    """run, forwarded, reused, duplicates, retried (docs/scoring.md, "Counts")."""
    special_tokens: str | None = None
    """The job's --special-tokens mode (text or parse), so a collected file says how its prompts
    were read."""
    sync_failures: int = 0
    """Syncs to a store in a bucket that failed in this run (each retried at the next turn)."""
    encode: dict[str, EncodeRate] = field(default_factory=dict)
    scoring_started: float | None = None
    """perf_counter() when scoring began (set by the engine)."""
    first_forward: float | None = None
    """perf_counter() when the first forward began."""
    _nested: list[float] = field(default_factory=list, repr=False)
    """Per open stage, the time its nested stages took (counted there, not in it)."""

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Add the time spent in the block to stage `name`; a stage opened inside another (a
        commit while waiting for the next window) counts only in the inner one."""
        started = time.perf_counter()
        if name == "forward" and self.first_forward is None:
            self.first_forward = started
        self._nested.append(0.0)
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            self.stages[name] = self.stages.get(name, 0.0) + elapsed - self._nested.pop()
            if self._nested:
                self._nested[-1] += elapsed

    def forwarded(self, lengths: list[int]) -> None:
        """One forward over right-padded records of these lengths."""
        self.forwards += 1
        self.padded_tokens += max(lengths) * len(lengths)
        self.real_tokens += sum(lengths)

    def encoded(self, kind: str, tokens: int, seconds: float) -> None:
        rate = self.encode.setdefault(kind, EncodeRate())
        rate.records += 1
        rate.tokens += tokens
        rate.seconds += seconds

    def encoding_time(self, kind: str, seconds: float) -> None:
        """Time spent encoding records already counted (decoded when their batch was made)."""
        self.encode.setdefault(kind, EncodeRate()).seconds += seconds

    @property
    def measured(self) -> bool:
        """Whether this run timed its stages (the local engine does; Ray and rehead do not)."""
        return self.scoring_seconds > 0

    @property
    def model_busy(self) -> float:
        if self.scoring_seconds <= 0:
            return 0.0
        return min(1.0, (self.stages["forward"] + self.stages["head"]) / self.scoring_seconds)

    @property
    def first_forward_seconds(self) -> float:
        """Start-up: from the start of scoring to the first forward, model loading excluded."""
        if self.first_forward is None or self.scoring_started is None:
            return 0.0
        return max(0.0, self.first_forward - self.scoring_started - self.stages["load"])

    @property
    def encode_wait_share(self) -> float:
        return self.stages["encode_wait"] / self.scoring_seconds if self.scoring_seconds > 0 else 0.0

    @property
    def padding_waste(self) -> float:
        return self.padded_tokens / self.real_tokens - 1 if self.real_tokens else 0.0

    def advice(self) -> str | None:
        """One line when the model waited for its inputs more than 10% of the time; none when
        starting the model or engine took longer than all the scoring (a job too short to judge
        its feed by: the wait was start-up, not too few workers), and none on a CPU backbone,
        where workers take the cores the model computes on (measured slower: docs/scoring.md)."""
        share = self.encode_wait_share
        if not self.measured or share <= ADVICE_THRESHOLD or self.stages["load"] > self.scoring_seconds:
            return None
        if self.backbone_on_cpu:
            return None
        media = any(kind != "text" and rate.records for kind, rate in self.encode.items())
        what = "media decoding" if media else "prompt encoding"
        return f"the model waited {share:.0%} of the time for {what}: add --workers (this run had {self.workers})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "wall_seconds": round(self.wall_seconds, 6),
            "scoring_seconds": round(self.scoring_seconds, 6),
            "stages_seconds": {name: round(self.stages.get(name, 0.0), 6) for name in STAGES},
            "first_forward_seconds": round(self.first_forward_seconds, 6),
            "model_busy": round(self.model_busy, 6),
            "encode_wait_share": round(self.encode_wait_share, 6),
            "records": self.records,
            "tokens": self.tokens,
            "forwards": self.forwards,
            "padded_tokens": self.padded_tokens,
            "real_tokens": self.real_tokens,
            "padding_waste": round(self.padding_waste, 6),
            "workers": self.workers,
            "counts": dict(self.counts),
            "special_tokens": self.special_tokens,
            "sync_failures": self.sync_failures,
            "encode": {
                kind: {
                    "records": rate.records,
                    "tokens": rate.tokens,
                    "seconds": round(rate.seconds, 6),
                    "tokens_per_s": round(rate.tokens_per_second, 3),
                }
                for kind, rate in sorted(self.encode.items())
            },
        }

    def write_json(self, path: Path) -> None:
        from clef_cli.store.atomic import write_text

        write_text(path, json.dumps(self.as_dict(), indent=2) + "\n")


@contextlib.contextmanager
def timed(stats: JobStats | None, name: str) -> Iterator[None]:
    """`stats.stage(name)`, or nothing when no one is measuring."""
    if stats is None:
        yield
        return
    with stats.stage(name):
        yield
