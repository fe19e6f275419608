"""The CLI's one error boundary: every command runs inside `ClefGroup.invoke`, which turns what
escapes it into one line on stderr and an exit code, through one table. Commands never catch.

Exit codes: 0 success, 1 fatal error, 2 usage error, 3 finished but some records failed,
4 train-head's gate refused the head, 5 compare's PSI exceeded --fail-above-psi, 130 interrupted.

A reader that closes the pipe early (`clef compare ... | head -1`) ends the command quietly with
0: the reader had what it wanted. Not 141 (a shell's code for a process killed by SIGPIPE, what
`yes | head -1` gives): `set -o pipefail` reports the last command that failed, so 141 would fail
every cron pipeline through `head`, while a failing reader still fails the pipeline itself.

Ctrl-C and SIGTERM are handled here too, once for every command (`cli/stopping.py`): a second
request ends the process with 130 at once, never an abort.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from typing import Any

import typer
from typer.core import TyperGroup

from clef_cli.cli.console import stderr
from clef_cli.cli.stopping import STOPS
from clef_cli.errors import ClefError, UsageError
from clef_cli.locations.uris import masked

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
            text = masked(message.format(error=error, kind=type(error).__name__))  # no credential is ever shown
            if show_traceback and not verbose and kind is Exception:
                text += " (run `clef -v ...` for the traceback)"
            stderr.print(text, markup=False)
            detail = getattr(error, "detail", "")  # an object store's answer (locations/failures.py)
            if verbose and detail:
                stderr.print(masked(f"the store answered: {detail}"), markup=False)
            return code
    raise error


def reader_gone() -> int:
    """stdout's reader closed the pipe: what is left to print goes nowhere (so the flush at exit
    cannot fail again), nothing is said, and the exit code is 0 (see the module's note)."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                os.dup2(devnull, stream.fileno())
    return EXIT_OK


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        reader_gone()


class ClefGroup(TyperGroup):
    """The top-level group: runs the chosen command and maps its failures through `EXIT_TABLE`."""

    def invoke(self, ctx: typer.Context) -> Any:
        with STOPS.command():
            return self._invoke(ctx)

    def _invoke(self, ctx: typer.Context) -> Any:
        try:
            try:
                result = super().invoke(ctx)
            except typer.Exit:
                _flush_stdout()  # the command's own exit code stands
                raise
            sys.stdout.flush()  # output that fit in the buffer meets a closed pipe here
            return result
        except BrokenPipeError:
            raise typer.Exit(reader_gone()) from None
        except PASS_THROUGH:
            raise
        except (Exception, KeyboardInterrupt) as error:
            raise typer.Exit(exit_for(error, bool(ctx.params.get("verbose")))) from None
