"""Byte counts as people write and read them (`256M`, `1.5 GiB`), and counts of things (`1 key`,
`43,728 tokens`); no heavy imports, so the CLI can parse and print them without loading the
library, and every module below the CLI can share them."""

from __future__ import annotations

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """`256M` -> 268435456; plain numbers are bytes; `KiB`/`KB`/`K` all mean 1024."""
    cleaned = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        if cleaned and cleaned[-1] in UNITS:
            return int(float(cleaned[:-1]) * UNITS[cleaned[-1]])
        return int(cleaned)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (use bytes or a K/M/G suffix)") from None


def human_size(count: float) -> str:
    """268435456 -> `256.0 MiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count:.1f} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1024
    return f"{count:.1f} TiB"


def plural(count: int, noun: str, plural: str | None = None) -> str:
    """`1 key`, `2 keys`, `43,728 tokens`: a count with its noun in the count's number and its
    thousands separated, so summaries read alike everywhere; `plural` for an irregular noun."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"
