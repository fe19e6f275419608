"""Input files: local paths or URIs that pyarrow's filesystems understand (s3://, gs://, ...).

Every input, from the command line or a library call, is expanded here into its files, its
location told apart by `locations/uris.py`: a URI of pyarrow's local filesystem (`file:///abs`,
`file:/abs`, `local:///abs`) becomes the local path it names, so media paths resolve against its
folder exactly as for a plain path.
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
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from clef_cli.errors import UsageError
from clef_cli.inputs.formats import READABLE, Format, format_of
from clef_cli.inputs.listing import GLOB_CHARACTERS, Part, folder_parts, glob_parts, local_part
from clef_cli.inputs.streams import spooled_stream, stream_input
from clef_cli.locations.failures import FAILING, failure_of, named
from clef_cli.locations.fence import MediaBase
from clef_cli.locations.object_store import MissingObject, ObjectStoreError, _classify, _retried, check_bucket
from clef_cli.locations.object_store import filesystem as store_filesystem
from clef_cli.locations.uris import LocationProblem, is_uri, local_path, normalized, option_location, parent


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
    """The name messages use, when not the file's own: a folder's or glob's part by its path as
    the folder or glob was spelled (`data/lang=en/part-0.parquet`: the parts of two partitions
    share a file name), `stdin` for a spooled stream."""
    given: str | None = field(default=None, compare=False)
    """A file named directly: its path (or URI) as the user gave it."""

    @property
    def name(self) -> str:
        """What a record's error names its file by: a part's or stream's `shown`, else the file's name."""
        return self.shown or self.location.rstrip("/").rsplit("/", 1)[-1]

    @property
    def path_given(self) -> str:
        """What a refusal names the file by: its path as given (a part's: `shown`), never a
        path the user did not write."""
        return self.shown or self.given or self.location

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
        except LocationProblem:  # a URI with a query string: no folder (its media must be absolute
            return self.location  # URIs), but still a remote origin, which names no local file

    def open_binary(self, decompress: bool = True) -> BinaryIO:
        """The file's bytes, decompressed when its name says it is compressed (`.gz`, `.zst`)
        unless `decompress` is False (the stored bytes, which a fingerprint hashes)."""
        compression = self.format.compression if decompress else None
        remote = is_uri(self.location)
        if not remote and compression is None:
            return open(self.location, "rb")
        stream = self._arrow_stream(compression)
        checked = _Checked(stream, self.path_given, compression, self.location if remote else None)
        # pyarrow's streams read but cannot iterate lines; a buffered reader over them can.
        return io.BufferedReader(checked, buffer_size=1 << 20)

    def open_native(self) -> Any:
        """The file's (decompressed) bytes as pyarrow's own stream, for a pyarrow reader that reads
        ahead on threads of its own: handed a Python file, they call back into Python, and one
        that did as the interpreter ended aborted the process (exit 134). Its failures are named
        by `read_failure`."""
        return self._arrow_stream(self.format.compression)

    def _arrow_stream(self, compression: str | None) -> Any:
        """pyarrow's input stream over the file, local or in a store, decompressing `compression`."""
        if not is_uri(self.location):
            import pyarrow as pa

            return pa.input_stream(self.location, compression=compression)
        return in_store(self.location, lambda fs, path: fs.open_input_stream(path, compression=compression))

    def read_failure(self, error: OSError) -> Exception:
        """What a failed read of this file's bytes is: see `_failure`."""
        remote = self.location if is_uri(self.location) else None
        return _failure(error, self.path_given, self.format.compression, remote)

    def parquet(self) -> Any:
        import pyarrow.parquet as pq

        if not is_uri(self.location):
            return pq.ParquetFile(self.location)
        return pq.ParquetFile(in_store(self.location, lambda fs, path: fs.open_input_file(path)))


T = TypeVar("T")


InputLike = str | Path | InputFile
"""An input as given (a path, a URI, a folder, a glob, `-`) or one already listed (`expand_inputs`)."""


def given_name(item: InputLike) -> str:
    """What a refusal of the whole job names an input by: as the user gave it."""
    return (item.given or item.path_given) if isinstance(item, InputFile) else str(item)


def in_store(uri: str, call: Callable[[Any, str], T], listing: bool = False) -> T:
    """`call(filesystem, path)` for an input in an object store, through the one object client
    (`locations/object_store`: its timeouts, its sorting of failures): what no record causes
    (credentials, the endpoint) is the store's one line (exit 1), as for media and the output; a
    missing bucket or object, refused before anything is done, the input's usage error."""
    try:
        filesystem, path = store_filesystem(uri)
        return _retried(uri, listing, lambda: call(filesystem, path))
    except ObjectStoreError as error:  # one reading, a missing bucket's exit 2 included (locations/failures.py)
        raise named(error, "input", uri) from None
    except LocationProblem as problem:
        if problem.transient:
            raise failure_of(FAILING, "input", uri, str(problem)) from None
        raise UsageError(f"input {uri}: {problem}") from None


class _Checked(io.RawIOBase):
    """An input's bytes as pyarrow's stream gives them, its failures named: a damaged or truncated
    compressed stream (a bare `OSError` naming no file) is the job's usage error naming the input;
    a store failing under a remote one (`uri`) is sorted as every store failure is."""

    def __init__(self, stream: Any, name: str, compression: str | None, uri: str | None) -> None:
        self._stream, self._name, self._compression, self._uri = stream, name, compression, uri

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            return self._stream.readinto(buffer)
        except OSError as error:
            raise _failure(error, self._name, self._compression, self._uri) from None

    def close(self) -> None:
        self._stream.close()
        super().close()


def _failure(error: OSError, name: str, compression: str | None, uri: str | None) -> Exception:
    """A failed read of an input's bytes: a store failing under a remote one is sorted as every
    store failure is (exit 1); a damaged or truncated compressed stream (a bare `OSError` naming no
    file) is the job's usage error naming the input."""
    problem = _classify(error, uri) if uri is not None else None
    if isinstance(problem, ObjectStoreError):
        return named(problem, "input", uri or name)
    if problem is not None and not compression:
        failure = FAILING if isinstance(problem, LocationProblem) and problem.transient else "other"
        return failure_of(failure, "input", uri or name, str(error))
    if compression:
        return UsageError(f"{name} is not a readable {compression} file: {error}")
    return UsageError(f"{name}: cannot read it: {error}")


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
    option_location(location, what)
    found = local_path(location)
    if found is not None:
        return found
    text = str(location)
    if text in _copies:
        return _copies[text]
    from clef_cli.locations.object_store import read_object
    from clef_cli.locations.uris import object_uri

    uri = object_uri(text, what)
    if not _copy_folder:
        _copy_folder.append(tempfile.mkdtemp(prefix="clef-tables-"))
        atexit.register(shutil.rmtree, _copy_folder[0], True)
    target = Path(_copy_folder[0]) / str(len(_copies)) / uri.rsplit("/", 1)[1]
    target.parent.mkdir()
    try:
        with open(target, "wb") as into:
            read_object(uri, NO_SIZE_LIMIT, into, what)
    except LocationProblem as problem:
        if isinstance(problem, MissingObject):
            check_bucket(uri, what)
        raise UsageError(f"{what} {text!r}: {problem}") from None
    _copies[text] = target
    return target


# ----------------------------------------------------------------------------- expansion


def _files(parts: list[Part], given: str | None = None) -> list[InputFile]:
    """Parts as input files; `given`: a file named directly, as the user gave it."""
    return [
        InputFile(part.location, part.size, part.partitions, part.base, part.shown or None, given) for part in parts
    ]


def _expand_local(path: Path, given: str | Path) -> list[InputFile]:
    if stream_input(given):
        spool = spooled_stream(str(given))
        return [InputFile(spool.path, spool.size, base=spool.base, shown=spool.shown, given=str(given))]
    if path.is_dir():
        return _files(folder_parts(str(path), None))
    if path.is_file():
        _check_suffix(str(path))
        return _files([local_part(path)], str(given))
    if GLOB_CHARACTERS.search(str(given)):
        return _files(glob_parts(str(path), None))
    raise UsageError(f"input not found: {given}")


def _expand_uri(uri: str) -> list[InputFile]:
    import pyarrow.fs as pafs

    info = in_store(uri, lambda filesystem, path: filesystem.get_file_info(path), listing=True)
    try:
        if info.type == pafs.FileType.Directory:
            return _files(folder_parts(uri, store_filesystem))
        if info.type == pafs.FileType.File:
            _check_suffix(uri)
            return [InputFile(uri, info.size or 0, given=uri)]
        if GLOB_CHARACTERS.search(uri.partition("://")[2]):
            return _files(glob_parts(uri, store_filesystem))
    except ObjectStoreError as error:
        raise named(error, "input", uri) from None
    except LocationProblem as problem:
        raise UsageError(f"input {uri}: {problem}") from None
    check_bucket(uri, "input")  # a missing bucket reads as one, not as a missing object
    raise UsageError(f"input not found: {uri}")


def unfound_local(location: str | Path) -> bool:
    """A local input that names nothing there (no file, folder, stream or glob): refused before
    a job makes anything; the rest is checked where the inputs are expanded."""
    import glob

    path = local_path(location)
    if path is None or path.exists() or stream_input(location):
        return False
    return not GLOB_CHARACTERS.search(str(path)) or next(glob.iglob(str(path)), None) is None


def expand_inputs(paths: Iterable[InputLike]) -> list[InputFile]:
    """Input files in a stable order, checked to exist and to be of a readable type. Local files
    (given as paths or as local-filesystem URIs) are named by their absolute path; a folder or a
    glob stands for its parts in name order; stdin and pipes are read once, into a spool. An
    `InputFile` is one already listed (a job's plan lists its inputs once): kept as it is."""
    files: list[InputFile] = []
    for raw in paths:
        if isinstance(raw, InputFile):
            files.append(raw)
            continue
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
