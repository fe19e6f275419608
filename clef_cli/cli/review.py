"""`clef review`: the least certain records, with clef's answers pre-filled, for people to check in
Label Studio, Argilla or a spreadsheet. Reads Parquet only; never imports torch."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from clef_cli.cli.console import stderr
from clef_cli.cli.options import (
    PATH_OR_URI,
    ReviewFormat,
    ReviewOrder,
    ScoredArgument,
    local_location,
    read_location,
    writable_file_or_stdout,
    writable_location,
)
from clef_cli.errors import UsageError
from clef_cli.locations.overlap import refuse_overlap
from clef_cli.quality.labels.exports import GoldFormat
from clef_cli.sizes import plural

RecordsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--records",
        callback=read_location,
        metavar=PATH_OR_URI,
        help="A scored input, for state, media and the questions' texts (default: kept columns): a file, a "
        "folder of parts or a glob, local or a URI (s3://bucket/prefix/), as `clef score` reads it; repeat it "
        "for several inputs.",
    ),
]

DocumentRootOption = Annotated[
    str | None,
    typer.Option(
        "--document-root",
        callback=local_location,
        metavar="DIR",
        help="The folder local media URLs are relative to: Label Studio's LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT "
        "(default: /).",
        show_default=False,
    ),
]

ConfigOutOption = Annotated[
    str | None,
    typer.Option(
        "--config-out",
        callback=writable_location,
        metavar=PATH_OR_URI,
        help="Write the Label Studio labeling config (XML) here.",
    ),
]


ReviewOutputOption = Annotated[
    str,
    typer.Option(
        "--output",
        "-o",
        callback=writable_file_or_stdout,
        metavar=PATH_OR_URI,
        help="Review file to write (- for stdout).",
    ),
]
ReviewFormatOption = Annotated[
    ReviewFormat | None,
    typer.Option(
        "--format",
        help="label-studio tasks (JSON), an argilla document, jsonl or csv (default: from -o's extension, "
        ".json being label-studio).",
    ),
]
ReviewLimitOption = Annotated[int | None, typer.Option("--limit", min=1, help="At most this many records.")]
ReviewQuestionsOption = Annotated[
    str | None, typer.Option("--questions", help="Comma-separated question ids to review (default: all).")
]
ReviewOrderOption = Annotated[
    ReviewOrder,
    typer.Option(
        "--order",
        help="uncertainty: lowest confidence first; margin: smallest top-second gap; "
        "entropy: highest entropy; random; stratified: round-robin over the first question's answers.",
    ),
]
ReviewExcludeOption = Annotated[
    str | None,
    typer.Option(
        "--exclude",
        callback=read_location,
        metavar=PATH_OR_URI,
        help="Leave out records this gold file (or export) already labels.",
    ),
]
ReviewGoldFormatOption = Annotated[
    GoldFormat, typer.Option("--gold-format", help="Read --exclude as this format (default: from its content).")
]
ReviewSeedOption = Annotated[int, typer.Option("--seed", help="Seed of --order random.")]
ReviewUrlPrefixOption = Annotated[
    str | None,
    typer.Option(
        "--url-prefix",
        help="What a local media URL starts with, before its path under --document-root (default: Label "
        "Studio's local files, /data/local-files/?d=).",
        show_default=False,
    ),
]
ReviewOldMediaRootOption = Annotated[
    str | None,
    typer.Option("--media-root", callback=local_location, hidden=True, help="The old name of --document-root."),
]
ReviewOldMediaUrlPrefixOption = Annotated[
    str | None, typer.Option("--media-url-prefix", hidden=True, help="The old name of --url-prefix.")
]


def command(
    scored: ScoredArgument,
    output: ReviewOutputOption,
    format: ReviewFormatOption = None,
    limit: ReviewLimitOption = None,
    questions: ReviewQuestionsOption = None,
    order: ReviewOrderOption = ReviewOrder.uncertainty,
    exclude: ReviewExcludeOption = None,
    gold_format: ReviewGoldFormatOption = GoldFormat.auto,
    seed: ReviewSeedOption = 0,
    records: RecordsOption = None,
    document_root: DocumentRootOption = None,
    url_prefix: ReviewUrlPrefixOption = None,
    old_media_root: ReviewOldMediaRootOption = None,
    old_media_url_prefix: ReviewOldMediaUrlPrefixOption = None,
    config_out: ConfigOutOption = None,
) -> None:
    """Write the records people should review first, with clef's answers as predictions."""
    from clef_cli.quality.review.content import LOCAL_FILES_PREFIX
    from clef_cli.quality.review.job import ReviewSettings, run_review

    for option, written in (("-o", output), ("--config-out", config_out)):
        refuse_overlap(option, written, [scored, exclude, *(records or ())])
    document_root = renamed(document_root, old_media_root, "--document-root", "--media-root") or Path("/")
    url_prefix = renamed(url_prefix, old_media_url_prefix, "--url-prefix", "--media-url-prefix") or LOCAL_FILES_PREFIX

    settings = ReviewSettings(
        scored=scored, output=output, format=format.value if format else None, limit=limit, order=order.value,
        exclude=exclude,
        questions=[q.strip() for q in questions.split(",") if q.strip()] if questions else None,
        gold_format=gold_format.value, seed=seed, records=records, media_root=document_root,
        media_url_prefix=url_prefix, config_out=config_out,
    )  # fmt: skip
    result = run_review(settings)
    for note in result.notes:
        stderr.print(f"note: {note}", markup=False)
    stderr.print(f"wrote {output}: {result.records:,} of {plural(result.candidates, 'record')}", markup=False)


def renamed(value: Any, old: Any, name: str, old_name: str) -> Any:
    """An option given by its old name still works, with a warning naming the new one (`clef
    review --media-root` named a folder URLs are made from, where `clef score --media-root` is a
    fence); both names at once are refused."""
    if old is None:
        return value
    if value is not None:
        raise UsageError(f"{old_name} is the old name of {name}: give {name} only")
    stderr.print(f"warning: {old_name} is now {name}; the old name will go", markup=False)
    return old
