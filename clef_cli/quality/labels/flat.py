"""A `--layout flat` output read back as the quality commands read the wide layout.

A flat file holds one row per record: `id`, `error`, and per question `QID.answer`,
`QID.confidence` and one `QID.p.OPTION` per option, its metadata `clef.flat_columns` saying which
question, option and question type each column holds (results.FlatColumns). That is all eval,
compare and review read: a record's questions are those with an answer, its options those with a
probability, in head order (noul: true, false; choice: sorted ids; score: levels in order), as
the wide layout lists them. The file keeps no logits; the log-probabilities stand for them, equal
to the logits less one constant per question, so softmax(logit / T) (what calibration fits and
applies) is the same at every temperature. A file written with `--calibration` holds calibrated
probabilities, whose logarithms are not that, so it is not calibrated again (`no_logits`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from clef_cli.errors import UsageError

QUESTION_TYPES = ("noul", "choice", "score")


@dataclass
class FlatRecords:
    """The scored records of a flat file, in file order (those with an `error` in `failed`)."""

    ids: list[str] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    options: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = field(default_factory=dict)
    scores: dict[str, dict[str, tuple[tuple[float, ...], tuple[float, ...]]]] = field(default_factory=dict)
    answers: dict[str, dict[str, str]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    columns: set[str] = field(default_factory=set)
    """clef's own columns (the rest were passed through with --keep-columns)."""


@dataclass(frozen=True)
class _Question:
    type: str
    answer: str
    options: tuple[tuple[str, str], ...]
    """(option id, its `p` column) in head order."""


def head_order(kind: str, options: list[str]) -> list[str]:
    """Option ids in the order the head (and the wide layout) lists them."""
    if kind == "noul":
        return [option for option in ("true", "false") if option in options]
    if kind == "score":
        return sorted(options, key=lambda level: int(level) if level.isdigit() else math.inf)
    return sorted(options)


def _questions(shown: str, described: Any) -> dict[str, _Question]:
    """The file's questions from `clef.flat_columns`; one without a type (a file written before
    clef recorded them) cannot be read exactly, so it is refused, saying what reads instead."""
    if not isinstance(described, list) or not all(isinstance(entry, dict) for entry in described):
        raise UsageError(f"scored file {shown!r}: its clef.flat_columns metadata is not clef's")
    found: dict[str, dict[str, Any]] = {}
    for entry in described:
        if entry.get("type") not in QUESTION_TYPES:
            raise UsageError(
                f"scored file {shown!r} is a --layout flat output that does not record its questions' types "
                "(written by an older clef); write it again with --layout wide from its checkpoint (the same "
                "`clef score` command with --layout wide runs nothing again)"
            )
        question = found.setdefault(entry["question_id"], {"type": entry["type"], "p": {}})
        if entry.get("field") == "p":
            question["p"][entry["option"]] = entry["column"]
        elif entry.get("field") in ("answer", "confidence"):
            question[entry["field"]] = entry["column"]
    return {
        qid: _Question(q["type"], q["answer"], tuple((o, q["p"][o]) for o in head_order(q["type"], list(q["p"]))))
        for qid, q in found.items()
        if "answer" in q
    }


def read_flat(shown: str, table: pa.Table, described_text: str) -> FlatRecords:
    """The records of a flat file, exactly as the wide layout of the same results reads."""
    try:
        described = json.loads(described_text)
    except ValueError:
        raise UsageError(f"scored file {shown!r}: its clef.flat_columns metadata is not JSON") from None
    questions = _questions(shown, described)
    found = FlatRecords(columns={"id", "error", *(entry["column"] for entry in described)})
    wanted = ["id", "error", *(entry["column"] for entry in described)]
    missing = [name for name in wanted if name not in table.column_names]
    if missing:
        raise UsageError(f"scored file {shown!r}: a --layout flat output without its column {missing[0]!r}")
    for number, row in enumerate(table.select(wanted).to_pylist()):
        record_id = str(row["id"])
        if row["error"] is not None:
            if row["id"] is not None:  # a null id (a record whose id could not be read) names no record
                found.failed.append(record_id)
            continue
        found.ids.append(record_id)  # an id in two rows is refused by the caller, as for the wide layout
        found.rows.append(number)
        mine = {qid: q for qid, q in questions.items() if row[q.answer] is not None}
        options = {qid: tuple((o, row[c]) for o, c in q.options if row[c] is not None) for qid, q in mine.items()}
        found.options[record_id] = {qid: (mine[qid].type, tuple(o for o, _ in pairs)) for qid, pairs in options.items()}
        found.scores[record_id] = {
            qid: (tuple(p for _, p in pairs), tuple(math.log(p) if p > 0 else -math.inf for _, p in pairs))
            for qid, pairs in options.items()
        }
        found.answers[record_id] = {qid: str(row[q.answer]) for qid, q in mine.items()}
    return found
