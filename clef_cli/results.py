"""The Arrow form of results: one row per record, the column names downstream jobs rely on.

Checkpoint shards store exactly these rows, so the final output is a reordering of committed
shards (plus pass-through columns), never a recomputation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import unquote

import pyarrow as pa

from clef_cli.errors import UsageError

if TYPE_CHECKING:
    from clef_cli.model.answers import QuestionResult


@dataclass(frozen=True)
class ScoredRecord:
    record_id: str
    index: int
    prompt_tokens: int
    state_tokens_cut: int
    questions: tuple[QuestionResult, ...]


@dataclass(frozen=True)
class FailedRecord:
    """A record that produced no scores: its place in the output and why."""

    record_id: str | None
    """None for a record whose id cannot be read (the row's id is null)."""
    index: int
    error: str
    prompt_tokens: int | None = None
    kind: str = "invalid"
    """One of `errors.ERROR_KINDS`."""


@dataclass(frozen=True)
class OutputCounts:
    records: int
    failed: int
    failed_by_kind: dict[str, int] = field(default_factory=dict)
    """error_kind -> failed rows of that kind (they add up to `failed`)."""
    first_errors: tuple[tuple[str | None, str], ...] = ()
    """(id, error) of the first failed rows in input order (id None: one that could not be read)."""
    states_cut: int = 0
    """Rows whose state was cut to fit the prompt budget (`state_tokens_cut` above 0)."""


@dataclass
class RunCounts:
    """What one run did with its records (docs/scoring.md, "Counts"): every record is exactly one of
    run (its prompt computed this run: new, retried or missing its hidden states), reused (its
    key's result came from the store), duplicate (a later copy of a key earlier in this job) or
    invalid (no prompt: the record itself is wrong)."""

    records: int = 0
    run: int = 0
    reused: int = 0
    duplicates: int = 0
    retried: int = 0
    """Of `run`: keys whose stored result was a transient error."""
    unhidden: int = 0
    """Of `run`: keys stored without the hidden states this run keeps."""
    invalid: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


FIRST_ERRORS = 5


def failures_of(results: pa.Table) -> tuple[dict[str, int], tuple[tuple[str | None, str], ...]]:
    """The failed rows of `results` counted by error kind, and the first few (id, error) in input
    order: what a run's summary says about why records failed."""
    import pyarrow.compute as pc

    failed = results.filter(results.column("error").is_valid())
    kinds = pc.value_counts(failed.column("error_kind")).to_pylist()
    by_kind = {entry["values"] or "unknown": entry["counts"] for entry in kinds}
    first = failed.take(pc.sort_indices(failed, sort_keys=[("record_index", "ascending")])[:FIRST_ERRORS])
    pairs = zip(first.column("id").to_pylist(), first.column("error").to_pylist(), strict=True)
    return dict(sorted(by_kind.items())), tuple((record_id, str(error)) for record_id, error in pairs)


LABEL_TYPE = pa.struct([("label", pa.string()), ("probability", pa.float64()), ("logit", pa.float64())])
ANSWER_TYPE = pa.struct(
    [
        ("question_id", pa.string()),
        ("type", pa.string()),
        ("answer", pa.string()),
        ("confidence", pa.float64()),
        ("noul", pa.float64()),
        ("score", pa.float64()),
        ("labels", pa.list_(LABEL_TYPE)),
    ]
)
RESULT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("record_index", pa.int64()),
        ("prompt_tokens", pa.int32()),
        ("state_tokens_cut", pa.int32()),
        ("error", pa.string()),
        ("error_kind", pa.string()),
        ("answers", pa.list_(ANSWER_TYPE)),
        ("record_key", pa.string()),
    ]
)
LONG_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("record_index", pa.int64()),
        ("question_id", pa.string()),
        ("type", pa.string()),
        ("label", pa.string()),
        ("probability", pa.float64()),
        ("logit", pa.float64()),
        ("error", pa.string()),
        ("error_kind", pa.string()),
        ("record_key", pa.string()),
    ]
)


def scored_row(result: ScoredRecord) -> dict[str, object]:
    return {
        "id": result.record_id,
        "record_index": result.index,
        "prompt_tokens": result.prompt_tokens,
        "state_tokens_cut": result.state_tokens_cut,
        "error": None,
        "error_kind": None,
        "answers": [
            {
                "question_id": question.question_id,
                "type": question.type,
                "answer": question.answer,
                "confidence": question.confidence,
                "noul": question.noul,
                "score": question.score,
                "labels": [
                    {"label": label, "probability": probability, "logit": logit}
                    for label, probability, logit in zip(
                        question.option_ids, question.probabilities, question.logits, strict=True
                    )
                ],
            }
            for question in result.questions
        ],
    }


def failed_row(failure: FailedRecord) -> dict[str, object]:
    return {
        "id": failure.record_id,
        "record_index": failure.index,
        "prompt_tokens": failure.prompt_tokens,
        "state_tokens_cut": None,
        "error": failure.error,
        "error_kind": failure.kind,
        "answers": None,
    }


def results_table(scored: Sequence[ScoredRecord] = (), failed: Sequence[FailedRecord] = ()) -> pa.Table:
    rows = [scored_row(result) for result in scored] + [failed_row(failure) for failure in failed]
    return pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)


def long_rows(table: pa.Table) -> pa.Table:
    """One row per (record, question, label); a failed record keeps one row with its error."""
    rows = []
    for record in table.to_pylist():
        if not record["answers"]:
            rows.append(
                {
                    "id": record["id"],
                    "record_index": record["record_index"],
                    "error": record["error"],
                    "error_kind": record["error_kind"],
                    "record_key": record["record_key"],
                }
            )
            continue
        for answer in record["answers"]:
            for label in answer["labels"]:
                rows.append(
                    {
                        "id": record["id"],
                        "record_index": record["record_index"],
                        "question_id": answer["question_id"],
                        "type": answer["type"],
                        "label": label["label"],
                        "probability": label["probability"],
                        "logit": label["logit"],
                        "error": None,
                        "error_kind": None,
                        "record_key": record["record_key"],
                    }
                )
    return pa.Table.from_pylist(rows, schema=LONG_SCHEMA)


FLAT_FIELDS = ("answer", "confidence", "p")
"""The flat layout's columns per question: `QID.answer`, `QID.confidence`, `QID.p.OPTION`."""
FLAT_MAX_COLUMNS = 10_000
"""More question columns than a person (or a spreadsheet) reads: such a job wants wide or long."""


def flat_part(name: str) -> str:
    """A question id or option id as a piece of a flat column name: letters, digits, `_` and `-`
    stay; every other character (`.`, `%`, spaces, punctuation) is `%XX` per UTF-8 byte, as in a
    URL, and an empty id is `%`. So `.` only ever separates the pieces and no two ids meet."""
    if not name:
        return "%"
    return "".join(c if c.isalnum() or c in "_-" else "".join(f"%{b:02X}" for b in c.encode()) for c in name)


def flat_id(part: str) -> str:
    """The id a `flat_part` stands for (`%` is the empty id)."""
    return "" if part == "%" else unquote(part, errors="strict")


@dataclass
class FlatColumns:
    """The flat layout's question columns: every (question id, option) of the job's results, in
    the order first met, gathered from the results before any row is written."""

    options: dict[str, dict[str, None]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    """Question id -> its type (noul, choice, score): with it the file is read back exactly
    (quality/labels/scored.py), each record's options in head order."""

    def add(self, table: pa.Table) -> None:
        import pyarrow.compute as pc

        answers = pc.list_flatten(table.column("answers"))
        if len(answers) == 0:
            return
        labels = pc.struct_field(answers, "labels")
        owners = pc.take(pc.struct_field(answers, "question_id"), pc.list_parent_indices(labels))
        question_ids = pc.struct_field(answers, "question_id").to_pylist()
        for question_id, kind in zip(question_ids, pc.struct_field(answers, "type").to_pylist(), strict=True):
            self.options.setdefault(question_id, {})
            self.types.setdefault(question_id, kind)
        flat_labels = pc.struct_field(pc.list_flatten(labels), "label")
        for question_id, label in zip(owners.to_pylist(), flat_labels.to_pylist(), strict=True):
            self.options[question_id].setdefault(label, None)

    def described(self) -> list[tuple[str, str, str, str | None]]:
        """(column, question id, field, option) of every question column, in order."""
        columns: list[tuple[str, str, str, str | None]] = []
        for question_id, options in self.options.items():
            stem = flat_part(question_id)
            columns += [(f"{stem}.answer", question_id, "answer", None)]
            columns += [(f"{stem}.confidence", question_id, "confidence", None)]
            columns += [(f"{stem}.p.{flat_part(option)}", question_id, "p", option) for option in options]
        return columns

    def schema(self) -> pa.Schema:
        described = self.described()
        if len(described) > FLAT_MAX_COLUMNS:
            raise UsageError(
                f"--layout flat: the job's questions make {len(described):,} columns (at most "
                f"{FLAT_MAX_COLUMNS:,}); write --layout wide or long (the results are in the store)"
            )
        fields = [pa.field("id", pa.string()), pa.field("error", pa.string())]
        for column, _, name, _ in described:
            fields.append(pa.field(column, pa.string() if name == "answer" else pa.float64()))
        return pa.schema(fields)

    def metadata(self) -> str:
        """`clef.flat_columns`: which question (and option) each column holds, and the
        question's type, as JSON."""
        return json.dumps(
            [
                {"column": c, "question_id": q, "field": f, "option": o, "type": self.types.get(q)}
                for c, q, f, o in self.described()
            ],
            ensure_ascii=False,
        )


def flat_rows(table: pa.Table, columns: FlatColumns) -> pa.Table:
    """One row per record, a column per question's answer, confidence and option probability
    (null where the record has no such question or option, and for a failed record)."""
    described = columns.described()
    rows = []
    for record in table.select(["id", "error", "answers"]).to_pylist():
        row: dict[str, object] = {"id": record["id"], "error": record["error"]}
        for answer in record["answers"] or ():
            stem = flat_part(answer["question_id"])
            row[f"{stem}.answer"] = answer["answer"]
            row[f"{stem}.confidence"] = answer["confidence"]
            for label in answer["labels"]:
                row[f"{stem}.p.{flat_part(label['label'])}"] = label["probability"]
        rows.append(row)
    names = ["id", "error", *(column for column, _, _, _ in described)]
    return pa.Table.from_pylist([{name: row.get(name) for name in names} for row in rows], schema=columns.schema())


def least_confidence(probabilities: Iterable[Iterable[float]]) -> float:
    """A record's confidence as `clef review`'s default order ranks it, and as `--hidden-states
    selective` keeps it: each question's top probability, the least over the record's questions
    (one doubtful answer is enough to send a record to a person)."""
    return min(max(question) for question in probabilities)
