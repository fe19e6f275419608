"""Fixed choices and defaults the library takes and the CLI offers, kept free of heavy imports so
`clef --help` can list them without loading torch."""

from __future__ import annotations

from enum import Enum

DEFAULT_MAX_BATCH_TOKENS = 32768
"""Padded tokens per forward (batch size x longest) unless --max-batch-tokens says otherwise."""
DEFAULT_MAX_BATCH_SIZE = 64
DEFAULT_WINDOW = 8192
"""Records planned together (`--window`): sorted by length into batches."""
DEFAULT_SYNC_EVERY = 30.0
"""Seconds between two syncs of a bucket store (`--sync-every`: a kill loses at most that much work)."""
DEFAULT_SYNC_FAILURE_LIMIT = 300.0
"""Seconds a bucket store's syncs may keep failing before the job stops (`--sync-failure-limit`)."""
DEFAULT_KEEP_BELOW = 0.6
"""`--hidden-states selective`: keep the states of records whose confidence is below this (`--keep-below`)."""
DEFAULT_KEEP_SAMPLE = 0.02
"""And of this fraction of the rest (`--keep-sample`)."""
DEFAULT_BLOCK_RECORDS = 256
"""`--ray`: records handed to an actor at a time (`--block-records`)."""


class Choice(str, Enum):
    """A fixed choice that reads as its value wherever it is written (a message, a log line, the
    output's metadata), so settings keep the enum from the CLI to the files (`Layout.wide` prints
    `wide` on every Python, not only where `StrEnum` exists)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class OverflowPolicy(Choice):
    """What to do when the state does not fit: cut it (the reference) or refuse the record."""

    truncate = "truncate"
    error = "error"


class SpecialTokens(Choice):
    """Special-token strings written in a record's text (`<|im_end|>` in a post): `text` keeps them
    ordinary text (records may come from strangers), `parse` reads them as control tokens, as the
    reference does (for trusted data). The template's own special tokens are the same in both."""

    text = "text"
    parse = "parse"


class Layout(Choice):
    """Output rows: one per record (`wide`, answers as a list), one per (record, question, label)
    (`long`), or one per record with a column per question's answer, confidence and option
    probability (`flat`, for people: pandas, DuckDB, a spreadsheet)."""

    wide = "wide"
    long = "long"
    flat = "flat"


class HiddenStates(Choice):
    """Keep the final hidden states in the checkpoint (for --rehead and train-head), keep only
    those of uncertain records plus a sample (store/keep_policy.py), or none."""

    keep = "keep"
    selective = "selective"
    drop = "drop"


class HiddenDtype(Choice):
    """What stored hidden states are kept as."""

    bfloat16 = "bfloat16"
    float16 = "float16"
    float32 = "float32"


class Engine(Choice):
    """Which backbone runs the thinker (`clef score --engine`)."""

    hf = "hf"
    vllm = "vllm"
