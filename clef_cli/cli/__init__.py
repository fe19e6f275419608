"""The `clef` command line: parses options, shows progress on stderr, maps errors to exit codes.

All work happens in the library; every command here is a thin shell around it, one module per
command group. Failures become exit codes in one place, `clef_cli.cli.errors`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from clef_cli import __version__
from clef_cli.cli import checkpoint, compare, inspect, quality, review, score
from clef_cli.cli.console import stdout
from clef_cli.cli.errors import ClefGroup
from clef_cli.cli.examples import epilog
from clef_cli.cli.stopping import STOPS
from clef_cli.cli.usage import ClefCommand, PanelledCommand

app = typer.Typer(
    name="clef",
    cls=ClefGroup,
    help="Score records with Cloudflare's Clef decision models (Clef-Omni: text, images, audio, video; "
    "the dense Clef and Clef-Flash: text, images): a probability for every allowed option of every question, "
    "in Parquet. Exit codes: 0 success, 1 fatal error, 2 usage error, "
    "3 finished but some records failed, 4 train-head's gate refused the head, 5 compare's PSI exceeded "
    "--fail-above-psi, 130 interrupted.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def version_callback(value: bool) -> None:
    if value:
        stdout.print(f"clef {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show the traceback of an error (give before the command).")
    ] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Score records with Cloudflare's Clef decision models."""


app.command("score", cls=PanelledCommand, epilog=epilog("score"))(score.command)
app.command("inspect-spans", cls=PanelledCommand, epilog=epilog("inspect-spans"))(inspect.command)
app.command("eval", cls=ClefCommand, epilog=epilog("eval"))(quality.evaluate)
app.command("calibrate", cls=ClefCommand, epilog=epilog("calibrate"))(quality.calibrate)
app.command("train-head", cls=ClefCommand, epilog=epilog("train-head"))(quality.train_head)
app.command("review", cls=ClefCommand, epilog=epilog("review"))(review.command)
app.command("compare", cls=ClefCommand, epilog=epilog("compare"))(compare.command)
app.add_typer(checkpoint.app, name="checkpoint")


def main() -> None:
    """Console-script entry point (`python -m clef_cli` too): Ctrl-C is the CLI's from the start."""
    STOPS.install_for_process()
    try:
        app(prog_name="clef")
    except SystemExit as done:  # Typer's way out of every command
        STOPS.exit_when_done(done.code)
        raise
