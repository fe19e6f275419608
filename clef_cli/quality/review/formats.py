"""The review files: Label Studio tasks and labeling config, Argilla settings and records, and a
flat table (JSONL or CSV) for a spreadsheet. clef's answers travel as predictions (Label Studio)
or suggestions (Argilla), so a reviewer confirms or corrects rather than labels from scratch."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from clef_cli.errors import UsageError
from clef_cli.quality.labels.gold import PROBABILITY, REVIEW_COLUMNS
from clef_cli.quality.labels.spreadsheet import csv_text
from clef_cli.quality.review.content import MEDIA_KINDS, Content, QuestionText
from clef_cli.quality.review.queue import ReviewRecord
from clef_cli.results import flat_part

STATE_FIELD = "state"
MEDIA_TAGS = {"images": ("Image", "image"), "audio": ("Audio", "audio"), "videos": ("Video", "video")}
RATING_MAX_LEVELS = 11
"""Argilla's rating question holds the values 0..10; a score with more levels is a label question."""


FORMATS = ("label-studio", "argilla", "jsonl", "csv")
SHOWS_RECORDS = ("label-studio", "argilla")
"""The formats whose files show the record (state, media) and the questions' texts to a reviewer."""
EXTENSIONS = {".json": ("label-studio", "argilla"), ".jsonl": ("jsonl",), ".ndjson": ("jsonl",), ".csv": ("csv",)}
"""The formats a review file's extension says it holds (the first one when --format is not given)."""


def format_for(output: Path | str, given: str | None) -> str:
    """The review file's format: `--format`, else its extension's (.json: Label Studio tasks);
    a `--format` its extension contradicts is refused, so `-o review.csv` never holds JSON.
    `output`: a path, `-` or an object URI (its name is its last segment either way)."""
    name = PurePosixPath(str(output)).name
    fits = EXTENSIONS.get(PurePosixPath(name).suffix.lower()) if str(output) != "-" else None
    if given is None:
        return fits[0] if fits else FORMATS[0]
    if fits is not None and given not in fits:
        wants = next(ext for ext, names in EXTENSIONS.items() if given in names)
        raise UsageError(
            f"--format {given} writes a {wants} file, but -o {name} says {' or '.join(fits)}: "
            f"end its name in {wants}, or leave --format out"
        )
    return given


@dataclass(frozen=True)
class Schema:
    """What the exported records ask: per question its type and options (first-seen order, the
    union over the exported records), and how many media of each kind a record shows at most."""

    questions: dict[str, tuple[str, tuple[str, ...]]]
    media: dict[str, int]


def schema_of(records: Sequence[ReviewRecord], content: Mapping[str, Content]) -> Schema:
    questions: dict[str, tuple[str, dict[str, None]]] = {}
    for record in records:
        for question in record.questions:
            entry = questions.setdefault(question.question_id, (question.type, {}))
            entry[1].update(dict.fromkeys(question.option_ids))
    media = {
        kind: max((len(content[r.id].media.get(kind, ())) for r in records if r.id in content), default=0)
        for kind in MEDIA_KINDS
    }
    return Schema({qid: (qtype, tuple(options)) for qid, (qtype, options) in questions.items()}, media)


def media_fields(schema: Schema) -> list[tuple[str, str]]:
    """(data key, kind) of every media slot: image_0, image_1, audio_0, ..."""
    return [(f"{MEDIA_TAGS[kind][1]}_{i}", kind) for kind in MEDIA_KINDS for i in range(schema.media[kind])]


def _media_values(schema: Schema, content: Content | None) -> dict[str, str]:
    values = {}
    for kind in MEDIA_KINDS:
        found = content.media.get(kind, ()) if content else ()
        for i in range(schema.media[kind]):
            values[f"{MEDIA_TAGS[kind][1]}_{i}"] = found[i] if i < len(found) else ""
    return values


def _option_text(option: str, text: QuestionText | None) -> str:
    description = text.options.get(option, "") if text else ""
    return f"{option}: {description}" if description else option


def label_studio_config(schema: Schema, texts: Mapping[str, QuestionText] | None = None) -> str:
    """The labeling config: the state as Text, each media slot as Image/Audio/Video, and per
    question a Header with its instructions over one single-choice `Choices` named after its id
    (score levels in level order); a Choice shows its option's description (`html`) while its
    value, the option id, is what predictions and the export hold."""
    texts = texts or {}
    lines = ["<View>", '  <Header value="Record $id"/>', f'  <Text name="{STATE_FIELD}" value="${STATE_FIELD}"/>']
    for key, kind in media_fields(schema):
        lines.append(f'  <{MEDIA_TAGS[kind][0]} name="{key}" value="${key}"/>')
    for question_id, (_, options) in schema.questions.items():
        text = texts.get(question_id)
        header = f"{question_id}: {text.instructions}" if text and text.instructions else question_id
        lines.append(f"  <Header value={quoteattr(header)}/>")
        lines.append(
            f'  <Choices name={quoteattr(question_id)} toName="{STATE_FIELD}" choice="single" showInline="true">'
        )
        for option in options:
            shown = _option_text(option, text)
            html = f" html={quoteattr(escape(shown))}" if shown != option else ""
            lines.append(f"    <Choice value={quoteattr(option)}{html}/>")
        lines.append("  </Choices>")
    lines.append("</View>")
    return "\n".join(lines) + "\n"


def label_studio_tasks(
    records: Sequence[ReviewRecord], content: Mapping[str, Content], schema: Schema, model_version: str
) -> list[dict[str, Any]]:
    """One task per record: `data` (id, state, media URLs, record_index, confidence) and one
    prediction whose `score` is the record's confidence and whose results are clef's answers."""
    tasks = []
    for record in records:
        found = content.get(record.id)
        data = {
            "id": record.id,
            STATE_FIELD: found.state if found else "",
            **_media_values(schema, found),
            "record_index": record.index,
            "confidence": record.confidence,
        }
        result = [
            {
                "from_name": question.question_id,
                "to_name": STATE_FIELD,
                "type": "choices",
                "value": {"choices": [question.answer]},
                "score": question.probability,
            }
            for question in record.questions
        ]
        prediction = {"model_version": model_version, "score": record.confidence, "result": result}
        tasks.append({"data": data, "predictions": [prediction]})
    return tasks


def _rating(qtype: str, options: tuple[str, ...]) -> bool:
    return qtype == "score" and len(options) <= RATING_MAX_LEVELS


def argilla_settings(schema: Schema, texts: Mapping[str, QuestionText] | None = None) -> dict[str, Any]:
    """Settings in the form `argilla.Settings` serializes to (and reads back): the state and media
    as fields, a label question per noul/choice (each label's text shows its description), a
    rating question per score (0..n-1; the levels' descriptions in the question's description);
    a question's instructions are its description."""
    texts = texts or {}
    fields = [{"name": STATE_FIELD, "title": "State", "required": True, "settings": {"type": "text"}}]
    for key, kind in media_fields(schema):
        settings = {"type": "image"} if kind == "images" else {"type": "text", "use_markdown": False}
        fields.append({"name": key, "title": key, "required": False, "settings": settings})
    questions = []
    for question_id, (qtype, options) in schema.questions.items():
        text = texts.get(question_id)
        lines = [text.instructions] if text and text.instructions else []
        if _rating(qtype, options):
            settings = {"type": "rating", "options": [{"value": int(level)} for level in options]}
            lines += [_option_text(level, text) for level in options if _option_text(level, text) != level]
        else:
            settings = {"type": "label_selection",
                        "options": [{"text": _option_text(o, text), "value": o} for o in options]}  # fmt: skip
        questions.append({"name": question_id, "title": question_id, "description": "\n".join(lines) or None,
                          "required": False, "settings": settings})  # fmt: skip
    metadata = [
        {"name": "record_index", "title": "record_index", "settings": {"type": "integer"}},
        {"name": "confidence", "title": "confidence", "settings": {"type": "float"}},
    ]
    return {"guidelines": "Check clef's suggested answers; correct the wrong ones and submit.",
            "fields": fields, "questions": questions, "metadata": metadata}  # fmt: skip


def argilla_records(
    records: Sequence[ReviewRecord], content: Mapping[str, Content], schema: Schema, agent: str
) -> list[dict[str, Any]]:
    """Records in the form `argilla.Record.from_dict` reads (and `to_dict` writes)."""
    result = []
    for record in records:
        found = content.get(record.id)
        fields = {STATE_FIELD: (found.state if found else "") or record.id}
        fields.update({key: value for key, value in _media_values(schema, found).items() if value})
        suggestions = {}
        for question in record.questions:
            qtype, options = schema.questions[question.question_id]
            value: Any = int(question.answer) if _rating(qtype, options) else question.answer
            suggestions[question.question_id] = {"value": value, "score": question.probability, "agent": agent}
        result.append({"id": record.id, "fields": fields, "suggestions": suggestions,
                       "metadata": {"record_index": record.index, "confidence": record.confidence}})  # fmt: skip
    return result


def flat_columns(questions: Sequence[str]) -> list[str]:
    """The flat review files' columns: id, record_index, confidence, then per question its answer
    column, named after the question id as `--layout flat` writes it (`flat_part`: `.` never in
    it), and that name + `.probability`; so questions `r` and `r.probability` never meet."""
    return [*REVIEW_COLUMNS] + [c for q in questions for c in (flat_part(q), flat_part(q) + PROBABILITY)]


def flat_rows(records: Sequence[ReviewRecord], questions: Sequence[str]) -> list[dict[str, Any]]:
    """One row per record, keyed by `flat_columns`."""
    rows = []
    for record in records:
        row: dict[str, Any] = {"id": record.id, "record_index": record.index, "confidence": record.confidence}
        answers = {question.question_id: question for question in record.questions}
        for question_id in questions:
            question = answers.get(question_id)
            row[flat_part(question_id)] = question.answer if question else None
            row[flat_part(question_id) + PROBABILITY] = question.probability if question else None
        rows.append(row)
    return rows


def render(
    format: str,
    records: Sequence[ReviewRecord],
    content: Mapping[str, Content],
    questions: Sequence[str],
    model_version: str,
    texts: Mapping[str, QuestionText] | None = None,
) -> tuple[str, str | None]:
    """(the review file's text, the Label Studio config or None); `format` is one of FORMATS."""
    if format not in FORMATS:
        raise UsageError(f"--format {format!r}: use one of {', '.join(FORMATS)}")
    schema = schema_of(records, content)
    if format == "label-studio":
        tasks = label_studio_tasks(records, content, schema, model_version)
        return json.dumps(tasks, indent=1, ensure_ascii=False) + "\n", label_studio_config(schema, texts)
    if format == "argilla":
        document = {
            "settings": argilla_settings(schema, texts),
            "records": argilla_records(records, content, schema, model_version),
        }
        return json.dumps(document, indent=1, ensure_ascii=False) + "\n", None
    rows = flat_rows(records, questions)
    if format == "jsonl":
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), None
    return csv_text(flat_columns(questions), rows), None


def model_version(metadata: Mapping[str, str]) -> str:
    """`MODEL@HEAD12` from the scored file's metadata (+ `+cal` and the calibration's hash prefix)."""
    model = Path(metadata.get("clef.model", "") or "clef").name or "clef"
    version = f"{model}@{(metadata.get('clef.head_sha256') or 'unknown')[:12]}"
    if metadata.get("clef.calibration_sha256"):
        version += f"+cal{metadata['clef.calibration_sha256'][:8]}"
    return version
