"""What a scoring job reports back: its counts, where its output went, and where the time went."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from clef_cli.stats import JobStats

if TYPE_CHECKING:
    from clef_cli.results import OutputCounts, RunCounts


@dataclass
class JobSummary:
    output: Path | str | None
    """Where the output went (`OutputTarget.shown`: a remote `-o`'s URI, not its local stage)."""
    records: int = 0
    scored: int = 0
    failed: int = 0
    reused: int = 0
    """Records whose key's result came from the store (reused)."""
    forwarded: int = 0
    """Records run through the thinker in this run."""
    run: int = 0
    """Records whose prompt this run computes (new, retried, or missing hidden states)."""
    duplicates: int = 0
    """Later copies of a key earlier in this job: run once, every copy gets the result."""
    invalid: int = 0
    """Records without a prompt (the record itself is wrong): never keyed, never run."""
    retried: int = 0
    """Of `run`: records whose stored result was a transient error."""
    damaged: int = 0
    """Records of checkpoint shards found damaged on resume, so computed again in this run."""
    committed: int = 0
    """Records committed to the checkpoint in this run (scored or failed)."""
    tokens: int = 0
    seconds: float = 0.0
    interrupted: bool = False
    failed_by_kind: dict[str, int] = field(default_factory=dict)
    """error_kind -> failed records of the output (they add up to `failed`)."""
    first_errors: list[tuple[str | None, str]] = field(default_factory=list)
    """(id, error) of the output's first failed records, in input order."""
    states_cut: int = 0
    """Output rows whose state was cut to fit --max-length."""
    stats: JobStats = field(default_factory=JobStats)
    rehead_states_computed: int | None = None
    """A `--rehead`: records whose states the thinker computed first (the rest only met the head)."""
    notes: list[str] = field(default_factory=list)
    """Lines the summary adds (what computing missing hidden states cost a `--rehead`)."""
    """Where the time went (stage times are measured by the local engine only)."""

    def take_counts(self, counts: RunCounts) -> None:
        self.run, self.reused = counts.run, counts.reused
        self.duplicates, self.retried, self.invalid = counts.duplicates, counts.retried, counts.invalid

    def run_counts(self) -> dict[str, int]:
        """docs/scoring.md, "Counts": what this run did with its records."""
        return {
            "run": self.run,
            "forwarded": self.forwarded,
            "reused": self.reused,
            "duplicates": self.duplicates,
            "retried": self.retried,
            "invalid": self.invalid,
        }

    @property
    def failed_running(self) -> int:
        """Of `run`: records that failed on their way through this run (encoding, media, a
        forward that failed on them alone), so were not counted as run through the model."""
        return max(0, self.run - self.forwarded)

    def final_stats(self) -> JobStats:
        """The stats with the run's totals: wall time, output records, tokens run this time."""
        self.stats.wall_seconds = self.seconds
        self.stats.records = self.records
        self.stats.tokens = self.tokens
        self.stats.counts = self.run_counts()
        return self.stats

    def count(self, written: OutputCounts) -> None:
        """Totals from the written output (which also holds records resumed from the checkpoint)."""
        self.records = written.records
        self.failed = written.failed
        self.scored = written.records - written.failed
        self.failed_by_kind = dict(written.failed_by_kind)
        self.first_errors = list(written.first_errors)
        self.states_cut = written.states_cut
