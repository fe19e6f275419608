"""Input files: local paths or URIs that pyarrow's filesystems understand (s3://, gs://, ...).

Every input location, from the command line or a library call, is resolved here and only here:
a URI of pyarrow's local filesystem (`file:///abs`, `file:/abs`, `local:///abs`) becomes the
local path it names, so media paths resolve against its folder exactly as for a plain path.
A folder (local or remote) stands for its parts, `key=value` subfolders included (Hive
partitions), and a glob for the files it matches, in name order, so a job's record order is
stable from one run to the next (listing.py). `-`, `/dev/stdin` and other pipes are read once
into a spool (streams.py), since a job reads its inputs more than once. The tables the other
commands read whole (a scored Parquet, a gold file) are resolved here too (`local_copy`).
"""

from __future__ import annotations

import atexit
import hashlib
import io
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from clef_cli.errors import UsageError
from clef_cli.inputs.formats import READABLE, Format, format_of
from clef_cli.inputs.listing import GLOB_CHARACTERS, Part, folder_parts, glob_parts
from clef_cli.inputs.streams import spooled_stream, stream_input
from clef_cli.locations.object_store import ObjectProblem, is_object_uri, is_under, joined, normalized, parent

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


MediaBase = Path | str | None
"""Where an input's relative media entries resolve: a local folder, an object folder's URI
(`s3://b/records/`), or None (an input with no folder)."""


def media_base(text: str | None) -> MediaBase:
    """A `MediaBase` carried as text (a Ray row): an object folder's URI stays a URI."""
    if not text:
        return None
    return text if is_object_uri(text) else Path(text)


def names_object(entry: str, base: MediaBase) -> bool:
    """Whether a media entry (not data: or http(s)) names an object in a store: an object URI,
    or a relative path in an input that is itself an object."""
    return is_object_uri(entry) or (isinstance(base, str) and not Path(entry).is_absolute())


def media_location(entry: str, base: MediaBase) -> Path | str:
    """Where a media entry that is neither a data: nor an http(s) URL lies: a local path, or a
    normalised object URI; a relative entry resolves against its input's folder, local or remote
    (`..` resolved, so the confinement test sees the object that is read). An `ObjectProblem`
    when it cannot resolve."""
    if is_object_uri(entry):
        return normalized(entry)
    if isinstance(base, str) and not Path(entry).is_absolute():
        return joined(base, entry)
    path = Path(entry)
    if not path.is_absolute():
        if base is None:
            raise ObjectProblem(f"relative media path {entry!r} in an input without a folder: use absolute paths")
        path = base / path
    return path


def check_object_allowed(uri: str, base: MediaBase, roots: tuple[str, ...]) -> None:
    """An object may be read when it lies under the folder of the input that names it or under a
    --media-root URI; else an `ObjectProblem` naming --media-root (the job's credentials must not
    read what the user did not point clef at)."""
    allowed = (base,) if isinstance(base, str) else ()
    if not any(is_under(uri, root) for root in (*allowed, *roots)):
        raise ObjectProblem(f"{uri} is outside the input's folder and the media roots (--media-root)")


@dataclass(frozen=True)
class InputFile:
    location: str
    """A local absolute path or a URI."""
    size: int
    partitions: tuple[tuple[str, str | None], ...] = ()
    """Hive partition keys from the folders between the input given and this part
    (`lang=en/part-0.parquet`: `lang` = "en"); they become columns of its rows."""
    base: str | None = None
    """Where relative media paths resolve, when not the file's folder (stdin: the working directory)."""
    shown: str | None = None
    """The name messages use, when not the file's own (`stdin` for a spooled stream)."""

    @property
    def name(self) -> str:
        return self.shown or self.location.rstrip("/").rsplit("/", 1)[-1]

    @property
    def format(self) -> Format:
        found = format_of(self.location.rstrip("/").rsplit("/", 1)[-1])
        return found if found is not None else Format("jsonl")

    @property
    def is_parquet(self) -> bool:
        return self.format.kind == "parquet"

    @property
    def base_dir(self) -> MediaBase:
        """Where relative media paths resolve: the folder of the input (for stdin, the working
        directory), a local path or (for an object in a store) its folder's URI, ending in `/`
        (`media_location`)."""
        if self.base is not None:
            return Path(self.base)
        if not is_uri(self.location):
            return Path(self.location).parent
        try:
            return parent(normalized(self.location))
        except ObjectProblem:  # a URI with a query string: its media must be absolute
            return None

    def open_binary(self, decompress: bool = True) -> BinaryIO:
        """The file's bytes, decompressed when its name says it is compressed (`.gz`, `.zst`)
        unless `decompress` is False (the stored bytes, which a fingerprint hashes)."""
        compression = self.format.compression if decompress else None
        if not is_uri(self.location):
            if compression is None:
                return open(self.location, "rb")
            import pyarrow as pa

            stream = pa.input_stream(self.location, compression=compression)
        else:
            filesystem, path = _filesystem(self.location)
            stream = filesystem.open_input_stream(path, compression=compression)
        # pyarrow's streams read but cannot iterate lines; a buffered reader over them can.
        return io.BufferedReader(stream, buffer_size=1 << 20)  # type: ignore[arg-type]

    def parquet(self) -> Any:
        import pyarrow.parquet as pq

        if not is_uri(self.location):
            return pq.ParquetFile(self.location)
        filesystem, path = _filesystem(self.location)
        return pq.ParquetFile(filesystem.open_input_file(path))


def _check_suffix(location: str) -> None:
    if format_of(location.rstrip("/").rsplit("/", 1)[-1]) is None:
        raise UsageError(f"{location}: unsupported input type (use {READABLE})")


# ----------------------------------------------------------------------------- tables

_copies: dict[str, Path] = {}
_copy_folder: list[str] = []
NO_SIZE_LIMIT = 1 << 62


def local_copy(location: str | Path, what: str) -> Path:
    """A local file with the bytes of a table a command reads whole (a scored Parquet, a gold
    file): a local path (or a local-filesystem URI) as it is; an object, read once per process
    into a temporary folder (removed when the process ends) under its own name, so readers tell
    its format by its suffix and fingerprint it as a file. A missing object is a usage error
    naming `what`; errors no file causes (credentials, the endpoint) an `ObjectStoreError`."""
    found = local_path(location)
    if found is not None:
        return found
    text = str(location)
    if text in _copies:
        return _copies[text]
    from clef_cli.locations.object_store import object_uri, read_object

    uri = object_uri(text, what)
    if not _copy_folder:
        _copy_folder.append(tempfile.mkdtemp(prefix="clef-tables-"))
        atexit.register(shutil.rmtree, _copy_folder[0], True)
    target = Path(_copy_folder[0]) / str(len(_copies)) / uri.rsplit("/", 1)[1]
    target.parent.mkdir()
    try:
        with open(target, "wb") as into:
            read_object(uri, NO_SIZE_LIMIT, into)
    except ObjectProblem as problem:
        raise UsageError(f"{what} {text!r}: {problem}") from None
    _copies[text] = target
    return target


# ----------------------------------------------------------------------------- expansion


def _files(parts: list[Part]) -> list[InputFile]:
    return [InputFile(part.location, part.size, part.partitions) for part in parts]


def _expand_local(path: Path, given: str | Path) -> list[InputFile]:
    if stream_input(given):
        spool = spooled_stream(str(given))
        return [InputFile(spool.path, spool.size, base=spool.base, shown=spool.shown)]
    if path.is_dir():
        return _files(folder_parts(str(path), None))
    if path.is_file():
        _check_suffix(str(path))
        return [InputFile(str(path.resolve()), path.stat().st_size)]
    if GLOB_CHARACTERS.search(str(given)):
        return _files(glob_parts(str(path), None))
    raise UsageError(f"input not found: {given}")


def _expand_uri(uri: str) -> list[InputFile]:
    import pyarrow.fs as pafs

    filesystem, path = _filesystem(uri)
    info = filesystem.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        return _files(folder_parts(uri, _filesystem))
    if info.type == pafs.FileType.File:
        _check_suffix(uri)
        return [InputFile(uri, info.size or 0)]
    if GLOB_CHARACTERS.search(path):
        return _files(glob_parts(uri, _filesystem))
    raise UsageError(f"input not found: {uri}")


def unfound_local(location: str | Path) -> bool:
    """A local input that names nothing there (no file, folder, stream or glob): refused before
    a job makes anything; the rest is checked where the inputs are expanded."""
    import glob

    path = local_path(location)
    if path is None or path.exists() or stream_input(location):
        return False
    return not GLOB_CHARACTERS.search(str(path)) or next(glob.iglob(str(path)), None) is None


def expand_inputs(paths: Iterable[str | Path]) -> list[InputFile]:
    """Input files in a stable order, checked to exist and to be of a readable type. Local files
    (given as paths or as local-filesystem URIs) are named by their absolute path; a folder or a
    glob stands for its parts in name order; stdin and pipes are read once, into a spool."""
    files: list[InputFile] = []
    for raw in paths:
        path = local_path(raw)
        files.extend(_expand_local(path, raw) if path is not None else _expand_uri(str(raw)))
    if not files:
        raise UsageError("no input files given")
    return files


def input_fingerprint(source: InputFile, full_hash_below: int = 1 << 30) -> dict[str, Any]:
    """Content, not timestamps: a copied file is the same input, an edited one is not. Very large
    files are sampled (size plus the first, middle and last MiB) to keep resuming fast. A
    compressed file is hashed as stored; stdin and pipes as their spool (they are read once)."""
    size = source.size
    with source.open_binary(decompress=False) as handle:
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
