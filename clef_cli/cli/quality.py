"""`clef eval`, `clef calibrate` and `clef train-head`: how good the scores are, and making them
better. eval and calibrate read Parquet and never import torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from clef_cli.cli.console import stderr, stdout
from clef_cli.cli.errors import EXIT_GATE_REFUSED
from clef_cli.cli.options import (
    PATH_OR_URI,
    CalibrationMethod,
    DeviceOption,
    QuestionsOption,
    QuietOption,
    ReportOption,
    RevisionOption,
    ScoredArgument,
    TableFormat,
    local_location,
    read_location,
    release_location,
    writable_file_or_stdout,
    writable_folder,
)
from clef_cli.cli.progress import TrainHeadProgress
from clef_cli.errors import UsageError
from clef_cli.locations.overlap import refuse_overlap
from clef_cli.quality.labels.exports import GoldFormat
from clef_cli.sizes import plural
from clef_cli.store.atomic import is_stdout

GoldOption = Annotated[
    str | None,
    typer.Option(
        "--gold",
        callback=read_location,
        metavar=PATH_OR_URI,
        help="Gold labels: JSONL, JSON list, CSV or Parquet with `id` plus a `labels` object or wide columns; "
        "or a Label Studio / Argilla export (recognised from its content). A path or a URI (s3://...).",
    ),
]
TrainGoldOption = Annotated[
    str,
    typer.Option(
        "--gold",
        callback=read_location,
        metavar=PATH_OR_URI,
        help="Gold labels (JSONL, JSON, CSV or Parquet; a path or a URI; as clef eval).",
    ),
]
GoldFormatOption = Annotated[
    GoldFormat,
    typer.Option("--gold-format", help="Read --gold as this format instead of recognising it from the content."),
]
GoldColumnOption = Annotated[
    str | None,
    typer.Option("--gold-column", help="Take gold from this column of the scored file (kept with --keep-columns)."),
]
BinsOption = Annotated[int, typer.Option("--bins", min=1, help="Equal-width confidence bins for ECE.")]
FormatOption = Annotated[
    TableFormat,
    typer.Option(
        "--format",
        help="table: rich on a terminal, plain aligned text in a pipe or file; tsv: one value per cell, "
        "full precision; markdown.",
    ),
]


def write_json(path: Path, document: Any) -> None:
    from clef_cli.store.atomic import write_text

    text = json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False) + "\n"  # strict JSON: no NaN
    write_text(path, text)


def tables_console(*outputs: Path | None) -> Console:
    """stdout for the tables, unless a file is written there (`-`): then stderr."""
    return stderr if any(path is not None and is_stdout(path) for path in outputs) else stdout


EvaluateJsonPathOption = Annotated[
    str | None,
    typer.Option(
        "--json",
        callback=writable_file_or_stdout,
        metavar=PATH_OR_URI,
        help="Write every metric as JSON here (- for stdout).",
    ),
]
EvaluateTargetAccuracyOption = Annotated[
    float, typer.Option("--target-accuracy", help="Accuracy the confidence threshold must reach.")
]
EvaluateCalibrationOption = Annotated[
    str | None,
    typer.Option(
        "--calibration",
        callback=read_location,
        metavar=PATH_OR_URI,
        help="Evaluate as if this `clef calibrate` file had been applied.",
    ),
]
EvaluateByOption = Annotated[
    str | None, typer.Option("--by", help="Repeat everything per value of this passed-through column.")
]


def evaluate(
    scored: ScoredArgument,
    gold: GoldOption = None,
    gold_column: GoldColumnOption = None,
    gold_format: GoldFormatOption = GoldFormat.auto,
    json_path: EvaluateJsonPathOption = None,
    report: ReportOption = None,
    bins: BinsOption = 15,
    target_accuracy: EvaluateTargetAccuracyOption = 0.95,
    calibration: EvaluateCalibrationOption = None,
    by: EvaluateByOption = None,
    form: FormatOption = TableFormat.table,
) -> None:
    """Accuracy, calibration and an accept-without-review threshold per question, against gold labels."""
    from clef_cli.quality.calibrate.job import read_calibration
    from clef_cli.quality.evaluate.job import run_eval
    from clef_cli.quality.evaluate.tables import print_eval, print_problems
    from clef_cli.quality.labels.inputs import read_inputs

    if is_stdout(json_path or "") and is_stdout(report or ""):
        raise UsageError("--json and --report cannot both be - (stdout)")
    refuse_overlap("--json", json_path, [scored, gold, calibration])
    refuse_overlap("--report", report, [scored, gold, calibration])
    console = tables_console(json_path, report)
    inputs = read_inputs(scored, gold, gold_column, gold_format.value)
    print_problems(stderr, inputs.gold.problems)
    result = run_eval(inputs, bins, target_accuracy, read_calibration(calibration), by)
    print_problems(stderr, (), result.warnings)
    print_eval(console, result.metrics, form.value, by)
    if json_path is not None:
        write_json(json_path, result.metrics)
    if report is not None:
        from clef_cli.quality.evaluate.report import write_report

        write_report(report, result.metrics, result.labelled.questions, bins, target_accuracy)


CalibrateOutputOption = Annotated[
    str,
    typer.Option(
        "--output",
        "-o",
        callback=writable_file_or_stdout,
        metavar=PATH_OR_URI,
        help="Calibration file to write (JSON; - for stdout).",
    ),
]
CalibrateMethodOption = Annotated[
    CalibrationMethod,
    typer.Option(
        "--method",
        help="auto picks by cross-fitted log loss (5 folds of records, one per record when fewer); else one "
        "temperature per model (global), per question type, or per question.",
    ),
]


def calibrate(
    scored: ScoredArgument,
    output: CalibrateOutputOption,
    gold: GoldOption = None,
    gold_column: GoldColumnOption = None,
    gold_format: GoldFormatOption = GoldFormat.auto,
    method: CalibrateMethodOption = CalibrationMethod.auto,
    bins: BinsOption = 15,
    form: FormatOption = TableFormat.table,
) -> None:
    """Fit temperature scaling (p = softmax(logit / T)) to gold labels; apply it with
    `clef score --calibration` or `clef eval --calibration`.
    """
    from clef_cli.quality.calibrate import tables
    from clef_cli.quality.calibrate.job import run_calibrate
    from clef_cli.quality.evaluate.tables import print_problems
    from clef_cli.quality.labels.inputs import read_inputs
    from clef_cli.quality.text_table import print_tables, write

    refuse_overlap("-o", output, [scored, gold])
    console = tables_console(output)
    inputs = read_inputs(scored, gold, gold_column, gold_format.value)
    print_problems(stderr, inputs.gold.problems)
    run, data = run_calibrate(inputs, method.value, bins)
    print_problems(stderr, (), [*data.warnings, *tables.bound_warnings(run)])
    lines = tables.calibrate_lines(run, method.value)
    if form is TableFormat.tsv:
        write(console, tables.calibrate_tsv(run))
        for line in lines:
            stderr.print(line, markup=False)
    else:
        print_tables(console, [tables.calibrate_table(run, lines)], form.value)
    write_json(output, run.calibration.as_json())


TrainCheckpointArgument = Annotated[
    str,
    typer.Argument(
        callback=read_location,
        help="Checkpoint of a `clef score` job, a folder or a store in a bucket (s3://bucket/store/); the states it "
        "lacks need --records.",
    ),
]


HeadOutputOption = Annotated[
    str,
    typer.Option(
        "--output",
        "-o",
        callback=writable_folder,
        metavar="DIR",
        help="Folder for the trained head (release layout; a local folder).",
    ),
]
TrainModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        callback=release_location,
        help="Release the job was scored with (default: from the checkpoint).",
    ),
]
BaseHeadOption = Annotated[
    str | None,
    typer.Option(
        "--base-head",
        callback=local_location,
        metavar="DIR",
        help="Head folder to start from and beat (default: the release's).",
    ),
]


TrainHeadScoredOption = Annotated[
    str | None,
    typer.Option(
        "--scored",
        callback=read_location,
        metavar=PATH_OR_URI,
        help="The `clef score` output whose ids the gold uses: its record_key maps each gold id to the stored "
        "prompt it labels (without it, an id that names several stored prompts takes the latest run's).",
    ),
]
TrainHeadEpochsOption = Annotated[
    int, typer.Option("--epochs", min=1, help="Most passes over the training records (early stopping ends sooner).")
]
TrainHeadLrOption = Annotated[
    float, typer.Option("--lr", min=0.0, help="Peak AdamW learning rate (warm-up, then cosine).")
]
TrainHeadBatchTokensOption = Annotated[
    int, typer.Option("--batch-tokens", min=1, help="Padded tokens per training batch (length-sorted batches).")
]
TrainHeadPatienceOption = Annotated[
    int, typer.Option("--patience", min=1, help="Epochs without a better inner-validation log loss, then stop.")
]
TrainHeadLabelSmoothingOption = Annotated[
    float, typer.Option("--label-smoothing", min=0.0, max=0.99, help="Label smoothing of the cross-entropy.")
]
TrainHeadBrierWeightOption = Annotated[float, typer.Option("--brier-weight", min=0.0, help="Weight of the Brier term.")]
TrainHeadFoldsOption = Annotated[
    int, typer.Option("--folds", min=2, help="Folds of the held-out gate (split by record).")
]
TrainHeadSeedOption = Annotated[int, typer.Option("--seed", help="Seed of folds, batch order and bootstrap.")]
TrainHeadForceOption = Annotated[bool, typer.Option("--force", help="Write the head even when the gate fails.")]
TrainHeadRecordsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--records",
        callback=read_location,
        metavar=PATH_OR_URI,
        help="The records `clef score` took (repeatable): gold records the checkpoint holds without hidden "
        "states (--hidden-states selective or drop) get them computed (the thinker runs on those only). "
        "Records the job read with --questions need the same --questions here.",
    ),
]


def train_head(
    checkpoint: TrainCheckpointArgument,
    gold: TrainGoldOption,
    output: HeadOutputOption,
    gold_format: GoldFormatOption = GoldFormat.auto,
    model: TrainModelOption = None,
    revision: RevisionOption = None,
    base_head: BaseHeadOption = None,
    scored: TrainHeadScoredOption = None,
    epochs: TrainHeadEpochsOption = 30,
    lr: TrainHeadLrOption = 1e-3,
    batch_tokens: TrainHeadBatchTokensOption = 4096,
    patience: TrainHeadPatienceOption = 5,
    label_smoothing: TrainHeadLabelSmoothingOption = 0.05,
    brier_weight: TrainHeadBrierWeightOption = 1.0,
    folds: TrainHeadFoldsOption = 5,
    seed: TrainHeadSeedOption = 0,
    device: DeviceOption = "auto",
    force: TrainHeadForceOption = False,
    quiet: QuietOption = False,
    records: TrainHeadRecordsOption = None,
    questions: QuestionsOption = None,
) -> None:
    """Fit the joint head to your gold labels from a checkpoint's stored hidden states (the
    thinker runs only with --records, for gold records whose states the store lacks), gated by
    k-fold held-out proof: HEAD_DIR is written only when the held-out log loss beats the base
    head recalibrated on the training folds (per-question temperature and option biases) with a
    bootstrap 95% interval of the difference below zero, and no question is significantly worse;
    otherwise the numbers are printed and the exit code is 4 (--force writes anyway). A linear
    probe on the same folds shows what the states hold.
    """
    from clef_cli.quality.train.fit import FitSettings
    from clef_cli.quality.train.job import GateRefused, TrainHeadSettings
    from clef_cli.quality.train.job import train_head as run_train_head

    refuse_overlap("-o", output, [checkpoint, gold, scored, base_head, *(records or ())], folder=True)
    fit = FitSettings(
        epochs=epochs, lr=lr, batch_tokens=batch_tokens, label_smoothing=label_smoothing, brier_weight=brier_weight,
        patience=patience,
    )  # fmt: skip
    settings = TrainHeadSettings(
        checkpoint=checkpoint, gold=gold, output=output, model=model, base_head=base_head, revision=revision,
        fit=fit, folds=folds, seed=seed, device=device, force=force, gold_format=gold_format.value,
        scored=scored, records=tuple(records or ()), questions=questions,
    )  # fmt: skip
    progress = TrainHeadProgress(enabled=not quiet, total_epochs=epochs * (folds + 1))
    try:
        result = run_train_head(settings, progress)
    except GateRefused as refused:
        progress.stop()
        print_gate(refused.report)
        stderr.print(f"error: {refused}", markup=False)
        raise typer.Exit(EXIT_GATE_REFUSED) from None
    finally:
        progress.stop()
    print_gate(result.report)
    computed = result.report.get("states_computed")
    if computed and not computed["summary"].startswith("no --records"):  # also under --quiet (no stage lines)
        stderr.print(computed["summary"], markup=False)
    stderr.print(f"wrote {output} ({plural(result.report['new_head']['parameters'], 'parameter')})", markup=False)


def print_gate(report: dict[str, Any]) -> None:
    """The held-out table on stderr (rich on a terminal, plain text in a pipe or a file), then
    the gate's numbers per question and overall."""
    from clef_cli.quality.text_table import print_tables
    from clef_cli.quality.train.tables import gate_table

    held = report["held_out"]
    print_tables(stderr, [gate_table(report)])
    for question, numbers in report["by_question"].items():
        gate = numbers["gate"]
        notes = " SIGNIFICANTLY WORSE" if gate["significantly_worse"] else ""
        notes += " (fewer than 50 labels: the interval is optimistic)" if gate["few_labels"] else ""
        stderr.print(
            f"  {question}: {plural(gate['labels'], 'label')}, log loss difference (trained - recalibrated base) "
            f"{gate['mean']:+.4f}, 95% CI [{gate['ci95'][0]:+.4f}, {gate['ci95'][1]:+.4f}]{notes}",
            markup=False,
        )
    difference = held["log_loss_difference"]
    gate = report["gate"]
    verdict = "passed" if gate["passed"] else ("failed, written anyway (--force)" if gate["forced"] else "failed")
    stderr.print(
        f"{plural(report['gold']['records'], 'gold record')}; held-out log loss difference "
        "(trained - recalibrated base) "
        f"{difference['mean']:+.4f}, 95% CI [{difference['ci95'][0]:+.4f}, {difference['ci95'][1]:+.4f}]: "
        f"gate {verdict}",
        markup=False,
    )
