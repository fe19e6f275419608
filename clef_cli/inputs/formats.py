"""What an input file is, from its name: a table format and a compression.

One place answers it for every reader and every engine: `records.jsonl.gz` is JSONL read through
gzip, `export.csv` is CSV, `part-0.parquet` is Parquet. A name this table does not know is refused
before anything is read, with the list of what clef reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".pq": "parquet"}
KINDS |= {".csv": "csv", ".tsv": "tsv"}
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
"""Stream compressions (pyarrow's codecs: no other dependency); Parquet compresses inside the file."""
TEXT_KINDS = ("jsonl", "json", "csv", "tsv")
"""The kinds that may be compressed as a whole stream."""
FOLDER_KINDS = (("parquet",), ("jsonl",), ("csv", "tsv"))
"""The kinds a folder's parts may be, in the order a folder is read by (it stands for its parts
of the first kind it holds); never `json`, so a README.json or a questions file beside the parts
is never read as records (inputs/listing.py)."""


def _suffixes(kinds: tuple[str, ...]) -> str:
    listed = [suffix for kind in kinds for suffix, found in KINDS.items() if found == kind]
    return f"{', '.join(listed[:-1])} or {listed[-1]}, the text ones also as {' or '.join(COMPRESSIONS)}"


READABLE = _suffixes(tuple(dict.fromkeys(KINDS.values())))
"""What clef reads, in the words of every refusal that names a file it cannot (`.jsonl, .ndjson,
.json, .parquet, .pq, .csv or .tsv, the text ones also as .gz or .zst`)."""
FOLDER_READABLE = _suffixes(tuple(kind for kinds in FOLDER_KINDS for kind in kinds))
"""What a folder's parts may be: READABLE less `.json`."""


class Cells(str, Enum):
    """How a table's cells hold a record's fields, which decides how a field's cell is read
    (inputs/records.py), whatever column the field comes from (inputs/columns.py)."""

    values = "values"
    """JSON and JSONL: a cell is the JSON value it holds."""
    typed = "typed"
    """Parquet: typed cells; a text `state` or `questions` cell may hold JSON text."""
    text = "text"
    """CSV and TSV: every cell is text, so `state` and `questions` may be JSON text, an empty
    `questions` or media cell is none, and a media cell is one path or a JSON list of them."""


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
    def cells(self) -> Cells:
        """How the file's cells hold a record's fields."""
        if self.kind == "parquet":
            return Cells.typed
        return Cells.text if self.kind in ("csv", "tsv") else Cells.values


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
