"""Splitting gold records into folds so that identical prompts (hence identical stored states)
never sit on both sides of a split."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TypeVar

import numpy as np

from clef_cli.quality.train.fit import Example

Item = TypeVar("Item", bound=Example)


def assign_folds(examples: Sequence[Example], folds: int, seed: int) -> list[int]:
    """Fold of each example: groups of identical input ids (identical states) are shuffled with
    `seed` and dealt, largest first, to the fold with the fewest records."""
    groups: dict[str, list[int]] = {}
    for position, example in enumerate(examples):
        key = hashlib.sha256(np.asarray(example.stored.input_ids, dtype=np.int64).tobytes()).hexdigest()
        groups.setdefault(key, []).append(position)
    members = list(groups.values())
    order = np.random.default_rng(seed).permutation(len(members))
    order = sorted(order.tolist(), key=lambda group: -len(members[group]))  # stable: shuffled among equals
    assignment = [0] * len(examples)
    sizes = [0] * folds
    for group in order:
        fold = min(range(folds), key=lambda number: (sizes[number], number))
        sizes[fold] += len(members[group])
        for position in members[group]:
            assignment[position] = fold
    return assignment


def inner_split(examples: Sequence[Item], fraction: float, seed: int) -> tuple[list[Item], list[Item]]:
    """(training, validation): about `fraction` of the records, by duplicate group, for early
    stopping; no validation when fewer than 10 records or `fraction` is 0."""
    if fraction <= 0 or len(examples) < 10:
        return list(examples), []
    folds = assign_folds(examples, max(2, round(1 / fraction)), seed)
    training = [example for example, fold in zip(examples, folds, strict=True) if fold != 0]
    return training, [example for example, fold in zip(examples, folds, strict=True) if fold == 0]
