"""`clef review` as a library call: select and order the records people should label, and write
them in the chosen tool's format (and the Label Studio config)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clef_cli.errors import UsageError
from clef_cli.quality.labels.scored import read_scored


@dataclass
class ReviewSettings:
    scored: Path | str
    """A local path or a URI (s3://...)."""
    output: Path
    format: str | None = None
    """One of formats.FORMATS; None: the output's extension says (formats.format_for)."""
    limit: int | None = None
    questions: list[str] | None = None
    order: str = "uncertainty"
    exclude: Path | str | None = None
    gold_format: str = "auto"
    seed: int = 0
    records: list[Path | str] | None = None
    """The scored inputs (`--records`): local paths or URIs, expanded as `clef score` expands them."""
    media_root: Path = Path("/")
    media_url_prefix: str = "/data/local-files/?d="
    config_out: Path | str | None = None


@dataclass
class ReviewResult:
    records: int
    candidates: int
    notes: list[str]


def run_review(settings: ReviewSettings) -> ReviewResult:
    """Select and order the records to review and write the review file (and the Label Studio
    config); both written atomically."""
    from clef_cli.quality.labels.gold import labelled_ids
    from clef_cli.quality.review import content, formats, queue
    from clef_cli.store.atomic import write_text

    if settings.limit is not None and settings.limit < 1:
        raise UsageError("--limit must be at least 1")
    format = formats.format_for(settings.output, settings.format)
    if settings.config_out is not None and format != "label-studio":
        raise UsageError("--config-out goes with --format label-studio")
    scored = read_scored(settings.scored)
    exclude = labelled_ids(settings.exclude, settings.gold_format) if settings.exclude else set()
    chosen, questions = queue.select(scored, settings.questions, settings.order, None, exclude, settings.seed)
    picked = chosen if settings.limit is None else chosen[: settings.limit]
    shown = content.Shown({}, {}, [])
    if format in formats.SHOWS_RECORDS:
        urls = content.MediaUrls(settings.media_root, settings.media_url_prefix)
        shown = content.load_content(scored, dict.fromkeys(r.id for r in picked), urls, settings.records)
        picked = [record for record in picked if record.id not in set(shown.edited)]
    text, config = formats.render(
        format, picked, shown.content, questions, formats.model_version(scored.metadata), shown.texts
    )
    write_text(settings.output, text)
    if settings.config_out is not None and config is not None:
        write_text(settings.config_out, config)
    notes = list(shown.notes)
    copies = queue.copies(scored, chosen)
    if copies:
        notes.append(f"{copies} record(s) repeat the prompt of a queued record (the same record_key): queued once")
    if exclude:
        notes.append(f"{len(exclude)} labelled record(s) in --exclude were left out")
    return ReviewResult(len(picked), len(chosen), notes)
