"""From one question's option logits to probabilities and an answer.

The per-option probabilities and logits are the product; the answer and its confidence are a
convenience whose formula differs between servers, so it is computed here in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clef_cli.inputs.records import Question

if TYPE_CHECKING:  # torch is imported where logits are turned into probabilities, not to derive answers
    import torch


@dataclass(frozen=True)
class QuestionResult:
    question_id: str
    type: str
    option_ids: tuple[str, ...]
    """Head order: noul true, false; choice sorted; score levels "0".."n-1"."""
    logits: tuple[float, ...]
    probabilities: tuple[float, ...]
    answer: str
    """noul "true"/"false"; choice the chosen option; score the most probable level."""
    confidence: float
    noul: float | None
    """P(true) for noul questions."""
    score: float | None
    """Expected level sum(i * p_i) for score questions."""

    def probability(self, option_id: str) -> float:
        return self.probabilities[self.option_ids.index(option_id)]


def _first_best(option_ids: Sequence[str], probabilities: dict[str, float]) -> str:
    """The most probable option; ties go to the first in `option_ids`."""
    best = option_ids[0]
    for option_id in option_ids[1:]:
        if probabilities[option_id] > probabilities[best]:
            best = option_id
    return best


@dataclass(frozen=True)
class Answer:
    answer: str
    confidence: float
    noul: float | None
    score: float | None


def derive_answer(
    qtype: str, option_ids: Sequence[str], probabilities: Sequence[float], tie_order: Sequence[str]
) -> Answer:
    """The answer, confidence, noul and score from probabilities in head order.

    `tie_order` decides ties for choice questions (the record's criteria order); noul and score
    break ties in head order. Also used to recalibrate a written output (`--calibration`)."""
    by_id = dict(zip(option_ids, probabilities, strict=True))
    noul = score = None
    if qtype == "noul":
        noul = by_id["true"]
        answer = _first_best(option_ids, by_id)
    elif qtype == "choice":
        answer = _first_best(tie_order, by_id)
    else:
        score = sum(level * p for level, p in enumerate(probabilities))
        answer = _first_best(option_ids, by_id)
    return Answer(answer=answer, confidence=by_id[answer], noul=noul, score=score)


def question_result(question: Question, logits: torch.Tensor) -> QuestionResult:
    import torch

    logits = logits.detach().float().cpu()
    probabilities = torch.softmax(logits, dim=-1).tolist()
    derived = derive_answer(question.type, question.option_ids, probabilities, question.criteria_order)
    return QuestionResult(
        question_id=question.id,
        type=question.type,
        option_ids=question.option_ids,
        logits=tuple(logits.tolist()),
        probabilities=tuple(probabilities),
        answer=derived.answer,
        confidence=derived.confidence,
        noul=derived.noul,
        score=derived.score,
    )


def systemone_answer(question: Question, result: QuestionResult, digits: int = 4) -> dict[str, Any]:
    """The answer object of the SystemOne API shape (rounded, criteria in the record's order)."""
    if question.type == "noul":
        return {"type": "noul", "noul": round(result.noul or 0.0, digits)}
    probabilities = {option_id: round(result.probability(option_id), digits) for option_id in question.criteria_order}
    if question.type == "choice":
        return {
            "type": "choice",
            "choice": result.answer,
            "confidence": round(result.confidence, digits),
            "probabilities": probabilities,
        }
    return {
        "type": "score",
        "score": round(result.score or 0.0, digits),
        "confidence": round(result.confidence, digits),
        "legend": {level: description for level, description in question.options},
        "probabilities": probabilities,
    }
