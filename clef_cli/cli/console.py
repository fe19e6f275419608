"""The two consoles: results on stdout, progress, notes and errors on stderr."""

from __future__ import annotations

from rich.console import Console

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)
