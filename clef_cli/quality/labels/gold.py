"""Gold labels written by people, matched against the questions of the scored records.

A gold file is user input, so every problem in it (a value that is not an option, an unknown
question, a duplicate or unknown id) becomes a named `GoldProblem` and the record or label is
skipped; only a file that cannot be read at all, or a row without `id`, stops the command.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from clef_cli.errors import UsageError
from clef_cli.inputs.sources import local_copy
from clef_cli.locations.uris import is_uri
from clef_cli.quality.labels.exports import GoldFormat, export_rows
from clef_cli.quality.labels.spreadsheet import read_csv
from clef_cli.release import file_sha256
from clef_cli.results import flat_id
from clef_cli.sizes import plural

QuestionOptions = Mapping[str, tuple[str, tuple[str, ...]]]
"""question_id -> (type, allowed option ids in head order)."""

GoldRow = tuple[str, dict[str, object]]
REVIEW_COLUMNS = ("id", "record_index", "confidence")
"""The first columns of `clef review`'s flat files; then an answer and a probability column per question."""
PROBABILITY = ".probability"
"""The suffix of a question's probability column in `clef review`'s flat files."""
SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}


class GoldFileError(UsageError):
    """The gold file cannot be read, or a row has no `id` (exit code 2)."""


@dataclass(frozen=True)
class GoldProblem:
    record_id: str | None
    question_id: str | None
    message: str


@dataclass
class GoldSet:
    labels: dict[str, dict[str, str]]
    """record id -> {question_id: gold option id}; only records with at least one usable label."""
    problems: list[GoldProblem] = field(default_factory=list)
    sha256: str | None = None
    """Of the gold file; None when the gold came from a column of the scored file."""

    @property
    def n_labels(self) -> int:
        return sum(len(questions) for questions in self.labels.values())


def read_gold_rows(
    path: Path | str, format: GoldFormat | str = GoldFormat.auto
) -> tuple[list[GoldRow], list[GoldProblem]]:
    """(record id, {question_id: raw value}) per row, in file order, and the problems of the
    file as a whole (columns ignored because rows hold a `labels` object).

    A row holds either a `labels` object (or its JSON text) or one column per question id. Text
    formats may start with a UTF-8 byte order mark (as spreadsheet programs write them). A Label
    Studio or Argilla export (JSON or JSONL) is recognised from its content (`format` forces one).
    """
    path = path if is_uri(path) else Path(path)  # a URI as given (Path() would fold its `//`)
    format = GoldFormat(format)
    kind = SUFFIXES.get(Path(str(path)).suffix.lower())
    if kind is None:
        raise GoldFileError(f"gold file {str(path)!r}: unknown format; use .jsonl, .json, .csv or .parquet")
    try:
        raw = _read_raw(path, local_copy(path, "gold file"), kind)
    except GoldFileError:
        raise
    except (OSError, ValueError, UnicodeDecodeError) as exc:  # pyarrow errors subclass these
        raise GoldFileError(f"gold file {str(path)!r} could not be read: {exc}") from exc
    exported = export_rows(path, raw, format)
    if exported is not None:
        return exported, []
    if format not in (GoldFormat.auto, GoldFormat.table):
        raise GoldFileError(f"gold file {str(path)!r}: --gold-format {format.value} needs a .json or .jsonl export")
    if not raw:
        raise GoldFileError(f"gold file {str(path)!r} holds no rows (it is empty, or a header only)")
    ignored: dict[str, list[str]] = {}
    rows = [_gold_row(path, number, row, ignored) for number, row in enumerate(raw, start=1)]
    problems = [
        GoldProblem(
            None,
            None,
            f"column {column!r} is ignored in {plural(len(ids), 'row')} holding a `labels` object "
            f"(first: record {ids[0]!r}); give either `labels` or one column per question",
        )
        for column, ids in ignored.items()
    ]
    return rows, problems


def _read_raw(path: Path | str, local: Path, kind: str) -> list[dict[str, object]]:
    """The rows of the file `path` names, read from `local` (its bytes here; messages name `path`)."""
    if kind == "jsonl":
        rows = []
        with local.open(encoding="utf-8-sig") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise GoldFileError(f"gold file {str(path)!r} line {number}: not JSON ({exc.msg})") from exc
        return _objects(path, rows)
    if kind == "json":
        try:
            data = json.loads(local.read_text(encoding="utf-8-sig"))
        except json.JSONDecodeError as exc:
            raise GoldFileError(f"gold file {str(path)!r}: not JSON ({exc.msg} at line {exc.lineno})") from exc
        if isinstance(data, dict) and isinstance(data.get("records"), list):
            data = data["records"]  # an Argilla document: {"settings": ..., "records": [...]}
        if not isinstance(data, list):
            raise GoldFileError(f"gold file {str(path)!r}: a .json gold file holds a list of rows")
        return _objects(path, data)
    if kind == "csv":
        with local.open(encoding="utf-8-sig", newline="") as handle:
            return read_csv(handle)
    import pyarrow.parquet as pq

    return pq.read_table(local).to_pylist()


def _objects(path: Path | str, rows: list[object]) -> list[dict[str, object]]:
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise GoldFileError(f"gold file {str(path)!r} row {number}: expected an object, got {type(row).__name__}")
    return rows  # type: ignore[return-value]


def _gold_row(path: Path | str, number: int, row: dict[str, object], ignored: dict[str, list[str]]) -> GoldRow:
    """One row as a GoldRow; the filled wide columns of a row with a `labels` object go to `ignored`
    (column -> record ids)."""
    record_id = row.get("id")
    if record_id is None or record_id == "":
        raise GoldFileError(f"gold file {str(path)!r} row {number}: no `id`")
    if "labels" in row:
        labels = parse_labels(row["labels"])
        if labels is None:
            raise GoldFileError(
                f"gold file {str(path)!r} row {number} (id {str(record_id)!r}): `labels` is not an object"
            )
        for column, value in row.items():
            if column not in ("id", "labels") and normalise(value, "") is not None:
                ignored.setdefault(column, []).append(str(record_id))
    else:
        reviewed = review_questions(list(row))
        if reviewed is not None:
            labels = {question_id: row[column] for column, question_id in reviewed.items()}
        else:
            labels = {key: value for key, value in row.items() if key != "id"}
    return str(record_id), labels


def review_questions(columns: Sequence[object]) -> dict[str, str] | None:
    """Answer column -> question id, when `columns` are those of a `clef review` flat file (jsonl or
    csv: `REVIEW_COLUMNS`, then per question its id as `flat_part` writes it and that name +
    `PROBABILITY`), so a reviewed file reads back under its questions' own ids; else None."""
    names = [str(column) for column in columns]
    if tuple(names[: len(REVIEW_COLUMNS)]) != REVIEW_COLUMNS or (len(names) - len(REVIEW_COLUMNS)) % 2:
        return None
    answers, probabilities = names[len(REVIEW_COLUMNS) :: 2], names[len(REVIEW_COLUMNS) + 1 :: 2]
    pairs = zip(answers, probabilities, strict=True)
    if any("." in answer or other != answer + PROBABILITY for answer, other in pairs):
        return None
    try:
        return {answer: flat_id(answer) for answer in answers}
    except UnicodeDecodeError:  # a `%XX` that is no UTF-8: not a name clef wrote
        return None


def parse_labels(value: object) -> dict[str, object] | None:
    """A `labels` cell: a mapping, a JSON object text, or an Arrow map (list of pairs); else None."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if isinstance(value, list) and all(isinstance(item, tuple) and len(item) == 2 for item in value):
        value = dict(value)
    if isinstance(value, Mapping):
        return {str(key): item for key, item in value.items()}
    return None


def normalise(value: object, qtype: str) -> str | None:
    """A raw gold value as an option id string; None means "no label" (empty cell).

    Score levels may be written as integral floats in every format (`4.0`: how pandas writes an
    integer column with a missing value), as numbers or as text."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (float, Decimal)):
        return _integral(value) or str(value)
    if isinstance(value, str):
        text = value.strip()
        if text == "":
            return None
        if qtype == "noul" and text.lower() in ("true", "false"):
            return text.lower()
        if qtype == "score":
            return _integral(text) or text
        return text
    return str(value)


def _integral(value: float | Decimal | str) -> str | None:
    """`4.0`, `Decimal("4.00")` or the text "4.0" as "4"; None for anything that is not a whole
    number of a sane size (score levels are small)."""
    try:
        number = Decimal(value)
    except ArithmeticError:  # text that is not a number
        return None
    if not number.is_finite() or number.adjusted() > 9 or number != number.to_integral_value():
        return None
    return str(int(number))


def match_gold(
    rows: Iterable[GoldRow],
    options: Mapping[str, QuestionOptions],
    sha256: str | None = None,
    failed_ids: Iterable[str] = (),
    found: Sequence[GoldProblem] = (),
) -> GoldSet:
    """Gold labels of the scored records; every mismatch becomes a `GoldProblem`, never an exception.

    `options` maps each scored record id to its questions; `failed_ids` are records that are in
    the scored file without answers (named as such instead of "absent"); `found` are problems
    met while reading the rows. Problems of the file as a whole come first, so that a list cut
    after 20 still shows them.
    """
    failed = set(failed_ids)
    known_questions = {qid for questions in options.values() for qid in questions}
    labels: dict[str, dict[str, str]] = {}
    problems: list[GoldProblem] = list(found)
    seen: set[str] = set()
    unknown_everywhere: dict[str, int] = {}
    for record_id, raw in rows:
        if record_id in seen:
            problems.append(
                GoldProblem(record_id, None, f"record {record_id!r}: duplicate id in the gold; the first row is used")
            )
            continue
        seen.add(record_id)
        questions = options.get(record_id)
        if questions is None:
            if any(value is not None for value in raw.values()):
                why = "failed in scoring (no answers)" if record_id in failed else "is not in the scored records"
                problems.append(GoldProblem(record_id, None, f"record {record_id!r} {why}; its gold is skipped"))
            continue
        for question_id, value in raw.items():
            if question_id not in questions:
                if value is None or value == "":
                    continue
                if question_id not in known_questions:
                    unknown_everywhere[question_id] = unknown_everywhere.get(question_id, 0) + 1
                else:
                    problems.append(
                        GoldProblem(
                            record_id,
                            question_id,
                            f"record {record_id!r}: question {question_id!r} is not one of its questions",
                        )
                    )
                continue
            qtype, allowed = questions[question_id]
            gold = normalise(value, qtype)
            if gold is None:
                continue
            if gold not in allowed:
                problems.append(
                    GoldProblem(
                        record_id,
                        question_id,
                        f"record {record_id!r} question {question_id!r}: gold {gold!r} is not an allowed option "
                        f"({', '.join(allowed)})",
                    )
                )
                continue
            labels.setdefault(record_id, {})[question_id] = gold
    for question_id, count in unknown_everywhere.items():
        problems.append(
            GoldProblem(
                None,
                question_id,
                f"question {question_id!r} is not a question of any scored record ({plural(count, 'gold row')})",
            )
        )
    problems.sort(key=lambda problem: problem.record_id is not None)  # stable: file-wide ones first
    return GoldSet(labels=labels, problems=problems, sha256=sha256)


def load_gold(
    path: Path | str,
    options: Mapping[str, QuestionOptions],
    failed_ids: Iterable[str] = (),
    format: GoldFormat | str = GoldFormat.auto,
) -> GoldSet:
    """Read, match and fingerprint a gold file."""
    rows, found = read_gold_rows(path, format)
    return match_gold(rows, options, sha256=gold_sha256(path), failed_ids=failed_ids, found=found)


def gold_sha256(path: Path | str) -> str:
    """The gold file's fingerprint, of its bytes wherever it lies (an object: its local copy)."""
    return file_sha256(local_copy(path if is_uri(path) else Path(path), "gold file"))


def labelled_ids(path: Path | str, format: GoldFormat | str = GoldFormat.auto) -> set[str]:
    """Ids of the records a gold file gives at least one label (`clef review --exclude`)."""
    rows, _ = read_gold_rows(path, format)
    return {
        record_id for record_id, labels in rows if any(value is not None and value != "" for value in labels.values())
    }


def column_gold_rows(
    ids: Sequence[str], values: Sequence[object], column: str
) -> tuple[list[GoldRow], list[GoldProblem]]:
    """Gold rows from a column carried through the scored file (`--gold-column`): each cell a
    labels object (or its JSON text); a cell that is not one is a problem, not a failure."""
    rows: list[GoldRow] = []
    problems: list[GoldProblem] = []
    for record_id, value in zip(ids, values, strict=True):
        labels = parse_labels(value)
        if labels is None:
            problems.append(
                GoldProblem(record_id, None, f"record {record_id!r}: column {column!r} is not a labels object")
            )
            continue
        rows.append((record_id, labels))
    return rows, problems
