"""What a job reports while it runs. The base class ignores everything, so a library caller or a
distributed worker passes nothing; the CLI subclasses it to draw a progress bar on stderr."""

from __future__ import annotations


class Progress:
    def start(self, total: int | None, done: int) -> None:
        """The job knows how many records there are (None: unknown) and how many are done."""

    def advance(self, records: int, tokens: int, failed: int) -> None:
        """Records committed since the last call, their prompt tokens, and how many failed."""

    def syncs(self, done: int, failing: int) -> None:
        """A store in a bucket after each sync: syncs that committed so far, and how many failed in
        a row since the last that did (0: the last one committed). Fed by the store's syncer."""

    def phase(self, description: str | None) -> None:
        """What the job is doing instead of scoring records (`starting vLLM`); None: scoring again."""

    def note(self, message: str) -> None:
        """A one-line message worth showing (model loading, lock taken over, damaged shard)."""

    def warn(self, message: str) -> None:
        """A line the user must see even without a progress display (a job-level warning)."""

    def stop(self) -> None:
        """The job is over: put the display away."""
