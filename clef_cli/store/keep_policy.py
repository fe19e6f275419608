"""Which records keep their hidden states (`--hidden-states keep | selective | drop`).

The learning loop reads few states: `clef review` sends the least certain records to people,
their labels come back as gold, and train-head reads the states of those gold records only. So
`selective` keeps the states of records whose confidence is below `--keep-below` (confidence as
`clef review`'s default order defines it: a question's top probability, a record's minimum over
its questions), plus a deterministic sample of the rest (`--keep-sample`), chosen by a hash of
the record key so that every rerun, engine and machine chooses the same records.

A record stored without states is computed again only when states are needed: by a `keep` run
(as before), by `--rehead` and by train-head `--records` (engines/on_demand.py). A `selective` or
`drop` run reuses a stored result as it is, with or without its states.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from clef_cli.choices import DEFAULT_KEEP_BELOW, DEFAULT_KEEP_SAMPLE
from clef_cli.results import ScoredRecord, least_confidence

if TYPE_CHECKING:
    import torch

    from clef_cli.model.scoring import BatchOutcome
    from clef_cli.store.hidden_store import HiddenPayload

KEEP, SELECTIVE, DROP = "keep", "selective", "drop"
SAMPLE_SALT = b"clef.keep-sample.v1:"


def record_confidence(result: ScoredRecord) -> float:
    """The record's confidence exactly as `clef review --order uncertainty` (its default) sorts
    by it (`results.least_confidence`, the one definition both use)."""
    return least_confidence(question.probabilities for question in result.questions)


def sample_point(key: str) -> float:
    """The record key's place in [0, 1): the first 8 bytes of a salted SHA-256 (the key is
    itself a SHA-256 hex, so this only decorrelates the sample from the key index's order)."""
    digest = hashlib.sha256(SAMPLE_SALT + key.encode("ascii")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def in_sample(key: str | None, fraction: float) -> bool:
    return key is not None and fraction > 0 and sample_point(key) < fraction


@dataclass(frozen=True)
class KeepPolicy:
    """What a run keeps; `sampled` holds one byte per record position (1: in the sample), made
    once from the job's ledger so that an engine without the keys (a Ray actor) chooses alike."""

    mode: str = KEEP
    below: float = DEFAULT_KEEP_BELOW
    sample: float = DEFAULT_KEEP_SAMPLE
    sampled: bytes = b""

    @property
    def stores_any(self) -> bool:
        return self.mode != DROP

    def keeps(self, result: ScoredRecord) -> bool:
        if self.mode != SELECTIVE:
            return self.mode == KEEP
        if result.index < len(self.sampled) and self.sampled[result.index]:
            return True
        return record_confidence(result) < self.below

    def rows(self, results: Sequence[ScoredRecord]) -> list[int]:
        """Positions in `results` (one forward's scored records) whose states are kept."""
        return [row for row, result in enumerate(results) if self.keeps(result)]


def sample_flags(keyed: Iterable[tuple[int, str | None]], total: int, fraction: float) -> bytes:
    """One byte per record position: 1 when its key falls in the sample."""
    flags = bytearray(total)
    if fraction > 0:
        for position, key in keyed:
            if position < total and in_sample(key, fraction):
                flags[position] = 1
    return bytes(flags)


def stored_fraction(mode: str, below_fraction: float | None, sample: float) -> tuple[float, float]:
    """(low, high) fraction of the records whose states a policy stores. For `selective`, when the
    fraction of records under the threshold is known (measured on results already in the store),
    low = high = below + (1 - below) * sample; unknown, it lies between the sample and every record."""
    if mode == KEEP:
        return 1.0, 1.0
    if mode == DROP:
        return 0.0, 0.0
    if below_fraction is None:
        return sample, 1.0
    expected = below_fraction + (1 - below_fraction) * sample
    return expected, expected


def fraction_below(results: pa.Table, below: float) -> float | None:
    """Of the scored rows of a results table (a store's), the fraction whose confidence (review's,
    from the stored probabilities) is under `below`; None without scored rows."""
    answers = results.filter(results.column("error").is_null()).column("answers").to_pylist()
    confidences = [
        least_confidence([label["probability"] for label in answer["labels"]] for answer in record)
        for record in answers
        if record
    ]
    if not confidences:
        return None
    return sum(confidence < below for confidence in confidences) / len(confidences)


def split_outcome(policy: KeepPolicy, outcome: BatchOutcome, dtype: torch.dtype) -> Split:
    """One forward's scored records split into those whose states are kept (with their shard
    payload, None when none are) and the rest, which are committed without states."""
    from clef_cli.store.hidden_store import hidden_payload

    if not outcome.records or not policy.stores_any:
        return Split(None, [], list(outcome.scored))
    assert outcome.hidden_states is not None
    rows = policy.rows(outcome.scored)
    if not rows:
        return Split(None, [], list(outcome.scored))
    if len(rows) == len(outcome.records):
        return Split(hidden_payload(outcome.records, outcome.hidden_states, dtype), list(outcome.scored), [])
    chosen = set(rows)
    records = [outcome.records[row] for row in rows]
    states = outcome.hidden_states[rows]  # only the kept rows cross to the CPU
    kept = [outcome.scored[row] for row in rows]
    rest = [result for row, result in enumerate(outcome.scored) if row not in chosen]
    return Split(hidden_payload(records, states, dtype), kept, rest)


@dataclass(frozen=True)
class Split:
    hidden: HiddenPayload | None
    kept: list[ScoredRecord]
    """Scored records committed with their states (in `hidden`)."""
    rest: list[ScoredRecord]
    """Scored records committed without."""


MEASURED_ROWS = 100_000
"""Latest stored results read to measure the share under the threshold (a store of millions is not read whole)."""


def selective_share(
    policy: str, keep_below: float, keep_sample: float, stored: Callable[[], pa.Table]
) -> tuple[float, str]:
    """The share of records whose states the run stores under `policy` (`--hidden-states`), for
    the disk guard (the lower bound: what will surely be written), and how it was found, for its
    message. `selective` counts the share of the store's latest results under `keep_below` when it
    has some; else only the `keep_sample`. `stored` gives the store's results, read only for
    `selective` (a big store maps many shards)."""
    if policy != SELECTIVE:
        return stored_fraction(policy, None, 0.0)[0], ""
    below = measured_below(stored(), keep_below)
    low, _ = stored_fraction(SELECTIVE, below, keep_sample)
    if below is None:
        return low, f" (selective: at least its {keep_sample:.0%} sample; no stored results to measure more)"
    return low, f" (selective: {low:.1%} of the records, as {below:.1%} of the store's results are under the threshold)"


def measured_below(stored: pa.Table, below: float) -> float | None:
    """`fraction_below` over the store's latest `MEASURED_ROWS` results."""
    return fraction_below(stored.slice(max(0, stored.num_rows - MEASURED_ROWS)), below)
