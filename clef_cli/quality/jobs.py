"""`clef eval` and `clef calibrate` as library calls: read the scored file and the gold, compute,
return plain results for the CLI (or a notebook) to print and save."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_cli.errors import UsageError
from clef_cli.quality import metrics
from clef_cli.quality.calibrate import Calibration, CalibrationRun, calibrate, load_calibration
from clef_cli.quality.gold import GoldSet, column_gold_rows, load_gold, match_gold
from clef_cli.quality.scored import Labelled, ScoredFile, labelled, read_scored


@dataclass
class Inputs:
    scored: ScoredFile
    gold: GoldSet
    warnings: list[str] = field(default_factory=list)


def read_inputs(
    scored_path: Path, gold_path: Path | None, gold_column: str | None, gold_format: str = "auto"
) -> Inputs:
    """The scored file and its gold, from a file (`--gold`) or a passed-through column (`--gold-column`)."""
    if (gold_path is None) == (gold_column is None):
        raise UsageError("give exactly one of --gold FILE or --gold-column NAME")
    scored = read_scored(scored_path)
    if gold_path is not None:
        return Inputs(scored, load_gold(gold_path, scored.options, failed_ids=scored.failed, format=gold_format))
    assert gold_column is not None
    column = _column(scored, gold_column, "--gold-column")
    rows, problems = column_gold_rows(scored.ids, column, gold_column)
    return Inputs(scored, match_gold(rows, scored.options, failed_ids=scored.failed, found=problems))


def _column(scored: ScoredFile, name: str, option: str) -> list[Any]:
    if name not in scored.columns.column_names:
        kept = ", ".join(scored.columns.column_names) or "none"
        raise UsageError(
            f"{option} {name!r}: the scored file has no such column (passed-through columns: {kept}); "
            "score with --keep-columns to carry it"
        )
    return scored.columns.column(name).to_pylist()


@dataclass
class EvalResult:
    metrics: dict[str, Any]
    """The `--json` document."""
    labelled: Labelled
    """The overall per-question data (for the report)."""
    warnings: list[str]


def run_eval(
    inputs: Inputs,
    bins: int = 15,
    target: float = 0.95,
    calibration: Calibration | None = None,
    by: str | None = None,
) -> EvalResult:
    if bins < 1:
        raise UsageError("--bins must be at least 1")
    if not 0 < target <= 1:
        raise UsageError("--target-accuracy must be in (0, 1]")
    temperature = calibration.temperature if calibration is not None else None
    overall = labelled(inputs.scored, inputs.gold, temperature)
    if not overall.questions:
        raise no_usable_gold(inputs.gold)
    document = metrics.evaluate(overall.questions, bins, target)
    if calibration is not None:
        document["calibration"] = {"method": calibration.method, "sha256": calibration.sha256}
    if by is not None:
        document["by"] = {"column": by, "groups": []}
        for value, record_ids in group_records(inputs.scored.ids, _column(inputs.scored, by, "--by")):
            subset = labelled(inputs.scored, inputs.gold, temperature, records=record_ids)
            if subset.questions:
                document["by"]["groups"].append({"value": value, **metrics.evaluate(subset.questions, bins, target)})
    return EvalResult(document, overall, overall.warnings)


def group_records(ids: Sequence[str], values: Sequence[Any]) -> list[tuple[Any, list[str]]]:
    """(value, its record ids) per distinct value of a `--by` column, in order of first appearance.

    Values are told apart by their JSON text, so null and the string "null" are two groups; the
    value is returned as strict JSON can hold it (a date, a byte string or NaN as its text)."""
    groups: dict[str, tuple[Any, list[str]]] = {}
    for record_id, value in zip(ids, values, strict=True):
        key = json.dumps(value, default=str, sort_keys=True)
        groups.setdefault(key, (json.loads(key, parse_constant=str), []))[1].append(record_id)
    return list(groups.values())


def run_calibrate(inputs: Inputs, method: str = "auto", bins: int = 15) -> tuple[CalibrationRun, Labelled]:
    data = labelled(inputs.scored, inputs.gold)
    if not data.questions:
        raise no_usable_gold(inputs.gold)
    fitted_on = {
        "scored_sha256": inputs.scored.sha256,
        "gold_sha256": inputs.gold.sha256,
        "n": sum(question.n for question in data.questions.values()),
    }
    return calibrate(data.questions, method, bins, fitted_on), data


def no_usable_gold(gold: GoldSet) -> UsageError:
    """Why nothing can be measured: the problems listed above, or a gold with no label at all."""
    if gold.problems:
        return UsageError(f"no scored record has a usable gold label; see the {len(gold.problems)} problem(s) above")
    return UsageError("no scored record has a usable gold label: the gold holds no label for any scored record")


def read_calibration(path: Path | None) -> Calibration | None:
    return load_calibration(path) if path is not None else None


@dataclass
class ReviewSettings:
    scored: Path
    output: Path
    format: str = "label-studio"
    limit: int | None = None
    questions: list[str] | None = None
    order: str = "uncertainty"
    exclude: Path | None = None
    gold_format: str = "auto"
    seed: int = 0
    records: list[Path] | None = None
    media_root: Path = Path("/")
    media_url_prefix: str = "/data/local-files/?d="
    config_out: Path | None = None


@dataclass
class ReviewResult:
    records: int
    candidates: int
    notes: list[str]


def run_review(settings: ReviewSettings) -> ReviewResult:
    """Select and order the records to review and write the review file (and the Label Studio
    config); both written atomically."""
    from clef_cli.quality import review, review_content, review_formats
    from clef_cli.quality.gold import labelled_ids
    from clef_cli.store.atomic import write_text

    if settings.limit is not None and settings.limit < 1:
        raise UsageError("--limit must be at least 1")
    if settings.config_out is not None and settings.format != "label-studio":
        raise UsageError("--config-out goes with --format label-studio")
    scored = read_scored(settings.scored)
    exclude = labelled_ids(settings.exclude, settings.gold_format) if settings.exclude else set()
    chosen, questions = review.select(
        scored, settings.questions, settings.order, None, exclude, settings.seed
    )
    picked = chosen if settings.limit is None else chosen[: settings.limit]
    shown = review_content.Shown({}, {}, [])
    if settings.format in review_formats.SHOWS_RECORDS:
        urls = review_content.MediaUrls(settings.media_root, settings.media_url_prefix)
        shown = review_content.load_content(scored, dict.fromkeys(r.id for r in picked), urls, settings.records)
    text, config = review_formats.render(
        settings.format, picked, shown.content, questions, review_formats.model_version(scored.metadata), shown.texts
    )
    write_text(settings.output, text)
    if settings.config_out is not None and config is not None:
        write_text(settings.config_out, config)
    notes = list(shown.notes)
    copies = review.copies(scored, chosen)
    if copies:
        notes.append(f"{copies} record(s) repeat the prompt of a queued record (the same record_key): queued once")
    if exclude:
        notes.append(f"{len(exclude)} labelled record(s) in --exclude were left out")
    return ReviewResult(len(picked), len(chosen), notes)
