"""Fixed choices and defaults the library takes and the CLI offers, kept free of heavy imports so
`clef --help` can list them without loading torch."""

from __future__ import annotations

from enum import Enum

DEFAULT_MAX_BATCH_TOKENS = 32768
"""Padded tokens per forward (batch size x longest) unless --max-batch-tokens says otherwise."""
DEFAULT_MAX_BATCH_SIZE = 64


class OverflowPolicy(str, Enum):
    """What to do when the state does not fit: cut it (the reference) or refuse the record."""

    truncate = "truncate"
    error = "error"


class SpecialTokens(str, Enum):
    """Special-token strings written in a record's text (`<|im_end|>` in a post): `text` keeps them
    ordinary text (records may come from strangers), `parse` reads them as control tokens, as the
    reference does (for trusted data). The template's own special tokens are the same in both."""

    text = "text"
    parse = "parse"


class Layout(str, Enum):
    """Output rows: one per record (`wide`, answers as a list), one per (record, question, label)
    (`long`), or one per record with a column per question's answer, confidence and option
    probability (`flat`, for people: pandas, DuckDB, a spreadsheet)."""

    wide = "wide"
    long = "long"
    flat = "flat"


class HiddenStates(str, Enum):
    """Keep the final hidden states in the checkpoint (for --rehead and train-head), keep only
    those of uncertain records plus a sample (store/keep_policy.py), or none."""

    keep = "keep"
    selective = "selective"
    drop = "drop"


class HiddenDtype(str, Enum):
    """What stored hidden states are kept as."""

    bfloat16 = "bfloat16"
    float16 = "float16"
    float32 = "float32"


class Engine(str, Enum):
    """Which backbone runs the thinker (`clef score --engine`)."""

    hf = "hf"
    vllm = "vllm"
