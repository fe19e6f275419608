"""What a folder or a glob stands for: its parts in name order, with their Hive partition keys.

Local folders are listed with `pathlib` (parts named by their resolved path, as a file input is,
their relative media resolving against the folder they were found in: `local_part`), each real
folder and file once (a symbolic link loop is refused, never followed round), remote ones through
the one object client (`locations/object_store`: its filesystem for the bucket, `opened`, None for
local; its timeouts and sorting of failures).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote

from clef_cli.errors import UsageError
from clef_cli.inputs.formats import FOLDER_KINDS, FOLDER_READABLE, format_of
from clef_cli.locations.object_store import MissingObject, _retried

Opener = Callable[[str], "tuple[Any, str]"]
"""A URI to (pyarrow filesystem, path): sources' one way of opening a location."""


class Part(NamedTuple):
    location: str
    size: int
    partitions: tuple[tuple[str, str | None], ...]
    base: str | None = None
    """Where its relative media resolve when not its location's folder: a local part reached
    through a symbolic link (the part itself or a folder above it) resolves them against the
    folder it was found in, not its target's (`local_part`)."""
    shown: str = ""
    """The part's path as the folder or glob was spelled (`data/lang=en/part-0.parquet`): two
    partitions' parts share their file name, so messages name this."""


def local_part(path: Path, partitions: tuple[tuple[str, str | None], ...] = ()) -> Part:
    """A local file as a part: named by its resolved path (so one file has one name however it
    is reached), its media resolving against the folder `path` lies in, links not followed."""
    resolved = path.resolve()
    found = Path(os.path.abspath(path)).parent
    base = str(found) if found != resolved.parent else None
    return Part(str(resolved), resolved.stat().st_size, partitions, base)


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
    base: str | None = None
    real: str | None = None
    """A local item's resolved path (links followed), which the walk reads once."""


def _listed(folder: str, opened: Opener | None) -> list[_Entry]:
    if opened is None:
        entries = []
        for item in Path(folder).iterdir():
            if item.is_dir():
                entries.append(_Entry(item.name, str(item), True, 0, real=os.path.realpath(item)))
            elif item.is_file():
                part = local_part(item)
                entries.append(_Entry(item.name, part.location, False, part.size, part.base, part.location))
        return sorted(entries, key=lambda entry: entry.name)
    import pyarrow.fs as pafs

    filesystem, path = opened(folder)
    scheme = folder.split("://", 1)[0]
    listed = _retried(folder, True, lambda: filesystem.get_file_info(pafs.FileSelector(path, recursive=False)))
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


def hive_partition(segment: str) -> tuple[str, str | None] | None:
    """`lang=en` as ("lang", "en"), percent-decoded as pyarrow and Spark write it; else None."""
    key, equals, value = segment.partition("=")
    if not equals or not key:
        return None
    decoded = unquote(value)
    return unquote(key), None if decoded == HIVE_NULL else decoded


def folder_parts(folder: str, opened: Opener | None) -> list[Part]:
    """A folder's parts in name order, `key=value` subfolders included (Hive partitions). Each
    real folder and file is read once: one that symbolic links lead to again (a loop, or a
    second link to it) is refused, never read twice."""
    found: list[Part] = []
    seen: dict[str, str] = {os.path.realpath(folder): folder} if opened is None else {}

    def visit(entry: _Entry) -> None:
        if entry.real is None:
            return
        if entry.real in seen:
            raise UsageError(
                f"folder {folder}: {entry.location} is {seen[entry.real]} again (through a symbolic link: a loop, "
                "or a second link to it); clef reads each folder and file once: remove the link"
            )
        seen[entry.real] = entry.location

    def walk(location: str, partitions: tuple[tuple[str, str | None], ...], shown: str) -> None:
        for entry in _listed(location, opened):
            if entry.name.startswith((".", "_")):  # _SUCCESS, .crc files, _common_metadata
                continue
            partition = hive_partition(entry.name) if entry.is_dir else None
            if partition is not None:
                visit(entry)
                walk(entry.location, (*partitions, partition), f"{shown}/{entry.name}")
            elif not entry.is_dir and format_of(entry.name) is not None:
                visit(entry)
                found.append(Part(entry.location, entry.size, partitions, entry.base, f"{shown}/{entry.name}"))

    walk(folder, (), folder.rstrip("/"))
    for kinds in FOLDER_KINDS:
        parts = [part for part in found if _kind(part.location) in kinds]
        if parts:
            return parts
    raise UsageError(f"folder {folder} holds no part clef reads ({FOLDER_READABLE})")


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
    matched: dict[str, Part] = {}
    for part, name in _matching(root, segments[fixed:], scheme, opened):
        below = name.rstrip("/").split("/")[-(len(segments) - fixed) : -1]
        partitions = tuple(p for p in (hive_partition(s) for s in below) if p is not None)
        if format_of(part.location.rsplit("/", 1)[-1]) is None:
            continue
        if part.location in matched:
            raise UsageError(
                f"{pattern} matches {part.location} twice (through a symbolic link); clef reads each file once: "
                "remove the link, or narrow the pattern"
            )
        matched[part.location] = part._replace(partitions=partitions, shown=name)
    if not matched:
        raise UsageError(f"no input file matches {pattern}")
    return sorted(matched.values(), key=lambda part: part.location)


def _matching(root: str, pattern: list[str], scheme: str, opened: Opener | None) -> list[tuple[Part, str]]:
    """(part, the name it matched under) of the files under `root` whose path below it matches
    `pattern`."""
    if opened is None:
        import glob

        matches = glob.glob(str(Path(root, *pattern)))
        return [(local_part(Path(m)), m) for m in matches if Path(m).is_file()]
    import pyarrow.fs as pafs

    filesystem, path = opened(f"{scheme}://{root}")
    selector = pafs.FileSelector(path, recursive=len(pattern) > 1)
    try:
        listed = _retried(f"{scheme}://{root}", True, lambda: filesystem.get_file_info(selector))
    except MissingObject:
        return []
    found = []
    for item in listed:
        below = item.path[len(path) :].strip("/").split("/")
        if (
            item.type == pafs.FileType.File
            and len(below) == len(pattern)
            and all(fnmatch.fnmatchcase(name, part) for name, part in zip(below, pattern, strict=True))
        ):
            found.append((Part(f"{scheme}://{item.path}", item.size or 0, ()), f"{scheme}://{item.path}"))
    return found
