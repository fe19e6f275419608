"""`clef eval` as a library call: the metrics of a scored file against its gold, overall and per
`--by` group, returned as plain results for the CLI (or a notebook) to print and save."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clef_cli.errors import UsageError
from clef_cli.quality import metrics
from clef_cli.quality.calibrate.temperature import Calibration
from clef_cli.quality.labels.inputs import Inputs, no_usable_gold, passed_column
from clef_cli.quality.labels.scored import Labelled, labelled


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
        for value, record_ids in group_records(inputs.scored.ids, passed_column(inputs.scored, by, "--by")):
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
