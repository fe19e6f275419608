"""Reading and validating input records (JSONL, JSON, Parquet, CSV) into `Record` objects.

Readers stream: a Parquet file is read batch by batch and a JSONL file line by line, so a job
over millions of records never holds them all. Every problem with one record becomes an
`InvalidRecord` that names the record and the field; the other records are unaffected.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from clef_cli.errors import RecordError, unexpected_error
from clef_cli.inputs.columns import ColumnMapping
from clef_cli.inputs.fields import MEDIA_FIELDS as MEDIA_FIELDS  # the field names live in fields.py
from clef_cli.inputs.fields import RECORD_FIELDS, near_miss, near_miss_message
from clef_cli.inputs.formats import Cells
from clef_cli.inputs.json_values import child_path, json_problem, kind_of, shown, text_problem, unreadable_json
from clef_cli.inputs.media_cells import MediaEntry, media_entries
from clef_cli.inputs.parquet_rows import AmbiguousNulls
from clef_cli.inputs.record_size import OversizeCell
from clef_cli.inputs.seen_ids import SeenIds
from clef_cli.locations.fence import MediaBase

QUESTION_TYPES: dict[str, int] = {"noul": 0, "choice": 1, "score": 2}
"""Question type names and the ids the head's type embedding uses."""
QUESTION_TYPE_NAMES = tuple(QUESTION_TYPES)
"""The names by type id."""

NOUL_DEFAULTS: dict[str, str | None] = {
    "true": "The proposition is true or the answer is yes.",
    "false": "The proposition is false or the answer is no.",
}
NO_QUESTIONS = "no questions (give them in the record or with --questions)"
"""A record's error when it carries no questions and the job has no --questions file."""


@dataclass(frozen=True)
class Question:
    """One validated question; `options` are in head (and prompt) order."""

    id: str
    type: str
    instructions: Any
    options: tuple[tuple[str, Any], ...]
    criteria_order: tuple[str, ...]
    """Option ids in the order the record wrote them (choice ties go to the first of these)."""
    ignored_criteria: tuple[str, ...] = ()
    """Criteria keys the model never reads (noul keys other than true/false), shown by inspect-spans."""

    @property
    def type_id(self) -> int:
        return QUESTION_TYPES[self.type]

    @property
    def option_ids(self) -> tuple[str, ...]:
        return tuple(option_id for option_id, _ in self.options)


@dataclass(frozen=True)
class Record:
    """A valid record: state, schema and media entries (locations, resolved later, or inline
    bytes: inputs/media_cells.py)."""

    id: str
    index: int
    state: Any
    questions: tuple[Question, ...]
    images: tuple[MediaEntry, ...] = ()
    audio: tuple[MediaEntry, ...] = ()
    videos: tuple[MediaEntry, ...] = ()
    base_dir: MediaBase = None
    """Where relative media paths resolve and where the record came from (`fence.MediaBase`): the
    input file's local folder, an object folder's URI (a remote input: its records name no local
    file), or None (built by a library caller, no folder)."""

    @property
    def has_media(self) -> bool:
        return bool(self.images or self.audio or self.videos)


@dataclass(frozen=True)
class InvalidRecord:
    """A record that failed validation; it still takes its place in the output."""

    id: str | None
    """None when the record's id cannot be read (not an object, not JSON, an id of another type):
    its row's id is null, so it is never taken for a real record's; `index` says which it is."""
    index: int
    error: str


# --------------------------------------------------------------------------- schema validation


def noul_descriptions(criteria: Any, record_id: str, where: str) -> dict[Any, Any]:
    """The reference's rule: `descriptions = defaults; descriptions.update(criteria or {})`.

    Falsy criteria (null, {}, [], "") mean the defaults, and keys other than true/false are
    accepted and ignored (`ignored_noul_keys` names them for inspect-spans). Only criteria that
    `dict.update` itself rejects are errors, since the reference cannot score those either.
    """
    descriptions: dict[Any, Any] = dict(NOUL_DEFAULTS)
    try:
        descriptions.update(criteria or {})
    except (TypeError, ValueError):
        raise RecordError(record_id, where, "noul criteria must be an object with keys true/false") from None
    for key in ("true", "false"):
        check_json(descriptions[key], record_id, f"{where}.{key}")
    return descriptions


def check_json(value: Any, record_id: str, where: str) -> None:
    """A value the prompt renders must be JSON the tokenizer can take (see json_values)."""
    problem = json_problem(value, where)
    if problem is not None:
        raise RecordError(record_id, *problem)


def ignored_noul_keys(criteria: Any) -> tuple[str, ...]:
    """Keys of noul criteria that the model never reads (typos such as `maybe` or `True`)."""
    try:
        keys = dict(criteria or {})
    except (TypeError, ValueError):
        return ()
    return tuple(str(key) for key in keys if key not in NOUL_DEFAULTS)


def question_options(
    question_id: str, qtype: str, criteria: Any, record_id: str
) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
    """The (option id, description) pairs in head order, and the ids in the record's order."""
    where = child_path("questions", question_id) + ".criteria"
    if qtype == "noul":
        descriptions = noul_descriptions(criteria, record_id, where)
        options = tuple((key, descriptions[key]) for key in ("true", "false"))
        return options, ("true", "false")
    if qtype == "choice":
        if not isinstance(criteria, Mapping) or not criteria:
            raise RecordError(
                record_id, where, "choice criteria must be a non-empty object of option id -> description"
            )
        for key in criteria:
            if not isinstance(key, str):
                raise RecordError(record_id, where, f"choice option ids must be strings, got {kind_of(key)}")
            if text_problem(key):
                raise RecordError(record_id, child_path(where, key), f"an option id that is {text_problem(key)}")
            check_json(criteria[key], record_id, child_path(where, key))
        return tuple((key, criteria[key]) for key in sorted(criteria)), tuple(criteria)
    if not isinstance(criteria, list) or not criteria:
        raise RecordError(record_id, where, "score criteria must be a non-empty list of level descriptions")
    check_json(criteria, record_id, where)
    levels = tuple(str(level) for level in range(len(criteria)))
    return tuple(zip(levels, criteria, strict=True)), levels


def question_type(qtype: Any, record_id: str, where: str) -> str:
    """The type's name; checked as a string first, since a list or object cannot be looked up."""
    if qtype is not None and not isinstance(qtype, str):
        raise RecordError(record_id, where, f"a question type must be a string, got {kind_of(qtype)}")
    if qtype not in QUESTION_TYPES:
        expected = "expected one of noul, choice, score"
        raise RecordError(record_id, where, f"unknown question type {shown(qtype)} ({expected})")
    return qtype


def parse_questions(questions: Any, record_id: str) -> tuple[Question, ...]:
    """Validate a question schema (question id -> question object), keeping the record's order."""
    if questions is None:
        raise RecordError(record_id, "questions", NO_QUESTIONS)
    if not isinstance(questions, Mapping):
        raise RecordError(record_id, "questions", "questions must be an object of question id -> question")
    if not questions:
        raise RecordError(record_id, "questions", "no questions: the schema is empty")
    parsed = []
    for question_id, spec in questions.items():
        if not isinstance(question_id, str) or not question_id:
            raise RecordError(
                record_id, "questions", f"question ids must be non-empty strings, got {shown(question_id)}"
            )
        where = child_path("questions", question_id)
        if text_problem(question_id):
            raise RecordError(record_id, where, f"a question id that is {text_problem(question_id)}")
        if not isinstance(spec, Mapping):
            raise RecordError(record_id, where, f"a question must be an object, got {kind_of(spec)}")
        qtype = question_type(spec.get("type"), record_id, f"{where}.type")
        check_json(spec.get("instructions"), record_id, f"{where}.instructions")
        options, criteria_order = question_options(question_id, qtype, spec.get("criteria"), record_id)
        parsed.append(
            Question(
                id=question_id,
                type=qtype,
                instructions=spec.get("instructions"),
                options=options,
                criteria_order=criteria_order,
                ignored_criteria=ignored_noul_keys(spec.get("criteria")) if qtype == "noul" else (),
            )
        )
    return tuple(parsed)


def parse_media(
    raw: Mapping[str, Any], name: str, record_id: str, cells: Cells = Cells.values
) -> tuple[MediaEntry, ...]:
    """The field's entries: locations or inline media (inputs/media_cells.py reads the cell)."""
    return media_entries(raw.get(name), name, record_id, text=cells is Cells.text)


def _decode_json_text(value: Any, record_id: str, name: str) -> Any:
    """Parquet and CSV-like sources may carry nested values as JSON text."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        raise RecordError(record_id, name, f"not valid JSON text: {error.msg} at position {error.pos}") from None
    except (RecursionError, ValueError) as error:  # nested deeper than the parser goes; an over-long integer
        raise RecordError(record_id, name, f"JSON text that cannot be read: {unreadable_json(error)}") from None


# --------------------------------------------------------------------------- record assembly


@dataclass
class RecordBuilder:
    """Turns raw mappings into `Record` / `InvalidRecord`, tracking ids across all inputs."""

    default_questions: Mapping[str, Any] | None = None
    check_duplicates: bool = True
    """Off where records are built in parallel; the caller then checks ids across all records."""
    columns: ColumnMapping | None = None
    """`--columns` / `--state-columns`: which input columns the record's fields come from."""
    claimed: frozenset[str] = frozenset()
    """Field names the user gave a use (`--keep-columns`; the columns a mapping reads join them):
    never near misses (`near_miss`)."""
    _seen_ids: SeenIds = field(default_factory=SeenIds)
    """Bounded in memory (a job of millions of ids spills them to a temporary file)."""

    def __post_init__(self) -> None:
        if self.columns is not None:  # a column the mapping reads has its use: no near miss
            self.claimed = self.claimed | frozenset(self.columns.columns)

    def build(self, raw: Any, index: int, base_dir: MediaBase, cells: Cells = Cells.values) -> Record | InvalidRecord:
        """The record, or its error; never raises for what a record holds. `cells`: how the
        input's cells hold the fields (formats.Cells), read per field after the mapping renamed
        the columns, so a mapped column reads exactly as a column of the field's own name."""
        if not isinstance(raw, Mapping):
            error = RecordError(None, None, "a record must be a JSON object", index=index)
            return InvalidRecord(None, index, str(error))
        record_id: str | None = None  # until it is read: a row whose id cannot be read has none
        try:
            source = self.columns.source_of("id") if self.columns is not None else "id"
            if isinstance(raw.get(source), OversizeCell):
                raise RecordError(None, "id", raw[source].reason, index=index)
            record_id = record_id_of({"id": raw.get(source)}, index)
            if self.check_duplicates:
                first = self._seen_ids.first_use(record_id, index)
                if first is not None:
                    raise RecordError(record_id, "id", f"duplicate record id (first used by record {first})")
            if self.columns is not None:
                raw = self.columns.apply(raw, record_id)
            raw = _oversize_checked(raw)
            return self._validate(raw, record_id, index, base_dir, Cells(cells))
        except RecordError as error:
            return InvalidRecord(record_id, index, str(error))
        except Exception as error:  # a last guard: a value validation missed is this record's error
            return InvalidRecord(record_id, index, str(unexpected_error(record_id, None, error, index)))

    def _validate(
        self,
        raw: Mapping[str, Any],
        record_id: str,
        index: int,
        base_dir: MediaBase,
        cells: Cells,
    ) -> Record:
        for name in ("state", "questions"):
            if isinstance(raw.get(name), AmbiguousNulls):
                raise raw[name].error(record_id)
            if isinstance(raw.get(name), OversizeCell):
                raise RecordError(record_id, name, raw[name].reason)
        missed = near_miss((key for key, value in raw.items() if value is not None), self.claimed)
        if missed is not None:
            raise RecordError(record_id, None, near_miss_message(*missed))
        if "state" not in raw or raw["state"] is None:
            raise RecordError(record_id, "state", "missing state")
        state = raw["state"]
        questions = own_questions(raw, cells)
        if cells is not Cells.values:
            state = _decode_json_container(state, record_id)
            questions = _decode_json_text(questions, record_id, "questions")
        check_json(state, record_id, "state")
        if questions is None:
            questions = self.default_questions
        return Record(
            id=record_id,
            index=index,
            state=state,
            questions=parse_questions(questions, record_id),
            images=parse_media(raw, "images", record_id, cells),
            audio=parse_media(raw, "audio", record_id, cells),
            videos=parse_media(raw, "videos", record_id, cells),
            base_dir=base_dir,
        )


def own_questions(raw: Mapping[str, Any], cells: Cells) -> Any:
    """The questions a record carries (None: none of its own, so --questions applies); a text
    table's empty cell is none."""
    questions = raw.get("questions")
    return None if cells is Cells.text and questions == "" else questions


def _oversize_checked(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """A row with cells refused unread (`OversizeCell`): a column the record does not read is as
    if absent; the state, questions and media carry theirs on (each the error of its field; a
    medium's, a `media` error when encoded)."""
    if not any(isinstance(value, OversizeCell) for value in raw.values()):
        return raw
    return {name: value for name, value in raw.items() if name in RECORD_FIELDS or not isinstance(value, OversizeCell)}


def _decode_json_container(value: Any, record_id: str) -> Any:
    """A Parquet text state holding a JSON object or array is that value; other text stays text."""
    if not isinstance(value, str) or not value.lstrip().startswith(("{", "[")):
        return value
    try:
        decoded = json.loads(value)
    except json.JSONDecodeError:
        return value
    except (RecursionError, ValueError) as error:
        raise RecordError(record_id, "state", f"JSON text that cannot be read: {unreadable_json(error)}") from None
    return decoded if isinstance(decoded, (dict, list)) else value


NO_ID = "the row's id is null (its record_index is the record's position)"
"""How the error of a record whose id cannot be read ends: its row never shows a made-up id."""


def record_id_of(raw: Mapping[str, Any], index: int) -> str:
    """The record's id as text: a string or an integer; none (null or "") is its position. A
    float that is a whole number (`1.0`: pandas makes an integer column with a missing value
    float64) is the integer it spells; `1.5` is no id.

    Any other id (a boolean, a fractional number, an array, an object) is the record's error,
    reported under its position, as a line that is not JSON is."""
    value = raw.get("id")
    if value is None or value == "":
        return str(index)
    if isinstance(value, str):
        if text_problem(value):
            raise RecordError(None, "id", f"an id that is {text_problem(value)}; {NO_ID}", index=index)
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():  # a pandas int column with a missing value
        return str(int(value))
    raise RecordError(
        None, "id", f"an id must be a string or an integer, got {kind_of(value)} {shown(value)}; {NO_ID}", index=index
    )
