"""`clef calibrate` as a library call: temperatures fitted on a scored file's gold, returned for the
CLI (or a notebook) to print and save; and reading a saved calibration for `--calibration`."""

from __future__ import annotations

from pathlib import Path

from clef_cli.errors import UsageError
from clef_cli.quality.calibrate.temperature import Calibration, CalibrationRun, calibrate, load_calibration
from clef_cli.quality.labels.inputs import Inputs, no_usable_gold
from clef_cli.quality.labels.scored import Labelled, labelled


def run_calibrate(inputs: Inputs, method: str = "auto", bins: int = 15) -> tuple[CalibrationRun, Labelled]:
    if inputs.scored.no_logits:  # a calibrated flat file: no logits to fit on
        raise UsageError(inputs.scored.no_logits)
    data = labelled(inputs.scored, inputs.gold)
    if not data.questions:
        raise no_usable_gold(inputs.gold)
    fitted_on = {
        "scored_sha256": inputs.scored.sha256,
        "gold_sha256": inputs.gold.sha256,
        "n": sum(question.n for question in data.questions.values()),
    }
    return calibrate(data.questions, method, bins, fitted_on), data


def read_calibration(path: Path | str | None) -> Calibration | None:
    return load_calibration(path) if path is not None else None
