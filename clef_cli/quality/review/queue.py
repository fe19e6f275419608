"""`clef review`: which scored records people should look at first, in which order.

A question's confidence is its top probability; a record's is the minimum over its selected
questions, so one doubtful answer is enough to send the record to a person. Torch-free: it reads
the Parquet that `clef score` wrote.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from clef_cli.errors import UsageError
from clef_cli.quality.labels.scored import ScoredFile
from clef_cli.results import least_confidence

ORDERS = ("uncertainty", "margin", "entropy", "random", "stratified")


@dataclass(frozen=True)
class ReviewQuestion:
    question_id: str
    type: str
    option_ids: tuple[str, ...]
    probabilities: tuple[float, ...]
    answer: str
    """The answer clef gave (as in the scored file)."""

    @property
    def confidence(self) -> float:
        return max(self.probabilities)

    @property
    def margin(self) -> float:
        """Top probability minus the second (the top itself for a one-option question)."""
        top = sorted(self.probabilities, reverse=True)
        return top[0] - (top[1] if len(top) > 1 else 0.0)

    @property
    def entropy(self) -> float:
        """−Σ p ln p in nats (0 ln 0 = 0), summed exactly (math.fsum), so ties do not depend on
        the options' order."""
        return -math.fsum(p * math.log(p) for p in self.probabilities if p > 0)

    @property
    def probability(self) -> float:
        """The probability of the answer clef gave."""
        return self.probabilities[self.option_ids.index(self.answer)]


@dataclass(frozen=True)
class ReviewRecord:
    id: str
    index: int
    """`record_index` in the scored file: the tie-breaker of every order."""
    questions: tuple[ReviewQuestion, ...]
    """The selected questions the record has, in the record's order."""

    @property
    def confidence(self) -> float:
        return least_confidence(question.probabilities for question in self.questions)

    @property
    def margin(self) -> float:
        return min(question.margin for question in self.questions)

    @property
    def entropy(self) -> float:
        return max(question.entropy for question in self.questions)


def question_ids(scored: ScoredFile) -> list[str]:
    """Every question id of the scored records, in first-seen order."""
    seen: dict[str, None] = {}
    for record_id in scored.ids:
        for question_id in scored.options.get(record_id, {}):
            seen.setdefault(question_id)
    return list(seen)


def selected_questions(scored: ScoredFile, wanted: Sequence[str] | None) -> list[str]:
    """`--questions`: the given ids (each must be a question of the file), else all of them."""
    known = question_ids(scored)
    if not wanted:
        return known
    unknown = [question_id for question_id in wanted if question_id not in known]
    if unknown:
        raise UsageError(
            f"--questions: {', '.join(map(repr, unknown))} is not a question of the scored file "
            f"(its questions: {', '.join(known)})"
        )
    return list(dict.fromkeys(wanted))


def candidates(scored: ScoredFile, questions: Sequence[str], exclude: Collection[str] = ()) -> list[ReviewRecord]:
    """Scored records with at least one selected question and not in `exclude`, by record_index;
    a prompt held under several ids (the same `record_key`) once, under its first id, and left
    out when `exclude` names any of its ids."""
    wanted = set(questions)
    key_of = dict(zip(scored.ids, scored.record_keys, strict=True)) if scored.record_keys is not None else {}
    excluded = set(exclude)
    seen = _keys(key_of, excluded)  # a labelled prompt's copies are labelled too
    found = []
    for index, record_id in sorted(zip(scored.indices, scored.ids, strict=True)):
        key = key_of.get(record_id)
        if record_id in excluded or key in seen:
            continue
        chosen = tuple(
            ReviewQuestion(
                question_id,
                qtype,
                option_ids,
                tuple(scored.scores[record_id][question_id][0]),
                scored.answers[record_id][question_id],
            )
            for question_id, (qtype, option_ids) in scored.options[record_id].items()
            if question_id in wanted
        )
        if chosen:
            found.append(ReviewRecord(record_id, index, chosen))
            if key is not None:
                seen.add(key)
    return found


def _keys(key_of: dict[str, str], ids: Collection[str]) -> set[str]:
    return {key_of[record_id] for record_id in ids if record_id in key_of}


def copies(scored: ScoredFile, records: Sequence[ReviewRecord]) -> int:
    """How many other scored ids hold the prompts of `records` (queued once, under one id)."""
    if scored.record_keys is None:
        return 0
    queued = _keys(dict(zip(scored.ids, scored.record_keys, strict=True)), [r.id for r in records])
    return sum(key in queued for key in scored.record_keys) - len(records)


def ordered(records: Sequence[ReviewRecord], order: str, first_question: str, seed: int = 0) -> list[ReviewRecord]:
    """`records` in review order (one of ORDERS); every tie goes to the smaller record_index."""
    if order not in ORDERS:
        raise UsageError(f"--order {order!r}: use one of {', '.join(ORDERS)}")
    if order == "uncertainty":
        return sorted(records, key=lambda record: (record.confidence, record.index))
    if order == "margin":
        return sorted(records, key=lambda record: (record.margin, record.index))
    if order == "entropy":
        return sorted(records, key=lambda record: (-record.entropy, record.index))
    if order == "random":
        by_index = sorted(records, key=lambda record: record.index)
        return [by_index[position] for position in np.random.default_rng(seed).permutation(len(by_index))]
    return stratified(records, first_question)


def stratified(records: Sequence[ReviewRecord], question_id: str) -> list[ReviewRecord]:
    """Round-robin over the answers clef gave to `question_id` (records without it form one more
    group), least confident first within each group; groups take turns in the order of their
    least confident record."""
    groups: dict[str | None, list[ReviewRecord]] = {}
    for record in sorted(records, key=lambda record: (record.confidence, record.index)):
        answer = next((q.answer for q in record.questions if q.question_id == question_id), None)
        groups.setdefault(answer, []).append(record)
    queues = list(groups.values())
    result = []
    for turn in range(max((len(queue) for queue in queues), default=0)):
        result.extend(queue[turn] for queue in queues if turn < len(queue))
    return result


def select(
    scored: ScoredFile,
    questions: Sequence[str] | None = None,
    order: str = "uncertainty",
    limit: int | None = None,
    exclude: Collection[str] = (),
    seed: int = 0,
) -> tuple[list[ReviewRecord], list[str]]:
    """The records to review, in order, at most `limit`; and the selected question ids."""
    chosen = selected_questions(scored, questions)
    records = ordered(candidates(scored, chosen, exclude), order, chosen[0] if chosen else "", seed)
    return (records if limit is None else records[:limit]), chosen
