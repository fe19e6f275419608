"""What a running command shows on stderr: progress bars, the end-of-job summary and the dry-run
plan (Ctrl-C's handling is cli/stopping.py's)."""

from __future__ import annotations

import time
from typing import Any

from clef_cli.cli.console import stderr, stdout
from clef_cli.cli.line_progress import LineProgress
from clef_cli.errors import UsageError
from clef_cli.progress import Progress
from clef_cli.sizes import human_size, plural


def job_progress(quiet: bool, log_every: float, dry_run: bool = False) -> Progress:
    """A job's progress on stderr: a bar on a terminal, plain lines at least every `log_every`
    seconds without one (cron, a pipe: cli/line_progress.py), warnings alone under --quiet (and
    for a dry run without a terminal: its plan is its report)."""
    if not log_every > 0:
        raise UsageError(f"--log-every must be above 0 seconds, not {log_every:g}")
    if quiet or stderr.is_terminal or dry_run:
        return RichProgress(enabled=not quiet and stderr.is_terminal)
    return LineProgress(log_every)


class RichProgress(Progress):
    """Records, tokens/s, ETA and errors so far, on stderr; silent when stderr is not a terminal."""

    def __init__(self, enabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.progress import Progress as Bar

        self.enabled = enabled
        self.tokens = 0
        self.failed = 0
        self.started = time.monotonic()
        self._progress = Bar(
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
            errors=plural(self.failed, "error") if self.failed else "",
        )

    def phase(self, description: str | None) -> None:
        if self._task is not None:
            self._progress.update(self._task, description=description or "records")

    def note(self, message: str) -> None:
        if self.enabled:
            self._progress.console.print(message, markup=False, style="dim")

    def warn(self, message: str) -> None:
        self._progress.console.print(f"warning: {message}", markup=False)  # shown with or without the bar

    def stop(self) -> None:
        self._progress.stop()


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


def print_summary(summary: Any, layout: str = "wide") -> None:
    if summary.interrupted:  # a request as the output was already in place says so
        written = f" after writing {summary.output} ({plural(summary.records, 'record')})" if summary.records else ""
        stderr.print(
            f"interrupted{written}: {plural(summary.committed, 'record')} committed this run; "
            "rerun the same command to continue",
            markup=False,
        )
        return
    rate = summary.tokens / summary.seconds if summary.seconds else 0.0
    headline = rehead_line(summary) if summary.rehead_states_computed is not None else score_line(summary, rate)
    stderr.print(headline, markup=False)
    if summary.states_cut:
        stderr.print(
            f"states cut to fit --max-length: {plural(summary.states_cut, 'record')} "
            "(each row's state_tokens_cut says by how many tokens)",
            markup=False,
        )
    for note in summary.notes:
        stderr.print(note, markup=False)
    advice = summary.stats.advice() if summary.rehead_states_computed is None else None
    if advice:
        stderr.print(advice, markup=False)
    print_failures(summary, layout)


def score_line(summary: Any, rate: float) -> str:
    """What a run did with its records, where its time went, and where the output is."""
    stats = summary.stats
    busy = f", model busy {stats.model_busy:.0%}" if stats.measured else ""
    stages = (("open_store", "opening the store"), ("keying", "keying the records"), ("startup", "start-up"))
    startup = "".join(f", {what} {stats.stages[name]:.1f} s" for name, what in stages if stats.stages[name] >= 0.05)
    # The bracket adds up to the records; `retried` and the damaged-shard count are among those run.
    extra = [(summary.failed_running, "failed while running"), (summary.invalid, "invalid")]
    extra += [(summary.damaged, "again for damaged checkpoint shards")]
    more = "".join(f", {count} {what}" for count, what in extra if count)
    return (
        f"{summary.scored:,} scored, {summary.failed:,} failed of {plural(summary.records, 'record')} "
        f"({summary.forwarded:,} run through the model, {summary.reused:,} from the checkpoint, "
        f"{plural(summary.duplicates, 'duplicate')} collapsed, {summary.retried:,} retried{more}); "
        f"{summary.tokens:,} tokens in {summary.seconds:.1f} s ({rate:,.0f} tok/s{busy}{startup}) -> {summary.output}"
    )


def rehead_line(summary: Any) -> str:
    """A `--rehead`: every record re-scored by the head from stored states; the thinker ran only
    on those whose states the store lacked (the note after says what that cost, with the one
    tok/s: the head alone reads stored states, so its tokens make no thinker's rate)."""
    computed = summary.rehead_states_computed
    thinker = f"the thinker ran first on {computed:,} whose states were not stored" if computed else "no thinker run"
    per_second = summary.records / summary.seconds if summary.seconds else 0.0
    return (
        f"{summary.scored:,} scored, {summary.failed:,} failed of {plural(summary.records, 'record')}, re-scored by "
        f"the head from stored hidden states ({thinker}); {summary.tokens:,} prompt tokens in {summary.seconds:.1f} s "
        f"({per_second:,.1f} records/s) -> {summary.output}"
    )


def print_failures(summary: Any, layout: str = "wide") -> None:
    """Why records failed: counts by error kind, the first few errors, where the rest are (the
    flat layout has an `error` column and no `error_kind`)."""
    if not summary.failed:
        return
    kinds = ", ".join(f"{count} {kind}" for kind, count in summary.failed_by_kind.items())
    kind_column = "" if layout == "flat" else " (`error_kind` its kind)"
    stderr.print(
        f"failed by kind: {kinds}; every failed row's `error` column says why{kind_column} "
        f"in {summary.output}; the first {len(summary.first_errors)}:",
        markup=False,
    )
    for record_id, error in summary.first_errors:
        shown = record_id is None or repr(record_id) in error  # the error names its record
        stderr.print(f"  {error}" if shown else f"  {record_id}: {error}", markup=False)


def print_dry_run(report: Any, settings: Any) -> None:
    failing = ", ".join(f"{count} {kind}" for kind, count in sorted(report.failed_by_kind.items())) or "0 invalid"
    for line in report.field_sources:  # how each record field is read, per input
        stdout.print(line, markup=False)
    stdout.print(f"records: {report.records} ({report.valid} valid, {failing})", markup=False)
    if report.already_done:
        stdout.print(f"already in the checkpoint: {report.already_done} (not planned again)")
    if report.duplicates:
        stdout.print(f"duplicates in this job: {report.duplicates} (a prompt an earlier record has: planned once)")
    if report.states_cut:
        stdout.print(
            f"states cut to fit --max-length {settings.max_length:,}: {plural(report.states_cut, 'record')} "
            "(each row's state_tokens_cut says by how many tokens)",
            markup=False,
        )
    percentiles = report.percentiles()
    if percentiles:
        stdout.print("prompt tokens: " + ", ".join(f"{key} {value}" for key, value in percentiles.items()))
        stdout.print(f"total prompt tokens: {sum(report.lengths):,}")
    stdout.print(
        f"batches: {report.batches} ({report.audio_in_video_batches} with audio-in-video) under "
        f"{settings.max_batch_tokens:,} padded tokens and at most {plural(settings.max_batch_size, 'record')} each"
    )
    stdout.print(f"padding waste: {report.padding_waste:.2%}")
    if report.over_engine_limit:
        stdout.print(
            f"over vLLM's max_model_len of {report.engine_limit:,}: {report.over_engine_limit:,} prompts (the run "
            "refuses them as overflow and tries them again when the limit is raised)",
            markup=False,
        )
    print_hidden_sizes(report, settings)
    for kind, error in report.first_errors:
        stdout.print(f"{kind}: {error}", markup=False)


def print_hidden_sizes(report: Any, settings: Any) -> None:
    """The hidden states each policy's run would write; one line when no policy writes any (the
    store holds every record: no share of the stored results to quote)."""
    sizes = report.hidden_state_bytes_by_policy
    if not any(high for _, high in sizes.values()):
        stdout.print("hidden states on disk: none under any --hidden-states (no prompt to compute)", markup=False)
        return
    for policy, (low, high) in sizes.items():
        chosen = " (this run)" if policy == settings.hidden_states else ""
        size = human_size(low) if low == high else f"{human_size(low)} to {human_size(high)}"
        how = ""
        if policy == "selective" and high:
            how = (
                f": {report.selective_measured:.1%} of the stored results are under --keep-below, plus the sample"
                if report.selective_measured is not None
                else ": the sample to every record (no stored results to measure the share under --keep-below)"
            )
        stdout.print(f"hidden states on disk with --hidden-states {policy}{chosen}: about {size}{how}", markup=False)
