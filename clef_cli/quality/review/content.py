"""What a reviewer sees of a record: its state as text and its media as URLs a labeling tool can open.

The scored file holds them when the job ran with `--keep-columns state,images,audio,videos`;
otherwise `--records` reads them from the original inputs. The questions' instructions and the
options' descriptions come from the records' own `questions` there, else from the `--questions`
schema the job was scored with (the output's `clef.questions` metadata). Local media paths become
URLs under Label Studio's convention for local files: `/data/local-files/?d=` (`--url-prefix`) +
the path relative to the document root (`LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT`, `--document-root`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from clef_cli.errors import UsageError
from clef_cli.locations.fence import MediaBase, media_location, names_object
from clef_cli.locations.uris import LocationProblem
from clef_cli.quality.labels.scored import ScoredFile

MEDIA_KINDS = ("images", "audio", "videos")
LOCAL_FILES_PREFIX = "/data/local-files/?d="
URL_SCHEMES = ("data:", "http://", "https://", "s3://", "gs://", "azure-blob://")


@dataclass(frozen=True)
class Content:
    state: str
    media: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """kind (images, audio, videos) -> URLs, in the record's order."""


@dataclass(frozen=True)
class MediaUrls:
    """Maps a local media path to a URL: `prefix` + quote(path relative to `root`).

    A relative path resolves against its input file's folder (`--records`), else the current
    folder. URLs (http, data:, cloud storage) pass through unchanged."""

    root: Path = Path("/")
    prefix: str = LOCAL_FILES_PREFIX

    def url(self, entry: str, base_dir: MediaBase, record_id: str, kind: str) -> str:
        if entry.startswith(URL_SCHEMES):
            return entry
        if names_object(entry, base_dir):  # an object in a store: its URI, as for cloud storage
            try:
                return str(media_location(entry, base_dir))
            except LocationProblem as problem:
                raise UsageError(f"record {record_id!r}, field {kind!r}: {problem}") from None
        path = Path(entry)
        if not path.is_absolute():
            path = (base_dir or Path.cwd()) / path
        root, absolute = self.root.resolve(), path.resolve()
        if not absolute.is_relative_to(root):
            raise UsageError(f"record {record_id!r}, field {kind!r}: {entry!r} is not under --document-root {root}")
        return self.prefix + quote(absolute.relative_to(root).as_posix(), safe="/")


def state_text(state: Any) -> str:
    """Text as is; any other JSON value as compact JSON with sorted keys (what the model read)."""
    if state is None:
        return ""
    if isinstance(state, str):
        return state
    return json.dumps(state, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _media_list(value: Any, record_id: str, kind: str) -> list[str]:
    if value is None or value == "":  # a CSV's empty media cell: no media
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.startswith("[") else [value]
        except json.JSONDecodeError:
            value = [value]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise UsageError(f"record {record_id!r}, field {kind!r}: expected a list of media paths or URLs")
    return value


def _content(row: Mapping[str, Any], record_id: str, base_dir: Path | None, urls: MediaUrls) -> Content:
    media = {
        kind: tuple(urls.url(entry, base_dir, record_id, kind) for entry in _media_list(row.get(kind), record_id, kind))
        for kind in MEDIA_KINDS
    }
    return Content(state_text(row.get("state")), {kind: found for kind, found in media.items() if found})


def from_scored(scored: ScoredFile, wanted: Collection[str], urls: MediaUrls) -> dict[str, Content] | None:
    """Content from the passed-through columns; None when the file kept no `state` nor media."""
    kept = [name for name in ("state", *MEDIA_KINDS) if name in scored.columns.column_names]
    if not kept:
        return None
    rows = scored.columns.select(kept).to_pylist()
    return {
        record_id: _content(row, record_id, None, urls)
        for record_id, row in zip(scored.ids, rows, strict=True)
        if record_id in wanted
    }


def from_inputs(
    paths: Iterable[str | Path], wanted: Collection[str], urls: MediaUrls
) -> tuple[dict[str, Content], list[Any]]:
    """Content read from the original inputs (`--records`), and the `questions` the wanted records
    carry; relative media resolve against each input file's folder, as `clef score` resolved them.
    Ids default to the position, as in score."""
    from clef_cli.inputs.readers import raw_rows
    from clef_cli.inputs.sources import expand_inputs

    found: dict[str, Content] = {}
    schemas: list[Any] = []
    index = 0
    for source in expand_inputs(paths):
        for raw, _problem in raw_rows(source, None):
            if isinstance(raw, Mapping):
                record_id = str(raw.get("id", index))
                if record_id in wanted:
                    found[record_id] = _content(raw, record_id, source.base_dir, urls)
                    if raw.get("questions") is not None:
                        schemas.append(raw["questions"])
            index += 1
    return found, schemas


@dataclass(frozen=True)
class QuestionText:
    """What a reviewer reads of one question: its instructions and each option's description
    (empty where the schema gives none)."""

    instructions: str
    options: dict[str, str]


def question_texts(metadata: Mapping[str, str], schemas: Iterable[Any] = ()) -> dict[str, QuestionText]:
    """Per question id, the first definition found: in the records' own `questions` (from
    `--records`), then in the `--questions` schema the job was scored with (`clef.questions`)."""
    from clef_cli.errors import RecordError
    from clef_cli.inputs.records import parse_questions

    texts: dict[str, QuestionText] = {}
    for schema in [*schemas, metadata.get("clef.questions")]:
        try:
            parsed = parse_questions(json.loads(schema) if isinstance(schema, str) else schema, "review")
        except (RecordError, ValueError):
            continue  # no schema, or one the job could not have scored with
        for question in parsed:
            options = {option_id: state_text(description) for option_id, description in question.options}
            texts.setdefault(question.id, QuestionText(state_text(question.instructions), options))
    return texts


@dataclass
class Shown:
    """What the review file shows beside clef's answers."""

    content: dict[str, Content]
    texts: dict[str, QuestionText]
    notes: list[str]
    edited: list[str] = field(default_factory=list)
    """Ids whose `--records` input changed since they were scored: left out of the review."""


def load_content(
    scored: ScoredFile, wanted: Collection[str], urls: MediaUrls, records: list[Path | str] | None
) -> Shown:
    """Content of the `wanted` records and the questions' texts, with a note for what is missing."""
    if records:
        from clef_cli.quality.review.freshness import check_records

        found, schemas = from_inputs(records, wanted, urls)
        missing = [record_id for record_id in wanted if record_id not in found]
        notes = [f"{len(missing)} record(s) not found in --records (first: {missing[0]!r})"] if missing else []
        freshness = check_records(scored, records, set(found))
        for record_id in freshness.edited:
            del found[record_id]
        return Shown(found, question_texts(scored.metadata, schemas), [*notes, *freshness.notes], freshness.edited)
    texts = question_texts(scored.metadata)
    found_in_file = from_scored(scored, wanted, urls)
    if found_in_file is None:
        note = "the scored file kept no `state` column: tasks hold ids only (score with --keep-columns state, "
        return Shown({}, texts, [note + "or pass --records INPUT)"])
    return Shown(found_in_file, texts, [])
