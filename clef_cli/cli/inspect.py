"""`clef inspect-spans`: how one record is encoded, drawn as the prompt with its spans and a table."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from clef_cli.choices import OverflowPolicy, SpecialTokens
from clef_cli.cli.console import stdout
from clef_cli.cli.media_options import with_media_limits
from clef_cli.cli.options import (
    ColumnsOption,
    MaxLengthOption,
    ModelOption,
    OverflowOption,
    QuestionsOption,
    RevisionOption,
    SpecialTokensOption,
    StateColumnsOption,
    StructNullsOption,
    read_location,
)
from clef_cli.cli.score_options import MaxRecordBytesOption
from clef_cli.encoding.media import MediaLimits
from clef_cli.errors import ClefError, RecordError, UsageError
from clef_cli.inputs.columns import ColumnMapping
from clef_cli.inputs.parquet_rows import StructNulls
from clef_cli.inputs.record_size import MAX_RECORD_BYTES, ReadLimits
from clef_cli.release import DEFAULT_MODEL

QUESTION_STYLES = ("bold magenta", "bold cyan", "bold yellow", "bold blue")
SPECIAL_TOKEN_MODES = {"text": "read as text", "parse": "read as control tokens"}
OPTION_STYLES = ("black on green", "black on bright_yellow", "black on bright_cyan", "black on bright_magenta")


InspectSpansRecordFileArgument = Annotated[
    str,
    typer.Argument(
        callback=read_location,
        help="A file of records as `clef score` reads one (JSONL, JSON, Parquet, CSV or TSV, a folder of "
        "parts, a glob): a local path or a URI.",
    ),
]
InspectSpansIndexOption = Annotated[int | None, typer.Option("--index", "-i", min=0, help="Record position (0-based).")]
InspectSpansRecordIdOption = Annotated[str | None, typer.Option("--id", help="Record id (instead of --index).")]
InspectSpansAsJsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON (with input_ids).")]


def inspect_spans(
    record_file: InspectSpansRecordFileArgument,
    model: ModelOption = DEFAULT_MODEL,
    revision: RevisionOption = None,
    index: InspectSpansIndexOption = None,
    record_id: InspectSpansRecordIdOption = None,
    max_length: MaxLengthOption = None,
    max_record_bytes: MaxRecordBytesOption = MAX_RECORD_BYTES,
    on_overflow: OverflowOption = OverflowPolicy.truncate,
    struct_nulls: StructNullsOption = StructNulls.refuse,
    special_tokens: SpecialTokensOption = SpecialTokens.text,
    questions: QuestionsOption = None,
    columns: ColumnsOption = None,
    state_columns: StateColumnsOption = None,
    as_json: InspectSpansAsJsonOption = False,
    limits: MediaLimits | None = None,  # replaced by the five media-limit options (with_media_limits)
) -> None:
    """Show how one record is encoded: the prompt with question and option spans highlighted,
    a table of every span and the token totals. Loads only the tokenizer and processor files,
    never the weights.
    """
    from clef_cli.encoding.prompt import PromptEncoder
    from clef_cli.encoding.spans import span_report
    from clef_cli.families import family_of
    from clef_cli.inputs.readers import load_questions_file
    from clef_cli.inputs.records import InvalidRecord
    from clef_cli.release import load_processor, resolve_release

    if index is not None and record_id is not None:
        raise UsageError("give --index or --id, not both")
    from clef_cli.inputs.columns import parse_columns
    from clef_cli.inputs.table_shape import check_columns

    schema = load_questions_file(questions) if questions else None
    mapping = parse_columns(columns, state_columns)
    if mapping is not None:
        check_columns(mapping, [record_file])  # a column the input lacks: refused as `clef score` refuses it
    read_limits = ReadLimits(max_record_bytes, (limits or MediaLimits()).max_file_bytes)
    record = select_record(record_file, schema, index, record_id, struct_nulls, mapping, read_limits)
    if isinstance(record, InvalidRecord):
        raise ClefError(record.error)
    release = resolve_release(model, revision=revision, with_weights=False, require_head=False)
    processor = load_processor(release)
    encoder = PromptEncoder(
        processor, max_length=max_length, overflow=on_overflow, limits=limits,
        family=family_of(release), special_tokens=special_tokens,
    )  # fmt: skip
    try:
        encoded = encoder.encode(record)
    except RecordError as error:
        raise ClefError(str(error)) from None
    report = span_report(encoded, processor.tokenizer, encoder.special_tokens)
    if as_json:
        sys.stdout.write(json.dumps(report, ensure_ascii=False) + "\n")
    else:
        print_span_view(encoded, processor.tokenizer, report)


def select_record(
    path: str,
    schema: Any,
    index: int | None,
    record_id: str | None,
    struct_nulls: StructNulls,
    columns: ColumnMapping | None = None,
    limits: ReadLimits | None = None,
) -> Any:
    """The record `clef score` would read at that position or with that id (under the same
    mapping and size limits)."""
    from clef_cli.inputs.readers import read_records

    wanted_index = 0 if index is None and record_id is None else index
    records = read_records([path], questions=schema, struct_nulls=struct_nulls, columns=columns, limits=limits)
    for record in records:
        if record_id is not None and record.id == record_id:
            return record
        if wanted_index is not None and record.index == wanted_index:
            return record
    if record_id is not None:
        raise UsageError(f"no record with id {record_id!r} in {path}")
    raise UsageError(f"{path} has no record at index {wanted_index}")


def print_span_view(encoded: Any, tokenizer: Any, report: dict[str, Any]) -> None:
    from clef_cli.encoding.spans import prompt_pieces

    prompt = Text()
    for piece in prompt_pieces(encoded, tokenizer):
        if piece.kind == "question":
            prompt.append(piece.text, style=f"{QUESTION_STYLES[piece.question % len(QUESTION_STYLES)]} underline")
        elif piece.kind == "option":
            prompt.append(piece.text, style=OPTION_STYLES[piece.option % len(OPTION_STYLES)])
        elif piece.kind == "media":
            prompt.append(piece.text, style="bold red")
        else:
            prompt.append(piece.text, style="dim")
    stdout.rule(f"record {report['id']} (index {report['index']})")
    stdout.print(prompt)
    stdout.rule("spans")
    table = Table(show_lines=False)
    for column in ("question", "option", "tokens", "count", "text"):
        table.add_column(column, overflow="fold")
    for q, question in enumerate(report["questions"]):
        style = QUESTION_STYLES[q % len(QUESTION_STYLES)]
        start, end = question["question_span"]
        table.add_row(
            Text(question["question_id"], style=style),
            Text(f"({question['type']})", style="dim"),
            f"[{start}, {end})",
            str(question["tokens"]),
            Text(question["text"]),
        )
        for o, option in enumerate(question["options"]):
            start, end = option["span"]
            table.add_row(
                "",
                Text(option["option_id"], style=OPTION_STYLES[o % len(OPTION_STYLES)]),
                f"[{start}, {end})",
                str(option["tokens"]),
                Text(option["text"]),
            )
    stdout.print(table)
    for question in report["questions"]:
        if question["ignored_criteria"]:
            ignored = ", ".join(question["ignored_criteria"])
            stdout.print(f"[yellow]{question['question_id']}: criteria keys ignored: {ignored}[/yellow]")
    media = report["media_tokens"]
    stdout.print(
        f"prompt tokens: {report['prompt_tokens']} of max length {report['max_length']}\n"
        f"media tokens: image {media['image']}, audio {media['audio']}, video {media['video']}"
        f"{' (audio in video)' if report['use_audio_in_video'] else ''}\n"
        f"state tokens: {report['state_tokens']} kept, {report['state_tokens_cut']} cut\n"
        f"special tokens in the record's text: {report['special_tokens']} "
        f"({SPECIAL_TOKEN_MODES[report['special_tokens']]})"
    )


command = with_media_limits(inspect_spans)
