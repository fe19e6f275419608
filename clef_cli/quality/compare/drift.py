"""`clef compare OLD NEW`: what changed between two scoring runs of the same records.

Per question, over the records both runs scored: the answer distribution of each run, their
population stability index and Jensen–Shannon divergence, mean confidence, and the records whose
answer flipped. Records are joined on `record_key` when both files have that column, else on `id`;
a prompt held under several ids in one run (copies, which share one stored result) counts once.
Torch-free: it reads the Parquet that `clef score` wrote.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clef_cli.quality.labels.scored import ScoredFile, read_scored

PSI_SMOOTHING = 0.5
"""Added to every answer count before PSI's shares, so an answer absent from one run is finite."""


@dataclass
class QuestionDrift:
    question_id: str
    type: str
    options: list[str]
    old_confidence: np.ndarray
    new_confidence: np.ndarray
    """Top probability of each shared record in each run (for the report's histograms)."""
    document: dict[str, Any]


@dataclass
class Comparison:
    document: dict[str, Any]
    """The `--json` document."""
    questions: dict[str, QuestionDrift] = field(default_factory=dict)


def _keyed(scored: ScoredFile, join: str) -> tuple[dict[str, str], int]:
    """join key -> the first scored record id that has it, and how many later scored records
    repeat a key (copies of a prompt: `clef score` gives them the stored result of the first,
    so they carry its answers and count once)."""
    keys = scored.record_keys if join == "record_key" else scored.ids
    assert keys is not None
    found: dict[str, str] = {}
    copies = 0
    for key, record_id in zip(keys, scored.ids, strict=True):
        if key in found:
            copies += 1
        else:
            found[key] = record_id
    return found, copies


def distribution(answers: list[str], options: list[str]) -> dict[str, Any]:
    counts = {option: 0 for option in options}
    for answer in answers:
        counts[answer] += 1
    n = len(answers)
    return {"n": n, "counts": counts, "shares": {o: (c / n if n else 0.0) for o, c in counts.items()}}


def psi(old_counts: list[int], new_counts: list[int], alpha: float = PSI_SMOOTHING) -> float:
    """Σ_k (q_k − p_k) · ln(q_k / p_k), p = old and q = new shares smoothed as (c_k + α) / (n + α·K)."""
    k = len(old_counts)
    p = [(c + alpha) / (sum(old_counts) + alpha * k) for c in old_counts]
    q = [(c + alpha) / (sum(new_counts) + alpha * k) for c in new_counts]
    return float(sum((qk - pk) * math.log(qk / pk) for pk, qk in zip(p, q, strict=True)))


def js_divergence(p: list[float], q: list[float]) -> float:
    """½ KL(p ‖ m) + ½ KL(q ‖ m), m = (p + q) / 2, in bits (so within [0, 1])."""
    m = [(a + b) / 2 for a, b in zip(p, q, strict=True)]

    def kl(a: list[float]) -> float:
        return sum(x * math.log2(x / y) for x, y in zip(a, m, strict=True) if x > 0)

    return float(0.5 * kl(p) + 0.5 * kl(q))


def _options(old: ScoredFile, new: ScoredFile, question_id: str) -> tuple[str, list[str]]:
    """The question's type and options: the old run's option order, then any the new run adds."""
    seen: dict[str, None] = {}
    qtype = ""
    for scored in (old, new):
        for questions in scored.options.values():
            if question_id in questions:
                qtype = qtype or questions[question_id][0]
                seen.update(dict.fromkeys(questions[question_id][1]))
    return qtype, list(seen)


def _confidence(scored: ScoredFile, record_id: str, question_id: str) -> float:
    return float(max(scored.scores[record_id][question_id][0]))


def compare_question(
    old: ScoredFile,
    new: ScoredFile,
    shared: list[tuple[str, str, str]],
    question_id: str,
    join: str,
    counted: tuple[set[str], set[str]],
) -> tuple[QuestionDrift, list[dict[str, Any]]]:
    """`shared` is (key, old id, new id) for every record both runs scored; `counted` the ids
    that stand for their key in each run (a key's copies count once)."""
    qtype, options = _options(old, new, question_id)
    both = [(k, o, n) for k, o, n in shared if question_id in old.answers[o] and question_id in new.answers[n]]
    old_answers = [old.answers[o][question_id] for _, o, _ in both]
    new_answers = [new.answers[n][question_id] for _, _, n in both]
    old_conf = np.array([_confidence(old, o, question_id) for _, o, _ in both])
    new_conf = np.array([_confidence(new, n, question_id) for _, _, n in both])
    flips = []
    for (key, old_id, new_id), before, after, c_old, c_new in zip(
        both, old_answers, new_answers, old_conf, new_conf, strict=True
    ):
        if before != after:
            where = {"id": old_id} if join == "id" else {"record_key": key, "id": new_id}
            flips.append({**where, "question_id": question_id, "old_answer": before, "new_answer": after,
                          "old_confidence": float(c_old), "new_confidence": float(c_new)})  # fmt: skip
    old_dist, new_dist = distribution(old_answers, options), distribution(new_answers, options)
    in_both = {o for _, o, _ in both}, {n for _, _, n in both}
    document = {
        "type": qtype,
        "n": len(both),
        "flipped": len(flips),
        "flipped_share": len(flips) / len(both) if both else None,
        "psi": psi(list(old_dist["counts"].values()), list(new_dist["counts"].values())) if both else None,
        "js": js_divergence(list(old_dist["shares"].values()), list(new_dist["shares"].values())) if both else None,
        "old": {**old_dist, "mean_confidence": float(old_conf.mean()) if both else None},
        "new": {**new_dist, "mean_confidence": float(new_conf.mean()) if both else None},
        "only_old": _alone(old, question_id, options, counted[0] - in_both[0]),
        "only_new": _alone(new, question_id, options, counted[1] - in_both[1]),
    }
    return QuestionDrift(question_id, qtype, options, old_conf, new_conf, document), flips


def _alone(scored: ScoredFile, question_id: str, options: list[str], alone_ids: set[str]) -> dict[str, Any]:
    """The distribution over the records only this run answered this question for."""
    answers = [
        questions[question_id]
        for record_id, questions in scored.answers.items()
        if question_id in questions and record_id in alone_ids
    ]
    return distribution(answers, options)


def compare(old_path: Path | str, new_path: Path | str) -> Comparison:
    old, new = read_scored(old_path), read_scored(new_path)
    join = "record_key" if old.record_keys is not None and new.record_keys is not None else "id"
    (old_keys, old_copies), (new_keys, new_copies) = _keyed(old, join), _keyed(new, join)
    shared = [(key, old_keys[key], new_keys[key]) for key in old_keys if key in new_keys]
    counted = set(old_keys.values()), set(new_keys.values())
    question_ids = list(dict.fromkeys([q for s in (old, new) for qs in s.answers.values() for q in qs]))
    comparison = Comparison({})
    flips: list[dict[str, Any]] = []
    for question_id in question_ids:
        drift, found = compare_question(old, new, shared, question_id, join, counted)
        comparison.questions[question_id] = drift
        flips.extend(found)
    comparison.document = {
        "join": join,
        "old": {"path": str(old.path), "sha256": old.sha256, "records": len(old_keys), "copies": old_copies},
        "new": {"path": str(new.path), "sha256": new.sha256, "records": len(new_keys), "copies": new_copies},
        "shared_records": len(shared),
        "only_old_records": len(old_keys) - len(shared),
        "only_new_records": len(new_keys) - len(shared),
        "questions": {qid: drift.document for qid, drift in comparison.questions.items()},
        "flips": flips,
    }
    return comparison


def above(comparison: Comparison, threshold: float) -> list[str]:
    """Questions whose PSI exceeds `threshold` (`--fail-above-psi`)."""
    questions = comparison.document["questions"].items()
    return [qid for qid, found in questions if found["psi"] is not None and found["psi"] > threshold]


def no_shared_records(comparison: Comparison) -> str | None:
    """Why nothing was compared, when the runs share no scored record (then no PSI can pass)."""
    document = comparison.document
    if document["shared_records"]:
        return None
    return (
        f"the two runs share no scored record (joined on {document['join']}; {document['old']['records']:,} in old, "
        f"{document['new']['records']:,} in new): nothing was compared"
    )


def drift_failure(comparison: Comparison, threshold: float) -> str | None:
    """`--fail-above-psi`: why the drift check fails (no shared record, or PSI above `threshold`)."""
    if no_shared_records(comparison):
        return "no shared record, so the drift check cannot pass"
    drifted = above(comparison, threshold)
    return f"PSI above {threshold:g} for: {', '.join(drifted)}" if drifted else None
