"""`clef compare --report`: one self-contained HTML page in the eval report's style.

Per question: the answer shares of both runs side by side, a confidence histogram for each run,
and the first flipped records.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np

from clef_cli.quality.compare.drift import Comparison, QuestionDrift
from clef_cli.quality.figures import STYLE, new_figure, place_legend, png_uri
from clef_cli.sizes import plural
from clef_cli.store.atomic import write_text

OLD_COLOUR, NEW_COLOUR = "#7f8c8d", "#1f6fb4"
FLIPS_SHOWN = 20


def distribution_png(drift: QuestionDrift) -> str:
    old, new = drift.document["old"]["shares"], drift.document["new"]["shares"]
    figure, axes = new_figure()
    positions = np.arange(len(drift.options))
    axes.bar(positions - 0.2, [old[o] for o in drift.options], width=0.4, label="old", color=OLD_COLOUR)
    axes.bar(positions + 0.2, [new[o] for o in drift.options], width=0.4, label="new", color=NEW_COLOUR)
    axes.set_xticks(positions, drift.options, rotation=45 if len(drift.options) > 4 else 0, ha="right", fontsize=8)
    axes.set(ylabel="share of shared records", title="Answers")
    place_legend(figure, axes)
    return png_uri(figure)


def confidence_png(confidence: np.ndarray, run: str, colour: str) -> str:
    figure, axes = new_figure()
    axes.hist(confidence, bins=np.linspace(0, 1, 21), color=colour)
    mean = f", mean {confidence.mean():.3f}" if confidence.size else ""
    axes.set(xlim=(0, 1), xlabel="confidence (max probability)", ylabel="records", title=f"Confidence, {run} run{mean}")
    return png_uri(figure)


def _number(value: Any) -> str:
    if value is None:
        return "—"
    return f"{value:.4f}" if isinstance(value, float) else html.escape(str(value))


SUMMARY = ("n", "flipped", "flipped_share", "psi", "js")


def _summary(document: dict[str, Any]) -> list[str]:
    header = "".join(f"<th>{name}</th>" for name in ("question", "type", *SUMMARY, "mean conf. old", "mean conf. new"))
    rows = [f"<table><tr>{header}</tr>"]
    for qid, found in document["questions"].items():
        cells = "".join(f"<td class='num'>{_number(found[name])}</td>" for name in SUMMARY)
        confidence = "".join(f"<td class='num'>{_number(found[run]['mean_confidence'])}</td>" for run in ("old", "new"))
        rows.append(f"<tr><td><a href='#q-{html.escape(qid)}'>{html.escape(qid)}</a></td>"
                    f"<td>{found['type']}</td>{cells}{confidence}</tr>")  # fmt: skip
    rows.append("</table>")
    return rows


def _flips_table(flips: list[dict[str, Any]]) -> str:
    if not flips:
        return "<p class='note'>No flipped records.</p>"
    columns = [c for c in ("record_key", "id") if c in flips[0]] + [
        "old_answer", "new_answer", "old_confidence", "new_confidence"
    ]  # fmt: skip
    head = "".join(f"<th>{c}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td class='num'>{_number(flip[c])}</td>" for c in columns) + "</tr>"
        for flip in flips[:FLIPS_SHOWN]
    )
    more = f"<p class='note'>{len(flips) - FLIPS_SHOWN} more in --json.</p>" if len(flips) > FLIPS_SHOWN else ""
    return f"<table><tr>{head}</tr>{body}</table>{more}"


def render(comparison: Comparison) -> str:
    document = comparison.document
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>clef compare report</title>",
        f"<style>{STYLE}</style></head><body><h1>clef compare</h1>",
        f"<p>old: {html.escape(document['old']['path'])} ({plural(document['old']['records'], 'scored record')}); "
        f"new: {html.escape(document['new']['path'])} ({document['new']['records']:,}). "
        f"{plural(document['shared_records'], 'record')} in both, joined on <code>{document['join']}</code>; "
        f"{document['only_old_records']:,} only in old, {document['only_new_records']:,} only in new.</p>",
        *_summary(document),
    ]
    for qid, drift in comparison.questions.items():
        found = drift.document
        images = [
            distribution_png(drift),
            confidence_png(drift.old_confidence, "old", OLD_COLOUR),
            confidence_png(drift.new_confidence, "new", NEW_COLOUR),
        ]
        parts.append(f"<h2 id='q-{html.escape(qid)}'>{html.escape(qid)} <small>({drift.type}, n = {found['n']}, "
                     f"{found['flipped']} flipped)</small></h2>")  # fmt: skip
        parts.append(
            "<div class='plots'>" + "".join(f"<img alt='{html.escape(qid)}' src='{uri}'>" for uri in images) + "</div>"
        )
        parts.append(_flips_table([f for f in document["flips"] if f["question_id"] == qid]))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(path: Path, comparison: Comparison) -> None:
    text = render(comparison)
    write_text(path, text)
