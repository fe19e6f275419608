"""What `clef eval` and `clef calibrate` read: the scored file and its gold, from a gold file
(`--gold`) or a column the scored file passed through (`--gold-column`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_cli.errors import UsageError
from clef_cli.quality.labels.gold import GoldSet, column_gold_rows, load_gold, match_gold
from clef_cli.quality.labels.scored import ScoredFile, read_scored
from clef_cli.sizes import plural


@dataclass
class Inputs:
    scored: ScoredFile
    gold: GoldSet
    warnings: list[str] = field(default_factory=list)


def read_inputs(
    scored_path: Path | str, gold_path: Path | str | None, gold_column: str | None, gold_format: str = "auto"
) -> Inputs:
    """The scored file and its gold, from a file (`--gold`) or a passed-through column (`--gold-column`)."""
    if (gold_path is None) == (gold_column is None):
        raise UsageError("give exactly one of --gold FILE or --gold-column NAME")
    scored = read_scored(scored_path)
    if gold_path is not None:
        return Inputs(scored, load_gold(gold_path, scored.options, failed_ids=scored.failed, format=gold_format))
    assert gold_column is not None
    column = passed_column(scored, gold_column, "--gold-column")
    rows, problems = column_gold_rows(scored.ids, column, gold_column)
    return Inputs(scored, match_gold(rows, scored.options, failed_ids=scored.failed, found=problems))


def passed_column(scored: ScoredFile, name: str, option: str) -> list[Any]:
    if name not in scored.columns.column_names:
        kept = ", ".join(scored.columns.column_names) or "none"
        raise UsageError(
            f"{option} {name!r}: the scored file has no such column (passed-through columns: {kept}); "
            "score with --keep-columns to carry it"
        )
    return scored.columns.column(name).to_pylist()


def no_usable_gold(gold: GoldSet) -> UsageError:
    """Why nothing can be measured: the problems listed above, or a gold with no label at all."""
    if gold.problems:
        problems = plural(len(gold.problems), "problem")
        return UsageError(f"no scored record has a usable gold label; see the {problems} above")
    return UsageError("no scored record has a usable gold label: the gold holds no label for any scored record")
