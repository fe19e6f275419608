"""Input files: local paths or URIs that pyarrow's filesystems understand (s3://, gs://, ...).

Every input location, from the command line or a library call, is resolved here and only here:
a URI of pyarrow's local filesystem (`file:///abs`, `file:/abs`, `local:///abs`) becomes the
local path it names, so media paths resolve against its folder exactly as for a plain path.
A folder (local or remote) stands for its Parquet parts, in name order, so a job's record order
is stable from one run to the next.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from clef_cli.errors import UsageError

INPUT_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet", ".pq")
PARQUET_SUFFIXES = (".parquet", ".pq")


LOCAL_SCHEMES = ("file", "local")
"""pyarrow's schemes for the local filesystem; they also work without `//` (`file:/abs`)."""
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")


def is_uri(location: str | Path) -> bool:
    """A string with a scheme (`s3://...`, `file:/...`); a `Path` is always local."""
    if isinstance(location, Path):
        return False
    match = _SCHEME.match(location)
    return match is not None and ("://" in location or match.group(1).lower() in LOCAL_SCHEMES)


def local_path(location: str | Path) -> Path | None:
    """The local path a location names (a plain path or a local-filesystem URI); None if remote,
    told by the scheme alone (no filesystem is opened, so a bucket is never asked)."""
    if not is_uri(location):
        return Path(location)
    match = _SCHEME.match(str(location))
    if match is None or match.group(1).lower() not in LOCAL_SCHEMES:
        return None
    import pyarrow.fs as pafs

    filesystem, path = _filesystem(str(location))
    return Path(path) if isinstance(filesystem, pafs.LocalFileSystem) else None


def _filesystem(uri: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError, ImportError) as error:
        raise UsageError(f"cannot open {uri}: {error}") from None


@dataclass(frozen=True)
class InputFile:
    location: str
    """A local absolute path or a URI."""
    size: int

    @property
    def name(self) -> str:
        return self.location.rstrip("/").rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        return Path(self.name).suffix.lower()

    @property
    def is_parquet(self) -> bool:
        return self.suffix in PARQUET_SUFFIXES

    @property
    def base_dir(self) -> Path | None:
        """Where relative media paths resolve: the folder of a local input (none for a remote one)."""
        return None if is_uri(self.location) else Path(self.location).parent

    def open_binary(self) -> BinaryIO:
        if not is_uri(self.location):
            return open(self.location, "rb")
        filesystem, path = _filesystem(self.location)
        # pyarrow's streams read but cannot iterate lines; a buffered reader over them can.
        return io.BufferedReader(filesystem.open_input_stream(path), buffer_size=1 << 20)  # type: ignore[arg-type]

    def parquet(self) -> Any:
        import pyarrow.parquet as pq

        if not is_uri(self.location):
            return pq.ParquetFile(self.location)
        filesystem, path = _filesystem(self.location)
        return pq.ParquetFile(filesystem.open_input_file(path))


def _check_suffix(location: str) -> None:
    if Path(location.rstrip("/")).suffix.lower() not in INPUT_SUFFIXES:
        raise UsageError(f"{location}: unsupported input type (use .jsonl, .json or .parquet)")


def _expand_local(path: Path, given: str | Path) -> list[InputFile]:
    if path.is_dir():
        parts = sorted(p for p in path.iterdir() if p.suffix in PARQUET_SUFFIXES and p.is_file())
        if not parts:
            raise UsageError(f"folder {path} holds no .parquet files")
        return [InputFile(str(part.resolve()), part.stat().st_size) for part in parts]
    if path.is_file():
        _check_suffix(str(path))
        return [InputFile(str(path.resolve()), path.stat().st_size)]
    raise UsageError(f"input not found: {given}")


def _expand_uri(uri: str) -> list[InputFile]:
    import pyarrow.fs as pafs

    filesystem, path = _filesystem(uri)
    scheme = uri.split("://", 1)[0]
    info = filesystem.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        listed = filesystem.get_file_info(pafs.FileSelector(path, recursive=False))
        parts = sorted(
            (item for item in listed if item.type == pafs.FileType.File and item.extension in ("parquet", "pq")),
            key=lambda item: item.path,
        )
        if not parts:
            raise UsageError(f"folder {uri} holds no .parquet files")
        return [InputFile(f"{scheme}://{item.path}", item.size or 0) for item in parts]
    if info.type == pafs.FileType.File:
        _check_suffix(uri)
        return [InputFile(uri, info.size or 0)]
    raise UsageError(f"input not found: {uri}")


def expand_inputs(paths: Iterable[str | Path]) -> list[InputFile]:
    """Input files in a stable order, checked to exist and to be of a readable type. Local files
    (given as paths or as local-filesystem URIs) are named by their absolute path."""
    files: list[InputFile] = []
    for raw in paths:
        path = local_path(raw)
        files.extend(_expand_local(path, raw) if path is not None else _expand_uri(str(raw)))
    if not files:
        raise UsageError("no input files given")
    return files


def input_fingerprint(source: InputFile, full_hash_below: int = 1 << 30) -> dict[str, Any]:
    """Content, not timestamps: a copied file is the same input, an edited one is not. Very large
    files are sampled (size plus the first, middle and last MiB) to keep resuming fast."""
    size = source.size
    with source.open_binary() as handle:
        if size < full_hash_below:
            hasher = hashlib.sha256()
            while chunk := handle.read(1 << 20):
                hasher.update(chunk)
            digest = hasher.hexdigest()
        else:
            hasher = hashlib.sha256(str(size).encode())
            position = 0
            for offset in (0, size // 2, max(0, size - (1 << 20))):
                while position < offset:  # streams from remote filesystems cannot seek
                    position += len(handle.read(min(1 << 24, offset - position)))
                chunk = handle.read(1 << 20)
                position += len(chunk)
                hasher.update(chunk)
            digest = "sampled:" + hasher.hexdigest()
    return {"path": source.location, "bytes": size, "sha256": digest}
