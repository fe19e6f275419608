"""`clef eval --report`: one self-contained HTML page (PNG plots inlined as data: URIs) for a person.

Per question: a reliability diagram, a confusion heat map, accuracy against coverage with the
threshold marked, and for score questions the histogram of gold and predicted levels.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from clef_cli.quality import metrics
from clef_cli.quality.figures import STYLE, new_figure, place_legend, png_uri
from clef_cli.quality.labels.scored import QuestionData
from clef_cli.sizes import plural
from clef_cli.store.atomic import write_text


def reliability_figure(data: QuestionData, bins: int) -> Any:
    table = metrics.reliability(data.probabilities, data.gold, bins)
    figure, axes = new_figure()
    edges = np.linspace(0, 1, bins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    counts = axes.twinx()
    counts.bar(centres, table.counts, width=1 / bins, color="#dddddd", zorder=0)
    counts.set_ylabel("records per bin (grey bars)", color="#888888")
    axes.set_zorder(counts.get_zorder() + 1)
    axes.patch.set_visible(False)
    axes.plot([0, 1], [0, 1], "--", color="#999999", label="perfect calibration")
    used = table.counts > 0
    axes.plot(table.confidence[used], table.accuracy[used], "o-", color="#1f6fb4", label="accuracy per bin")
    axes.set(xlim=(0, 1), ylim=(0, 1.02), xlabel="confidence (max probability)", ylabel="accuracy")
    axes.set_title("Reliability")
    place_legend(figure, axes)
    return figure


def confusion_figure(data: QuestionData) -> Any:
    matrix = np.array(metrics.confusion(data.probabilities, data.gold, data.option_ids)["matrix"])
    figure, axes = new_figure()
    axes.imshow(matrix, cmap="Blues")
    ticks = range(len(data.option_ids))
    axes.set_xticks(ticks, data.option_ids, rotation=45, ha="right", fontsize=8)
    axes.set_yticks(ticks, data.option_ids, fontsize=8)
    for row in ticks:
        for column in ticks:
            dark = matrix[row, column] > matrix.max() / 2
            axes.text(
                column, row, str(matrix[row, column]), ha="center", va="center", color="white" if dark else "black"
            )
    axes.set(xlabel="predicted", ylabel="gold", title="Confusion")
    return figure


def coverage_figure(data: QuestionData, target: float, found: Mapping[str, Any]) -> Any:
    """Accuracy against coverage; the threshold a filled diamond, or a hollow one (and said so)
    when it rests on fewer than FEW_RECORDS records."""
    cuts, coverage, accuracy = metrics.coverage_curve(data.probabilities, data.gold)
    figure, axes = new_figure()
    axes.plot(coverage, accuracy, "o-", markersize=3, color="#1f6fb4", label="accept if confidence ≥ c")
    axes.axhline(target, linestyle=":", color="#c0392b", label=f"target {target:g}")
    if found.get("threshold") is not None:
        at = int(np.flatnonzero(cuts == found["threshold"])[0])
        label = f"threshold c = {found['threshold']:.3f}"
        few = metrics.few_records(found)
        if few:
            label += f": rests on {plural(found['threshold_records'], 'record')} (fewer than {metrics.FEW_RECORDS})"
        face = "none" if few else "#c0392b"
        axes.plot([coverage[at]], [accuracy[at]], "D", markersize=8, color="#c0392b", markerfacecolor=face, label=label)
        axes.axvline(coverage[at], linestyle=":", color="#c0392b")
    axes.set(xlim=(0, 1.02), ylim=(0, 1.02), xlabel="coverage (share accepted)", ylabel="accuracy of accepted")
    axes.set_title("Accuracy vs coverage")
    place_legend(figure, axes)
    return figure


def levels_figure(data: QuestionData) -> Any:
    levels = len(data.option_ids)
    gold = np.bincount(data.gold, minlength=levels)
    guess = np.bincount(metrics.predicted(data.probabilities), minlength=levels)
    figure, axes = new_figure()
    positions = np.arange(levels)
    axes.bar(positions - 0.2, gold, width=0.4, label="gold", color="#7f8c8d")
    axes.bar(positions + 0.2, guess, width=0.4, label="predicted (argmax)", color="#1f6fb4")
    axes.set_xticks(positions, data.option_ids)
    axes.set(xlabel="level", ylabel="records", title="Score levels")
    place_legend(figure, axes)
    return figure


def figures(data: QuestionData, bins: int, target: float, found: Mapping[str, Any]) -> list[Any]:
    """The plots of one question, in page order."""
    shown = [reliability_figure(data, bins), confusion_figure(data), coverage_figure(data, target, found)]
    if data.type == "score":
        shown.append(levels_figure(data))
    return shown


def _number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, list):
        return "[" + ", ".join(_number(v) for v in value) + "]"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


SUMMARY = (
    "n", "accuracy", "accuracy_ci", "macro_f1", "log_loss", "brier", "ece", "ece_ci", "threshold", "threshold_records",
    "coverage",
)  # fmt: skip
FEW_MARK = "*"


def _summary_row(qid: str, found: Mapping[str, Any]) -> str:
    cells = []
    for name in SUMMARY:
        mark = FEW_MARK if name == "threshold" and metrics.few_records(found) else ""
        cells.append(f"<td class='num'>{_number(found.get(name))}{mark}</td>")
    link = f"<a href='#q-{html.escape(qid)}'>{html.escape(qid)}</a>"
    return f"<tr><td>{link}</td><td>{html.escape(found['type'])}</td>{''.join(cells)}</tr>"


def _notes(document: Mapping[str, Any]) -> list[str]:
    """What the summary table's marks and dashes mean."""
    notes = []
    few = [qid for qid, found in document["questions"].items() if metrics.few_records(found)]
    if few:
        notes.append(
            f"{FEW_MARK} the threshold rests on fewer than {metrics.FEW_RECORDS} records (the records at or above "
            f"it; see threshold_records): {', '.join(few)}."
        )
    for qid, found in document["questions"].items():
        notes += [f"{qid}: {name} is undefined: {reason}." for name, reason in found.get("undefined", {}).items()]
    return [f"<p class='note'>{html.escape(note)}</p>" for note in notes]


def render(document: Mapping[str, Any], questions: Mapping[str, QuestionData], bins: int, target: float) -> str:
    """The HTML text of the report for `document` (from `metrics.evaluate`) and its data."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>clef eval report</title>",
        f"<style>{STYLE}</style></head><body><h1>clef eval</h1>",
        f"<p>{plural(document['records'], 'record')} with gold; joint exact match "
        f"{_number(document['joint_exact_match'])}. ECE with {plural(bins, 'bin')}; threshold for accuracy ≥ "
        f"{target:g}.</p>",
    ]
    if "calibration" in document:
        parts.append(f"<p class='note'>Evaluated with calibration {html.escape(str(document['calibration']))}.</p>")
    header = "".join(f"<th>{name}</th>" for name in ("question", "type", *SUMMARY))
    parts.append(f"<table><tr>{header}</tr>")
    parts += [_summary_row(qid, found) for qid, found in document["questions"].items()]
    parts.append("</table>")
    parts += _notes(document)
    for qid, found in document["questions"].items():
        data = questions[qid]
        extra = "".join(
            f"<tr><th>{name}</th><td class='num'>{_number(found[name])}</td></tr>"
            for name in ("rps", "mae", "within_one")
            if name in found
        )
        images = [png_uri(figure) for figure in figures(data, bins, target, found)]
        parts.append(
            f"<h2 id='q-{html.escape(qid)}'>{html.escape(qid)} <small>({data.type}, n = {data.n})</small></h2>"
        )
        if extra:
            parts.append(f"<table>{extra}</table>")
        parts.append(
            "<div class='plots'>" + "".join(f"<img alt='{html.escape(qid)}' src='{uri}'>" for uri in images) + "</div>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    path: Path, document: Mapping[str, Any], questions: Mapping[str, QuestionData], bins: int, target: float
) -> None:
    text = render(document, questions, bins, target)
    write_text(path, text)
