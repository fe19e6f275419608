"""What `clef compare` prints: the drift table and the answer shares, as text cells."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clef_cli.quality.text_table import TextTable, fixed
from clef_cli.sizes import plural


def compare_tables(document: Mapping[str, Any]) -> list[TextTable]:
    """Per question n, flips, PSI, JS and mean confidence; then the answer shares of both runs."""
    title = (
        f"{plural(document['shared_records'], 'record')} in both runs (joined on {document['join']}); "
        f"{document['only_old_records']:,} only in old, {document['only_new_records']:,} only in new"
    )
    rows = []
    for qid, found in document["questions"].items():
        confidence = f"{fixed(found['old']['mean_confidence'])} → {fixed(found['new']['mean_confidence'])}"
        psi, js = (fixed(found[name], 4) for name in ("psi", "js"))
        flipped = f"{found['flipped']} ({fixed(found['flipped_share'])})"
        rows.append([qid, str(found["n"]), flipped, psi, js, confidence])
    headers = ["question", "n", "flipped", "PSI", "JS", "mean conf. old → new"]
    summary = TextTable(title, headers, rows, [False] + [True] * 5)
    shares = []
    for qid, found in document["questions"].items():
        for option, count in found["old"]["counts"].items():
            new_count = found["new"]["counts"][option]
            shares.append([qid, option, f"{count} ({fixed(found['old']['shares'][option])})",
                           f"{new_count} ({fixed(found['new']['shares'][option])})"])  # fmt: skip
    title = "answer shares, old → new (shared records)"
    return [summary, TextTable(title, ["question", "answer", "old", "new"], shares, [False, False, True, True])]
