"""What an input file is, from its name: a table format and a compression.

One place answers it for every reader and every engine: `records.jsonl.gz` is JSONL read through
gzip, `export.csv` is CSV, `part-0.parquet` is Parquet. A name this table does not know is refused
before anything is read, with the list of what clef reads.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".pq": "parquet"}
KINDS |= {".csv": "csv", ".tsv": "tsv"}
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
"""Stream compressions (pyarrow's codecs: no other dependency); Parquet compresses inside the file."""
TEXT_KINDS = ("jsonl", "json", "csv", "tsv")
"""The kinds that may be compressed as a whole stream."""
READABLE = ".jsonl, .ndjson, .json, .parquet, .csv or .tsv, the text ones also as .gz or .zst"


@dataclass(frozen=True)
class Format:
    kind: str
    """parquet, jsonl, json, csv or tsv."""
    compression: str | None = None
    """gzip, zstd, or None."""

    @property
    def splittable(self) -> bool:
        """Whether byte ranges of the file can be read apart (plain JSONL; Parquet by row group)."""
        return self.kind == "jsonl" and self.compression is None

    @property
    def text_cells(self) -> bool:
        """Whether `state` and `questions` may arrive as JSON text (Parquet and CSV cells), not
        only as values (JSON and JSONL records)."""
        return self.kind in ("parquet", "csv", "tsv")


def format_of(name: str) -> Format | None:
    """The format a file name says (`x.jsonl.gz`: gzip-compressed JSONL); None if not readable."""
    lowered = name.lower()
    compression = None
    for suffix, codec in COMPRESSIONS.items():
        if lowered.endswith(suffix):
            lowered, compression = lowered[: -len(suffix)], codec
            break
    dot = lowered.rfind(".")
    kind = KINDS.get(lowered[dot:]) if dot > 0 else None
    if kind is None or (compression is not None and kind not in TEXT_KINDS):
        return None
    return Format(kind, compression)
