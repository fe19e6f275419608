"""What a folder or a glob stands for: its parts in name order, with their Hive partition keys.

Local folders are listed with `pathlib` (parts named by their resolved path, as a file input is),
remote ones through the pyarrow filesystem `sources` opens for them (`opened`: None for local).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote

from clef_cli.errors import UsageError
from clef_cli.inputs.formats import format_of

Opener = Callable[[str], "tuple[Any, str]"]
"""A URI to (pyarrow filesystem, path): sources' one way of opening a location."""


class Part(NamedTuple):
    location: str
    size: int
    partitions: tuple[tuple[str, str | None], ...]


def _kind(location: str) -> str | None:
    found = format_of(location.rstrip("/").rsplit("/", 1)[-1])
    return found.kind if found is not None else None




@dataclass(frozen=True)
class _Entry:
    """One item of a listed folder, local or remote."""

    name: str
    location: str
    is_dir: bool
    size: int


def _listed(folder: str, opened: Opener | None) -> list[_Entry]:
    if opened is None:
        entries = []
        for item in Path(folder).iterdir():
            if item.is_dir():
                entries.append(_Entry(item.name, str(item), True, 0))
            elif item.is_file():
                entries.append(_Entry(item.name, str(item.resolve()), False, item.stat().st_size))
        return sorted(entries, key=lambda entry: entry.name)
    import pyarrow.fs as pafs

    filesystem, path = opened(folder)
    scheme = folder.split("://", 1)[0]
    listed = filesystem.get_file_info(pafs.FileSelector(path, recursive=False))
    return sorted(
        (
            _Entry(item.base_name, f"{scheme}://{item.path}", item.type == pafs.FileType.Directory, item.size or 0)
            for item in listed
            if item.type in (pafs.FileType.Directory, pafs.FileType.File)
        ),
        key=lambda entry: entry.name,
    )


HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
"""The value Hive, Spark and pyarrow write for a null partition key."""
FOLDER_KINDS = (("parquet",), ("jsonl",), ("csv", "tsv"))
"""A folder stands for its parts of the first kind it holds (so a README.json or a questions file
beside the parts is never read as records)."""


def hive_partition(segment: str) -> tuple[str, str | None] | None:
    """`lang=en` as ("lang", "en"), percent-decoded as pyarrow and Spark write it; else None."""
    key, equals, value = segment.partition("=")
    if not equals or not key:
        return None
    decoded = unquote(value)
    return unquote(key), None if decoded == HIVE_NULL else decoded


def folder_parts(folder: str, opened: Opener | None) -> list[Part]:
    """A folder's parts in name order, `key=value` subfolders included (Hive partitions)."""
    found: list[Part] = []

    def walk(location: str, partitions: tuple[tuple[str, str | None], ...]) -> None:
        for entry in _listed(location, opened):
            if entry.name.startswith((".", "_")):  # _SUCCESS, .crc files, _common_metadata
                continue
            partition = hive_partition(entry.name) if entry.is_dir else None
            if partition is not None:
                walk(entry.location, (*partitions, partition))
            elif not entry.is_dir and format_of(entry.name) is not None:
                found.append(Part(entry.location, entry.size, partitions))

    walk(folder, ())
    for kinds in FOLDER_KINDS:
        parts = [part for part in found if _kind(part.location) in kinds]
        if parts:
            return parts
    raise UsageError(f"folder {folder} holds no .parquet, .jsonl or .csv files")


# ----------------------------------------------------------------------------- globs


GLOB_CHARACTERS = re.compile(r"[*?[]")


def glob_parts(pattern: str, opened: Opener | None) -> list[Part]:
    """The files a pattern names (`parts/*.parquet`), in name order; `*` stays within a folder.
    Folders below the pattern's first wildcard named `key=value` are Hive partitions."""
    scheme, path = pattern.split("://", 1) if opened is not None else ("", pattern)
    segments = path.split("/")
    fixed = next(i for i, segment in enumerate(segments) if GLOB_CHARACTERS.search(segment))
    if fixed == 0 and opened is not None:
        raise UsageError(f"{pattern}: a glob matches names inside a bucket, not bucket names")
    root = "/".join(segments[:fixed]) or ("/" if path.startswith("/") else ".")
    matched: list[Part] = []
    for location, size in _matching(root, segments[fixed:], scheme, opened):
        below = location.rstrip("/").split("/")[-(len(segments) - fixed) : -1]
        partitions = tuple(p for p in (hive_partition(s) for s in below) if p is not None)
        if format_of(location.rsplit("/", 1)[-1]) is not None:
            matched.append(Part(location, size, partitions))
    if not matched:
        raise UsageError(f"no input file matches {pattern}")
    return sorted(matched, key=lambda part: part.location)


def _matching(root: str, pattern: list[str], scheme: str, opened: Opener | None) -> list[tuple[str, int]]:
    """(location, size) of the files under `root` whose path below it matches `pattern`."""
    if opened is None:
        import glob

        matches = glob.glob(str(Path(root, *pattern)))
        return [(str(Path(m).resolve()), Path(m).stat().st_size) for m in matches if Path(m).is_file()]
    import pyarrow.fs as pafs

    filesystem, path = opened(f"{scheme}://{root}")
    try:
        listed = filesystem.get_file_info(pafs.FileSelector(path, recursive=len(pattern) > 1))
    except FileNotFoundError:
        return []
    found = []
    for item in listed:
        below = item.path[len(path) :].strip("/").split("/")
        if (
            item.type == pafs.FileType.File
            and len(below) == len(pattern)
            and all(fnmatch.fnmatchcase(name, part) for name, part in zip(below, pattern, strict=True))
        ):
            found.append((f"{scheme}://{item.path}", item.size or 0))
    return found
