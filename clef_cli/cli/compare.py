"""`clef compare OLD NEW`: answer shift and flipped records between two runs, for a person (a
table, an HTML report) or for cron (`--fail-above-psi`, exit code 5). Never imports torch."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from clef_cli.cli.console import stderr, stdout
from clef_cli.cli.errors import EXIT_DRIFT
from clef_cli.cli.options import ReportOption, writable_file_or_stdout
from clef_cli.errors import UsageError
from clef_cli.store.atomic import is_stdout


def command(
    old: Annotated[Path, typer.Argument(help="The earlier run's Parquet (from `clef score`).")],
    new: Annotated[Path, typer.Argument(help="The later run's Parquet.")],
    json_path: Annotated[
        Path | None,
        typer.Option(
            "--json", callback=writable_file_or_stdout, help="Write every number and every flip as JSON (- for stdout)."
        ),
    ] = None,
    report: ReportOption = None,
    fail_above_psi: Annotated[
        float | None,
        typer.Option("--fail-above-psi", min=0.0, help="Exit 5 when any question's PSI exceeds this (after writing)."),
    ] = None,
) -> None:
    """Per question: answer distributions, PSI, Jensen–Shannon divergence, mean confidence and
    flipped records between two runs, joined on `record_key` when both files have it, else `id`.

    \b
    Examples:
      clef compare yesterday.parquet today.parquet
      clef compare yesterday.parquet today.parquet --json drift.json --report drift.html
      clef compare yesterday.parquet today.parquet --fail-above-psi 0.2 || echo "labels drifted"
    """
    from clef_cli.cli.quality import tables_console
    from clef_cli.quality.compare import above, compare

    if is_stdout(json_path or "") and is_stdout(report or ""):
        raise UsageError("--json and --report cannot both be - (stdout)")
    comparison = compare(old, new)
    print_comparison(comparison.document, tables_console(json_path, report))
    if json_path is not None:
        from clef_cli.cli.quality import write_json

        write_json(json_path, comparison.document)
    if report is not None:
        from clef_cli.quality.compare_report import write_report

        write_report(report, comparison)
    if fail_above_psi is not None:
        drifted = above(comparison, fail_above_psi)
        if drifted:
            stderr.print(f"PSI above {fail_above_psi:g} for: {', '.join(drifted)}", markup=False)
            raise typer.Exit(EXIT_DRIFT)


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def print_comparison(document: dict[str, Any], console: Console = stdout) -> None:
    from rich import box
    from rich.table import Table

    title = (
        f"{document['shared_records']} records in both runs (joined on {document['join']}); "
        f"{document['only_old_records']} only in old, {document['only_new_records']} only in new"
    )
    table = Table(title=title, title_justify="left", box=box.SIMPLE)
    for column in ("question", "n", "flipped", "PSI", "JS", "mean conf. old → new"):
        table.add_column(column, no_wrap=True, justify="left" if column == "question" else "right")
    for qid, found in document["questions"].items():
        confidence = f"{_share(found['old']['mean_confidence'])} → {_share(found['new']['mean_confidence'])}"
        flipped = f"{found['flipped']} ({_share(found['flipped_share'])})"
        psi, js = (f"{found[name]:.4f}" if found[name] is not None else "—" for name in ("psi", "js"))
        table.add_row(qid, str(found["n"]), flipped, psi, js, confidence)
    console.print(table)
    shares = Table(title="answer shares, old → new (shared records)", title_justify="left", box=box.SIMPLE)
    for column in ("question", "answer", "old", "new"):
        shares.add_column(column, no_wrap=True, justify="left" if column in ("question", "answer") else "right")
    for qid, found in document["questions"].items():
        for option, count in found["old"]["counts"].items():
            new_count = found["new"]["counts"][option]
            shares.add_row(qid, option, f"{count} ({_share(found['old']['shares'][option])})",
                           f"{new_count} ({_share(found['new']['shares'][option])})")  # fmt: skip
    console.print(shares)
