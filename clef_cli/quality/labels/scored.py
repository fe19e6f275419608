"""The Parquet that `clef score` wrote, read back as per-question arrays with their gold labels.

Wide, long and flat layouts are all accepted (flat: quality/labels/flat.py). Nothing here imports
torch: evaluating millions of labels must not need the model's stack.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from clef_cli.errors import UsageError
from clef_cli.inputs.sources import local_copy
from clef_cli.locations.uris import is_uri
from clef_cli.quality.labels.flat import read_flat
from clef_cli.quality.labels.gold import GoldSet, QuestionOptions
from clef_cli.release import file_sha256
from clef_cli.sizes import plural

Scores = tuple[tuple[float, ...], tuple[float, ...]]
"""(probabilities, logits) of one question of one record, in head order."""


@dataclass
class ScoredFile:
    path: Path | str
    """The file as the user named it: a local path or an object's URI."""
    sha256: str
    ids: list[str]
    """The scored records (those with answers), in file order; each id once."""
    options: dict[str, QuestionOptions]
    """record id -> its questions (type, option ids in head order)."""
    scores: dict[str, dict[str, Scores]]
    failed: list[str]
    """Ids of the failed rows (no answers); one may also be a scored record's id (a duplicate)."""
    columns: pa.Table
    """Columns passed through with --keep-columns (one row per record, in `ids` order)."""
    indices: list[int] = field(default_factory=list)
    """`record_index` of each record, in `ids` order."""
    answers: dict[str, dict[str, str]] = field(default_factory=dict)
    """record id -> question id -> the answer clef gave (wide: the `answer` cell; long: the most
    probable option, first in head order on ties)."""
    record_keys: list[str] | None = None
    """The `record_key` column (a stable key across runs), in `ids` order; None without one."""
    metadata: dict[str, str] = field(default_factory=dict)
    """The file's `clef.*` key-value metadata (model, head hash, ...)."""
    no_logits: str | None = None
    """Why the file's logits cannot be calibrated (a flat file written with --calibration), or None."""


@dataclass
class QuestionData:
    """One question over the records that have both a score and a gold label."""

    question_id: str
    type: str
    option_ids: tuple[str, ...]
    record_ids: list[str]
    probabilities: np.ndarray
    """(n, K) in head order."""
    logits: np.ndarray
    gold: np.ndarray
    """(n,) index of the gold option in `option_ids`."""

    @property
    def n(self) -> int:
        return len(self.record_ids)

    def subset(self, keep: np.ndarray) -> QuestionData:
        ids = [record_id for record_id, kept in zip(self.record_ids, keep, strict=True) if kept]
        return QuestionData(
            self.question_id,
            self.type,
            self.option_ids,
            ids,
            self.probabilities[keep],
            self.logits[keep],
            self.gold[keep],
        )


@dataclass
class Labelled:
    questions: dict[str, QuestionData]
    warnings: list[str] = field(default_factory=list)


def read_scored(path: Path | str) -> ScoredFile:
    """Read a `clef score` output; a file that is not one is a usage error with one line.

    Only scored records are records here: a failed row (an invalid record, a duplicate id) is
    listed in `failed` and nothing else, even when it carries the id of a scored row."""
    path = path if is_uri(path) else Path(path)  # a URI as given (Path() would fold its `//`)
    local = local_copy(path, "scored file")  # an object in a store: read once, into a local copy
    if not local.exists():  # else pyarrow's own words: "could not be read as Parquet: PATH"
        raise UsageError(f"scored file {str(path)!r} not found")
    try:
        table = pq.read_table(local)
    except (OSError, ValueError) as exc:
        raise UsageError(f"scored file {str(path)!r} could not be read as Parquet: {exc}") from exc
    names = set(table.column_names)
    metadata = {key.decode(): value.decode() for key, value in (table.schema.metadata or {}).items()}
    if {"id", "answers"} <= names:
        scored, rows = _from_wide(path, table, file_sha256(local))
    elif {"id", "question_id", "label", "probability", "logit"} <= names:
        scored, rows = _from_long(path, table, file_sha256(local))
    elif "clef.flat_columns" in metadata:
        scored, rows = _from_flat(path, table, file_sha256(local), metadata)
    else:
        raise UsageError(
            f"scored file {str(path)!r} is not an output of `clef score` (no `answers` column, nor the question "
            "columns of --layout long or flat)"
        )
    scored.metadata = metadata
    if "record_key" in names and table.column("record_key").null_count < table.num_rows:
        scored.record_keys = _record_keys(table, scored.ids, rows)
    return scored


def _record_keys(table: pa.Table, ids: list[str], rows: list[int]) -> list[str]:
    """One `record_key` per scored record, from its first row; a record without one (a file
    not written by `clef score`) is keyed by its id, `id:ID`."""
    keys = table.column("record_key").take(pa.array(rows, pa.int64())).to_pylist()
    return [str(key) if key is not None else f"id:{record_id}" for record_id, key in zip(ids, keys, strict=True)]


def _passthrough(table: pa.Table, clef_columns: set[str]) -> list[str]:
    return [name for name in table.column_names if name not in clef_columns]


def _twice(path: Path | str, record_id: str) -> UsageError:
    return UsageError(
        f"scored file {str(path)!r}: record id {record_id!r} has answers in two rows; its records cannot be told apart"
    )


def _from_wide(path: Path | str, table: pa.Table, sha256: str) -> tuple[ScoredFile, list[int]]:
    """The scored rows (non-empty `answers`) and the row of each, in file order."""
    ids: list[str] = []
    rows: list[int] = []
    options: dict[str, QuestionOptions] = {}
    scores: dict[str, dict[str, Scores]] = {}
    failed = []
    given: dict[str, dict[str, str]] = {}
    raw_ids = [None if value is None else str(value) for value in table.column("id").to_pylist()]
    for number, (record_id, answers) in enumerate(zip(raw_ids, table.column("answers").to_pylist(), strict=True)):
        if not answers:
            if record_id is not None:  # a null id (a record whose id could not be read) names no record
                failed.append(record_id)
            continue
        record_id = str(record_id)  # clef writes an id on every scored row; a hand-made null reads "None"
        if record_id in options:
            raise _twice(path, record_id)
        ids.append(record_id)
        rows.append(number)
        given[record_id] = {a["question_id"]: a["answer"] for a in answers}
        options[record_id] = {
            a["question_id"]: (a["type"], tuple(label["label"] for label in a["labels"])) for a in answers
        }
        scores[record_id] = {
            a["question_id"]: (
                tuple(label["probability"] for label in a["labels"]),
                tuple(label["logit"] for label in a["labels"]),
            )
            for a in answers
        }
    clef = {"id", "record_index", "prompt_tokens", "state_tokens_cut", "error", "error_kind", "answers", "record_key"}
    columns = table.select(_passthrough(table, clef)).take(pa.array(rows, pa.int64()))
    indices = _indices(table, rows)
    return ScoredFile(path, sha256, ids, options, scores, failed, columns, indices, given), rows


def _from_flat(
    path: Path | str, table: pa.Table, sha256: str, metadata: dict[str, str]
) -> tuple[ScoredFile, list[int]]:
    """A --layout flat output, read as the wide layout of the same results (quality/labels/flat.py)."""
    found = read_flat(str(path), table, metadata["clef.flat_columns"])
    seen: set[str] = set()
    for record_id in found.ids:
        if record_id in seen:
            raise _twice(path, record_id)
        seen.add(record_id)
    columns = table.select(_passthrough(table, found.columns)).take(pa.array(found.rows, pa.int64()))
    scored = ScoredFile(
        path, sha256, found.ids, found.options, found.scores, found.failed, columns, list(found.rows), found.answers
    )
    if metadata.get("clef.calibration_sha256"):
        scored.no_logits = (
            f"scored file {str(path)!r} is a --layout flat output written with --calibration: it holds calibrated "
            "probabilities and no logits, so it cannot be calibrated again; write it with --layout wide from its "
            "checkpoint (the same `clef score` command with --layout wide runs nothing again)"
        )
    return scored, found.rows


def _indices(table: pa.Table, rows: list[int]) -> list[int]:
    """`record_index` of each of `rows` (the row's position when the column is missing or null)."""
    if "record_index" not in table.column_names:
        return list(rows)
    values = table.column("record_index").take(pa.array(rows, pa.int64())).to_pylist()
    return [int(value) if value is not None else row for row, value in zip(rows, values, strict=True)]


def _from_long(path: Path | str, table: pa.Table, sha256: str) -> tuple[ScoredFile, list[int]]:
    """Rows without an error are the scored records' labels, grouped by id; a failed row (an
    error, no question) is only listed in `failed`."""
    clef = {"id", "record_index", "question_id", "type", "label", "probability", "logit", "error", "error_kind"}
    clef.add("record_key")
    kept = _passthrough(table, clef)
    ids: list[str] = []
    first_row: list[int] = []
    labels: dict[str, dict[str, tuple[str, list[str], list[float], list[float]]]] = {}
    failed = []
    index_of: dict[str, object] = {}
    columns = ["id", "question_id", "type", "label", "probability", "logit", "error"]
    has_index = "record_index" in table.column_names
    rows = table.select(columns + (["record_index"] if has_index else [])).to_pylist()
    for number, row in enumerate(rows):
        record_id = str(row["id"])
        if row["error"] is not None or row["question_id"] is None:
            if row["id"] is not None:  # a null id (unreadable) names no record
                failed.append(record_id)
            continue
        if record_id not in labels:
            labels[record_id] = {}
            ids.append(record_id)
            first_row.append(number)
            index_of[record_id] = row.get("record_index")
        elif row.get("record_index") != index_of[record_id]:
            raise _twice(path, record_id)
        entry = labels[record_id].setdefault(row["question_id"], (row["type"], [], [], []))
        entry[1].append(row["label"])
        entry[2].append(row["probability"])
        entry[3].append(row["logit"])
    options = {rid: {q: (e[0], tuple(e[1])) for q, e in qs.items()} for rid, qs in labels.items()}
    scores = {rid: {q: (tuple(e[2]), tuple(e[3])) for q, e in qs.items()} for rid, qs in labels.items()}
    passed = table.select(kept).take(pa.array(first_row, pa.int64()))
    given = {rid: {q: _most_probable(options[rid][q][1], s[0]) for q, s in qs.items()} for rid, qs in scores.items()}
    indices = _indices(table, first_row)
    scored = ScoredFile(path, sha256, ids, options, scores, failed, passed, indices, given)
    return scored, first_row


def _most_probable(option_ids: tuple[str, ...], probabilities: tuple[float, ...]) -> str:
    return option_ids[int(np.argmax(probabilities))]


def labelled(
    scored: ScoredFile,
    gold: GoldSet,
    temperature: Callable[[str, str], float] | None = None,
    records: Sequence[str] | None = None,
) -> Labelled:
    """Per question, the records with a score and a gold label, in scored-file order.

    `temperature(question_id, type)` recomputes the probabilities as softmax(logit / T) (what
    `--calibration` would have written); `records` restricts to a subset (for `--by`). A question
    id whose options differ between records keeps the first option set; the others are skipped
    with a warning."""
    if temperature is not None and scored.no_logits:
        raise UsageError(scored.no_logits)
    wanted = scored.ids if records is None else records
    collected: dict[str, tuple[str, tuple[str, ...], list[str], list, list, list[int]]] = {}
    mismatched: dict[str, int] = {}
    for record_id in wanted:
        labels = gold.labels.get(record_id)
        if not labels or record_id not in scored.options:
            continue
        for question_id, answer in labels.items():
            qtype, option_ids = scored.options[record_id][question_id]
            entry = collected.setdefault(question_id, (qtype, option_ids, [], [], [], []))
            if entry[1] != option_ids:
                mismatched[question_id] = mismatched.get(question_id, 0) + 1
                continue
            probabilities, logits = scored.scores[record_id][question_id]
            entry[2].append(record_id)
            entry[3].append(probabilities)
            entry[4].append(logits)
            entry[5].append(option_ids.index(answer))
    questions = {}
    for question_id, (qtype, option_ids, record_ids, probabilities, logits, gold_index) in collected.items():
        logit_array = np.asarray(logits, dtype=np.float64)
        prob_array = np.asarray(probabilities, dtype=np.float64)
        if temperature is not None:
            prob_array = softmax(logit_array / temperature(question_id, qtype))
        questions[question_id] = QuestionData(
            question_id, qtype, option_ids, record_ids, prob_array, logit_array, np.asarray(gold_index, dtype=np.int64)
        )
    warnings = [
        f"question {qid!r}: skipped {plural(count, 'record')} with other options than the first"
        for qid, count in mismatched.items()
    ]
    return Labelled(questions, warnings)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)
