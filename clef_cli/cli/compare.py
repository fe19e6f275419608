"""`clef compare OLD NEW`: answer shift and flipped records between two runs, for a person (a
table, an HTML report) or for cron (`--fail-above-psi`, exit code 5). Never imports torch."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console

from clef_cli.cli.console import stderr, stdout
from clef_cli.cli.errors import EXIT_DRIFT
from clef_cli.cli.options import PATH_OR_URI, ReportOption, read_location, writable_file_or_stdout
from clef_cli.errors import UsageError
from clef_cli.locations.overlap import refuse_overlap
from clef_cli.store.atomic import is_stdout

CompareOldArgument = Annotated[
    str,
    typer.Argument(callback=read_location, help="The earlier run's Parquet (from `clef score`; a path or a URI)."),
]
CompareNewArgument = Annotated[
    str, typer.Argument(callback=read_location, help="The later run's Parquet (a path or a URI).")
]
CompareJsonPathOption = Annotated[
    str | None,
    typer.Option(
        "--json",
        callback=writable_file_or_stdout,
        metavar=PATH_OR_URI,
        help="Write every number and every flip as JSON (- for stdout).",
    ),
]
CompareFailAbovePsiOption = Annotated[
    float | None,
    typer.Option(
        "--fail-above-psi",
        min=0.0,
        help="Exit 5 when any question's PSI exceeds this, or the runs share no record (after writing).",
    ),
]


def command(
    old: CompareOldArgument,
    new: CompareNewArgument,
    json_path: CompareJsonPathOption = None,
    report: ReportOption = None,
    fail_above_psi: CompareFailAbovePsiOption = None,
) -> None:
    """Per question: answer distributions, PSI, Jensen–Shannon divergence, mean confidence and
    flipped records between two runs, joined on `record_key` when both files have it, else `id`
    (a prompt held under several ids counts once).
    """
    from clef_cli.cli.quality import tables_console
    from clef_cli.quality.compare.drift import compare, drift_failure, no_shared_records

    if is_stdout(json_path or "") and is_stdout(report or ""):
        raise UsageError("--json and --report cannot both be - (stdout)")
    refuse_overlap("--json", json_path, [old, new])
    refuse_overlap("--report", report, [old, new])
    comparison = compare(old, new)
    nothing = no_shared_records(comparison)
    if nothing:
        stderr.print(f"warning: {nothing}", markup=False)
    print_comparison(comparison.document, tables_console(json_path, report))
    if json_path is not None:
        from clef_cli.cli.quality import write_json

        write_json(json_path, comparison.document)
    if report is not None:
        from clef_cli.quality.compare.report import write_report

        write_report(report, comparison)
    if fail_above_psi is not None:
        failure = drift_failure(comparison, fail_above_psi)
        if failure:
            stderr.print(failure, markup=False)
            raise typer.Exit(EXIT_DRIFT)


def print_comparison(document: dict[str, Any], console: Console = stdout) -> None:
    """The two tables: rich on a terminal, plain text in a pipe or a file (as eval's)."""
    from clef_cli.quality.compare.tables import compare_tables
    from clef_cli.quality.text_table import print_tables

    print_tables(console, compare_tables(document))
