"""Temperature scaling on the logits, p' = softmax(logit / T): fitting, choosing, saving, applying.

A scalar T > 0 never changes which option is most probable, only how sure the model says it is,
so a calibration can be applied to a finished job's output without running the model again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from clef_cli.errors import UsageError
from clef_cli.inputs.json_values import shown, unreadable_json
from clef_cli.quality import metrics
from clef_cli.quality.labels.scored import QuestionData, softmax

METHODS = ("none", "global", "type", "question")
T_BOUNDS = (0.02, 50.0)
"""The range the temperature is searched in; a fit that ends on an edge is reported (`at_bound`)."""
LOG_T_BOUNDS = (math.log(T_BOUNDS[0]), math.log(T_BOUNDS[1]))
TEMPERATURE_RANGE = (1e-3, 1e3)
"""The temperatures a calibration may hold, ends included; anything else (0, negative, NaN,
infinite, 1e-310) is refused. It holds the search range with room for a hand-edited T (0.01,
200), while below 1e-3 or above 1e3 a temperature only makes every answer certain or every answer
a coin toss; and a float32 logit (at most 3.4e38) divided by 1e-3 stays finite in float64, so no
probability computed with such a T is ever NaN."""
AT_BOUND = 1e-3
"""|ln T − ln bound| below this counts as on the edge (the bounded search stops within ~1e-5)."""
SHRINK_RECORDS = 50
"""`question`: log T_q = (n_q log T̂_q + 50 log T_type) / (n_q + 50)."""
FOLDS = 5
FOLD_SEED = 0
VERSION = 1


@dataclass
class Calibration:
    method: str
    temperatures: dict[str, float] = field(default_factory=dict)
    type_temperatures: dict[str, float] = field(default_factory=dict)
    default: float = 1.0
    fitted_on: dict[str, Any] = field(default_factory=dict)
    cross_fitted: dict[str, Any] = field(default_factory=dict)
    at_search_bound: list[str] = field(default_factory=list)
    """The temperatures that ended on an edge of T_BOUNDS (see `at_bound`)."""
    sha256: str | None = None
    """Of the file it was loaded from."""

    def __post_init__(self) -> None:
        """A calibration never holds a temperature outside TEMPERATURE_RANGE (a fit cannot make
        one: it searches T_BOUNDS, inside it), so none can write or apply one."""
        for name, value in named_temperatures(self).items():
            if temperature_problem(value) is not None:
                raise UsageError(f"calibration temperature {name}: {temperature_problem(value)}")

    def temperature(self, question_id: str, qtype: str) -> float:
        if question_id in self.temperatures:
            return self.temperatures[question_id]
        return self.type_temperatures.get(qtype, self.default)

    def as_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "method": self.method,
            "temperatures": self.temperatures,
            "type_temperatures": self.type_temperatures,
            "default": self.default,
            "fitted_on": self.fitted_on,
            "cross_fitted": self.cross_fitted,
            "at_search_bound": self.at_search_bound,
        }


def load_calibration(path: Path | str) -> Calibration:
    """Read a CAL.json written by `clef calibrate`; anything else, or a temperature outside
    TEMPERATURE_RANGE, is a usage error naming the file and the temperature."""
    from clef_cli.inputs.sources import local_copy
    from clef_cli.release import file_sha256

    local = local_copy(path, "--calibration")  # a path or a URI: an object is read into a local copy
    try:
        data = json.loads(local.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"calibration {str(path)!r} could not be read: {unreadable_json(exc)}") from exc
    if not isinstance(data, dict) or data.get("version") != VERSION or data.get("method") not in METHODS:
        raise UsageError(f"calibration {str(path)!r} is not a version {VERSION} file written by `clef calibrate`")
    found: dict[str, dict[str, float]] = {}
    for key, what in (("temperatures", "question"), ("type_temperatures", "type")):
        given = data.get(key, {})
        if not isinstance(given, dict):
            raise UsageError(f"calibration {str(path)!r}: {key} must be an object, not {shown(given)}")
        found[key] = {name: _checked(path, f"{what} {name!r}", value) for name, value in given.items()}
    return Calibration(
        method=data["method"],
        temperatures=found["temperatures"],
        type_temperatures=found["type_temperatures"],
        default=_checked(path, "default", data.get("default")),
        fitted_on=data.get("fitted_on", {}),
        cross_fitted=data.get("cross_fitted", {}),
        at_search_bound=[str(name) for name in data.get("at_search_bound", [])],
        sha256=file_sha256(local),
    )


def temperature_problem(value: object) -> str | None:
    """Why `value` cannot be a temperature (a number in TEMPERATURE_RANGE), or None."""
    low, high = TEMPERATURE_RANGE
    wanted = f"must be a number from {low:g} to {high:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{wanted}, not {shown(value)}"
    if not (low <= value <= high):  # NaN compares false; an int of any size compares exactly
        return f"{wanted}, not {shown(value)}"
    return None


def _checked(path: Path | str, name: str, value: object) -> float:
    problem = temperature_problem(value)
    if problem is not None:
        raise UsageError(f"calibration {str(path)!r}: temperature {name} {problem}")
    return float(value)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- fitting


def nll(log_t: float, items: Sequence[tuple[np.ndarray, np.ndarray]]) -> float:
    """Summed -ln softmax(logit / T)[gold] over (logits, gold) blocks."""
    total = 0.0
    for logits, gold in items:
        scaled = logits / math.exp(log_t)
        shifted = scaled - scaled.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(shifted).sum(axis=1))
        total += float(np.sum(log_norm - shifted[np.arange(len(gold)), gold]))
    return total


def fit_temperature(items: Sequence[tuple[np.ndarray, np.ndarray]]) -> float:
    """The T minimising the NLL of the gold labels, searched over log T (bounded Brent)."""
    from scipy.optimize import minimize_scalar

    if not any(len(gold) for _, gold in items):
        return 1.0
    found = minimize_scalar(nll, bounds=LOG_T_BOUNDS, args=(items,), method="bounded", options={"xatol": 1e-9})
    return float(math.exp(found.x))


def fit(method: str, questions: Mapping[str, QuestionData]) -> Calibration:
    """Fit one method on all of `questions` (no cross-fitting here)."""
    blocks = {qid: (data.logits, data.gold) for qid, data in questions.items()}
    if method == "none":
        return Calibration("none")
    overall = fit_temperature(list(blocks.values()))
    if method == "global":
        return Calibration("global", default=overall)
    types: dict[str, float] = {}
    for qtype in sorted({data.type for data in questions.values()}):
        types[qtype] = fit_temperature([blocks[q] for q, d in questions.items() if d.type == qtype])
    if method == "type":
        return Calibration("type", type_temperatures=types, default=overall)
    shrunk = {}
    for qid, data in questions.items():
        own, prior = math.log(fit_temperature([blocks[qid]])), math.log(types[data.type])
        shrunk[qid] = math.exp((data.n * own + SHRINK_RECORDS * prior) / (data.n + SHRINK_RECORDS))
    return Calibration("question", temperatures=shrunk, type_temperatures=types, default=overall)


def named_temperatures(calibration: Calibration) -> dict[str, float]:
    """Every temperature of a calibration by name: "default", "type noul", "question urgent"."""
    if calibration.method == "none":
        return {}
    named = {"default": calibration.default}
    named |= {f"type {name}": value for name, value in calibration.type_temperatures.items()}
    return named | {f"question {name}": value for name, value in calibration.temperatures.items()}


def at_bound(calibration: Calibration) -> list[str]:
    """The temperatures the search left on an edge of T_BOUNDS: the labels did not pin them down
    (too few, or answers wrong with full confidence), so T is the search's limit, not a fit."""
    return [
        name
        for name, value in named_temperatures(calibration).items()
        if min(abs(math.log(value) - bound) for bound in LOG_T_BOUNDS) < AT_BOUND
    ]


def apply(calibration: Calibration, data: QuestionData) -> np.ndarray:
    return softmax(data.logits / calibration.temperature(data.question_id, data.type))


# ----------------------------------------------------------------------------- cross-fitting


def folds_of(questions: Mapping[str, QuestionData], folds: int = FOLDS) -> dict[str, int]:
    """Each labelled record's fold (seeded shuffle, then round robin), so a record's questions stay together."""
    records = sorted({record_id for data in questions.values() for record_id in data.record_ids})
    if len(records) < 2:
        raise UsageError("calibration needs gold labels for at least 2 scored records")
    order = np.random.default_rng(FOLD_SEED).permutation(len(records))
    count = min(folds, len(records))
    return {records[index]: position % count for position, index in enumerate(order)}


def pooled(probabilities: Sequence[np.ndarray], gold: Sequence[np.ndarray], bins: int) -> dict[str, float]:
    """log_loss, brier and top-label ECE over every (record, question) label together."""
    pairs = list(zip(probabilities, gold, strict=True))
    losses = np.concatenate([-np.log(np.clip(p[np.arange(len(y)), y], metrics.LOG_LOSS_FLOOR, 1)) for p, y in pairs])
    briers = np.concatenate([np.sum((p - np.eye(p.shape[1])[y]) ** 2, axis=1) for p, y in pairs])
    top = np.concatenate([metrics.confidence(p) for p in probabilities])
    right = np.concatenate([(metrics.predicted(p) == y).astype(float) for p, y in pairs])
    index = metrics.bin_index(top, bins)
    ece = np.sum(np.abs(np.bincount(index, weights=right - top, minlength=bins))) / len(top)
    return {"log_loss": float(losses.mean()), "brier": float(briers.mean()), "ece": float(ece)}


def cross_fitted(method: str, questions: Mapping[str, QuestionData], bins: int = 15) -> dict[str, float]:
    """Metrics of `method` fitted on all folds of records but one and applied to that one, for every fold."""
    fold = folds_of(questions)
    held: dict[str, np.ndarray] = {qid: np.empty_like(data.probabilities) for qid, data in questions.items()}
    for current in sorted(set(fold.values())):
        train = {}
        for qid, data in questions.items():
            keep = np.array([fold[r] != current for r in data.record_ids], dtype=bool)
            if keep.any():
                train[qid] = data.subset(keep)
        fitted = fit(method, train)
        for qid, data in questions.items():
            out = np.array([fold[r] == current for r in data.record_ids], dtype=bool)
            if out.any():
                held[qid][out] = apply(fitted, data.subset(out))
    return pooled([held[q] for q in questions], [questions[q].gold for q in questions], bins)


@dataclass
class CalibrationRun:
    calibration: Calibration
    candidates: dict[str, dict[str, float]]
    """Cross-fitted metrics of every method tried (always "none", the uncalibrated baseline)."""
    improved: bool
    folds: int
    """Folds the cross-fitting used: 5, or one per record when fewer records are labelled."""


def calibrate(
    questions: Mapping[str, QuestionData], method: str = "auto", bins: int = 15, fitted_on: dict[str, Any] | None = None
) -> CalibrationRun:
    """Cross-fit the candidate methods, pick one (`auto`: lowest cross-fitted NLL, none unless
    something beats it), and fit it on all the labels."""
    if method not in ("auto", *METHODS):
        raise UsageError(f"--method must be auto, global, type or question, not {method!r}")
    tried = METHODS if method == "auto" else ("none", method)
    candidates = {name: cross_fitted(name, questions, bins) for name in tried}
    chosen = method
    if method == "auto":
        chosen = min(tried, key=lambda name: (candidates[name]["log_loss"], name != "none"))
    improved = candidates[chosen]["log_loss"] < candidates["none"]["log_loss"]
    calibration = fit(chosen, questions)
    calibration.at_search_bound = at_bound(calibration)
    calibration.fitted_on = fitted_on or {}
    calibration.cross_fitted = {"before": candidates["none"], "after": candidates[chosen]}
    return CalibrationRun(calibration, candidates, improved, folds=len(set(folds_of(questions).values())))


# ----------------------------------------------------------------------------- applying to an output


def scalar_softmax(logits: Sequence[float]) -> list[float]:
    """softmax with libm's `exp` and a left-to-right sum: the bytes a calibrated output holds must not
    depend on the CPU, and numpy's AVX-512 `exp` differs from libm's in the last bit (numpy on
    AVX2 uses libm, so both give these values there)."""
    top = max(logits)
    exps = [math.exp(logit - top) for logit in logits]
    total = 0.0
    for value in exps:
        total += value
    return [value / total for value in exps]


def calibrate_results(results: pa.Table, calibration: Calibration) -> pa.Table:
    """The result rows as `clef score --calibration` writes them: each `probability` recomputed as
    softmax(logit / T) and the answer, confidence, noul and score derived from it; `logit` stays raw.

    A choice tie keeps the answer first written (the record's criteria order decided it, and a
    positive T keeps ties tied)."""
    from clef_cli.model.answers import derive_answer

    if calibration.method == "none":
        return results
    rows = results.to_pylist()
    for row in rows:
        for answer in row["answers"] or ():
            labels = answer["labels"]
            option_ids = [label["label"] for label in labels]
            temperature = calibration.temperature(answer["question_id"], answer["type"])
            probabilities = scalar_softmax([label["logit"] / temperature for label in labels])
            tie_order = [answer["answer"], *(o for o in option_ids if o != answer["answer"])]
            derived = derive_answer(answer["type"], option_ids, probabilities, tie_order)
            for label, probability in zip(labels, probabilities, strict=True):
                label["probability"] = probability
            answer.update(answer=derived.answer, confidence=derived.confidence, noul=derived.noul, score=derived.score)
    return pa.Table.from_pylist(rows, schema=results.schema)
