"""The two consoles: results on stdout, progress, notes and errors on stderr."""

from __future__ import annotations

from rich.console import Console


class ClefConsole(Console):
    """A rich console that leaves a closed pipe to the CLI's error boundary (`cli/errors.py`),
    where rich itself would exit 1."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


stdout = ClefConsole(highlight=False, soft_wrap=True)
stderr = ClefConsole(stderr=True, highlight=False, soft_wrap=True)
