"""Scored Parquet files in `clef score`'s own layout (its Arrow schema), written from chosen
probabilities, so ordering and drift tests control ties and flips without running the model."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from clef_cli.results import RESULT_SCHEMA, long_rows

NOUL = ("true", "false")
TEAMS = ("billing", "sales", "tech")
LEVELS = ("0", "1", "2", "3")
SCHEMA = {"urgent": ("noul", NOUL), "team": ("choice", TEAMS), "severity": ("score", LEVELS)}

Answers = dict[str, tuple[float, ...]]
"""question id -> probabilities in head order."""


def answer_row(question_id: str, probabilities: tuple[float, ...]) -> dict:
    qtype, options = SCHEMA[question_id]
    best = int(np.argmax(probabilities))
    return {
        "question_id": question_id,
        "type": qtype,
        "answer": options[best],
        "confidence": max(probabilities),
        "noul": probabilities[0] if qtype == "noul" else None,
        "score": sum(i * p for i, p in enumerate(probabilities)) if qtype == "score" else None,
        "labels": [
            {"label": label, "probability": p, "logit": math.log(max(p, 1e-12))}
            for label, p in zip(options, probabilities, strict=True)
        ],
    }


def write_scored(
    path: Path,
    records: list[tuple[str, Answers | None]],
    layout: str = "wide",
    extra: dict[str, list] | None = None,
    metadata: dict[str, str] | None = None,
) -> Path:
    """`records` as (id, answers or None for a failed record), record_index = position."""
    rows = []
    for index, (record_id, answers) in enumerate(records):
        rows.append({
            "id": record_id, "record_index": index, "prompt_tokens": 10, "state_tokens_cut": 0,
            "error": None if answers is not None else f"record {record_id!r}: failed",
            "answers": [answer_row(q, p) for q, p in answers.items()] if answers is not None else None,
        })  # fmt: skip
    table = pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)
    if layout == "long":
        table = long_rows(table)
    for name, values in (extra or {}).items():
        if layout == "long":  # each row of a record repeats its record's value
            values = [values[index] for index in table.column("record_index").to_pylist()]
        if name in table.column_names:  # a column clef writes (record_key): filled in place
            table = table.set_column(table.column_names.index(name), name, pa.array(values, pa.string()))
        else:
            table = table.append_column(name, pa.array(values))
    default = {"clef.model": "org/clef-omni-test", "clef.head_sha256": "ab" * 32}
    table = table.replace_schema_metadata({**default, **(metadata or {})})
    pq.write_table(table, path)
    return path


def random_probabilities(rng: np.random.Generator, k: int, decimals: int = 1) -> tuple[float, ...]:
    """Coarse probabilities (rounded, renormalised to sum 1 in the last option), so ties are common."""
    raw = rng.dirichlet(np.ones(k))
    rounded = np.round(raw[:-1], decimals)
    if rounded.sum() > 1:
        rounded = rounded / rounded.sum() * 0.9
    return (*(float(x) for x in rounded), float(1 - rounded.sum()))


def random_records(seed: int, n: int, prefix: str = "r") -> list[tuple[str, Answers | None]]:
    rng = np.random.default_rng(seed)
    records: list[tuple[str, Answers | None]] = []
    for i in range(n):
        answers = {q: random_probabilities(rng, len(options)) for q, (_, options) in SCHEMA.items()}
        if i % 7 == 3:
            del answers["severity"]  # records with other questions
        records.append((f"{prefix}{i:03d}", answers if i % 11 != 5 else None))  # and failed records
    return records
