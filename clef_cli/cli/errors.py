"""The CLI's one error boundary: every command runs inside `ClefGroup.invoke`, which turns what
escapes it into one line on stderr and an exit code, through one table. Commands never catch.

Exit codes: 0 success, 1 fatal error, 2 usage error, 3 finished but some records failed,
4 train-head's gate refused the head, 5 compare's PSI exceeded --fail-above-psi, 130 interrupted.
"""

from __future__ import annotations

import traceback
from typing import Any

import typer
from typer.core import TyperGroup

from clef_cli.cli.console import stderr
from clef_cli.errors import ClefError, UsageError

EXIT_OK, EXIT_FATAL, EXIT_USAGE, EXIT_RECORDS_FAILED, EXIT_GATE_REFUSED, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_DRIFT = 5

# First match wins: (exception type, exit code, message, traceback under -v). `{error}` is str(error).
EXIT_TABLE: tuple[tuple[type[BaseException], int, str, bool], ...] = (
    (UsageError, EXIT_USAGE, "error: {error}", False),
    (ClefError, EXIT_FATAL, "error: {error}", True),
    (KeyboardInterrupt, EXIT_INTERRUPTED, "interrupted", False),
    (Exception, EXIT_FATAL, "error: {kind}: {error}", True),
)
# What click and Typer handle themselves: their usage errors (exit 2, choices listed), --help, typer.Exit.
PASS_THROUGH = (typer.exceptions.TyperException, typer.Exit, typer.Abort)


def exit_for(error: BaseException, verbose: bool) -> int:
    """Print `error` as its table row says and return the exit code."""
    for kind, code, message, show_traceback in EXIT_TABLE:
        if isinstance(error, kind):
            if show_traceback and verbose:
                traceback.print_exception(type(error), error, error.__traceback__)
            text = message.format(error=error, kind=type(error).__name__)
            if show_traceback and not verbose and kind is Exception:
                text += " (run `clef -v ...` for the traceback)"
            stderr.print(text, markup=False)
            return code
    raise error


class ClefGroup(TyperGroup):
    """The top-level group: runs the chosen command and maps its failures through `EXIT_TABLE`."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PASS_THROUGH:
            raise
        except (Exception, KeyboardInterrupt) as error:
            raise typer.Exit(exit_for(error, bool(ctx.params.get("verbose")))) from None
