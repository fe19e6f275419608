"""Fixed choices the library takes and the CLI offers, kept free of heavy imports so `clef --help`
can list them without loading torch."""

from __future__ import annotations

from enum import Enum


class OverflowPolicy(str, Enum):
    """What to do when the state does not fit: cut it (the reference) or refuse the record."""

    truncate = "truncate"
    error = "error"
