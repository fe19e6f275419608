"""The on-disk checkpoint of a scoring job: committed result shards, optional hidden states, and
the manifest that says which model, inputs and settings produced them.

Layout of a checkpoint folder::

    manifest.json          format version, fingerprints, result-changing settings
    journal.jsonl          one line per committed shard (file sizes and checksums)
    shards/NNNNNNNN.results.arrow         one row per record (the output's columns)
    shards/NNNNNNNN.hidden.safetensors    final hidden states, input ids, spans (optional;
                                          format in hidden_store.py)
    shards/ray-UUID.hidden.safetensors    the same, written by a `--ray` actor (journaled likewise)
    ray.log                the output of a quiet `--ray` run's Ray

A shard counts only once its journal line is written, and that line is written last (after the
files are fsynced and renamed into place). A job killed at any instant therefore leaves either a
complete, journaled shard or files that the next run deletes. A resumed job checks every file of
every shard against its journal line (size, then SHA-256 for results, CRC32 for the much larger
hidden states); a shard whose files were damaged later is dropped and its records are computed
again. Opening a checkpoint only to read it (`checkpoint info`, `--rehead`, train-head) checks
the hidden states later, as they are read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.ipc as ipc

from clef_cli.errors import ClefError, UsageError
from clef_cli.release import file_crc32, file_sha256
from clef_cli.results import RESULT_SCHEMA
from clef_cli.store.atomic import write_bytes, write_text

if TYPE_CHECKING:
    from clef_cli.store.hidden_store import HiddenPayload, HiddenReader, HiddenShardFile

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
JOURNAL = "journal.jsonl"
SHARDS = "shards"


class CheckpointMismatch(ClefError):
    """The checkpoint was made by another model, other inputs or other settings."""


def describe_differences(stored: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """Human lines for every leaf that differs between two manifests."""
    lines = []
    for key in sorted(set(stored) | set(current)):
        name = f"{prefix}{key}"
        old, new = stored.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            lines.extend(describe_differences(old, new, f"{name}."))
        elif old != new:
            lines.append(f"{name}: checkpoint has {_short(old)}, this run has {_short(new)}")
    return lines


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 160 else text[:157] + "..."


@dataclass
class DoneSet:
    """Which record indices are committed: one byte per index, grown on demand."""

    flags: bytearray = field(default_factory=bytearray)
    count: int = 0

    def add(self, index: int) -> None:
        if index >= len(self.flags):
            self.flags.extend(bytes(max(index + 1 - len(self.flags), len(self.flags))))
        if not self.flags[index]:
            self.flags[index] = 1
            self.count += 1

    def __contains__(self, index: int) -> bool:
        return index < len(self.flags) and bool(self.flags[index])


@dataclass(frozen=True)
class ShardEntry:
    name: str
    records: int
    files: dict[str, dict[str, Any]]
    run: str

    @property
    def has_hidden(self) -> bool:
        return "hidden" in self.files


def read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as error:
        raise ClefError(f"checkpoint manifest {path / MANIFEST} is unreadable: {error}") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointMismatch(
            f"checkpoint {path} has format version {manifest.get('format_version')}, this clef writes "
            f"{FORMAT_VERSION} (use --restart to discard it)"
        )
    return manifest


def write_manifest(path: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    body = {**manifest, "format_version": FORMAT_VERSION, "created": time.time()}
    write_text(path / MANIFEST, json.dumps(body, indent=2, sort_keys=True))
    return body


def require_folder(path: Path) -> None:
    """A missing path or a file (often the scored Parquet itself) is the user's slip: exit 2,
    pointing at where `clef score -o OUT.parquet` keeps its checkpoint."""
    if path.is_dir():
        return
    where = "`clef score -o OUT.parquet` keeps its checkpoint in the folder OUT.parquet.ckpt"
    sibling = path.with_name(path.name + ".ckpt")
    if sibling.is_dir():
        where += f"; did you mean {sibling}?"
    what = "is a file, not a checkpoint folder" if path.exists() else "does not exist"
    raise UsageError(f"checkpoint {path} {what}: {where}")


class Checkpoint:
    """A checkpoint folder opened for one job (the caller holds its lock)."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest
        """What made this checkpoint (read once when it is opened)."""
        self.shards_path = path / SHARDS
        self.entries: list[ShardEntry] = []
        self.done = DoneSet()
        self.run_id = uuid.uuid4().hex[:12]
        self.dropped: list[ShardEntry] = []
        """Shards found damaged on open; their records are computed again."""

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, path: Path, manifest: dict[str, Any], restart: bool = False) -> Checkpoint:
        """Create, or resume after checking that the stored manifest matches this run's."""
        if restart and path.exists():
            discard(path)
        path.mkdir(parents=True, exist_ok=True)
        stored = read_manifest(path)
        if stored is None:
            (path / SHARDS).mkdir(exist_ok=True)
            (path / JOURNAL).unlink(missing_ok=True)
            stored = write_manifest(path, manifest)
        else:
            differences = describe_differences(_comparable(stored), _comparable(manifest))
            if differences:
                raise CheckpointMismatch(
                    f"checkpoint {path} was made by another job: "
                    + "; ".join(differences)
                    + " (use --restart to discard it, or --checkpoint to use another folder)"
                )
            (path / SHARDS).mkdir(exist_ok=True)
        checkpoint = cls(path, stored)
        lines = checkpoint._read_journal(hidden_states=True)
        checkpoint._repair(lines)
        return checkpoint

    @classmethod
    def open_existing(cls, path: Path) -> Checkpoint:
        """For reading (info, rehead): the checkpoint must exist; nothing in it is changed."""
        require_folder(path)
        manifest = read_manifest(path)
        if manifest is None:
            raise ClefError(f"{path} is not a clef checkpoint (no {MANIFEST})")
        checkpoint = cls(path, manifest)
        checkpoint._read_journal()
        return checkpoint

    def _read_journal(self, hidden_states: bool = False) -> int:
        """The committed shards that verify (damaged ones in `dropped`), their hidden states too
        when `hidden_states`; returns the journal's line count, so that `_repair` knows whether
        lines were cut short or dropped."""
        parsed, seen_lines = [], 0
        journal = self.path / JOURNAL
        if journal.exists():
            for line in journal.read_text(encoding="utf-8").splitlines():
                seen_lines += 1
                try:
                    raw = json.loads(line)
                    parsed.append(ShardEntry(raw["name"], int(raw["records"]), raw["files"], raw.get("run", "")))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue  # a line cut short by a kill: its shard never counted
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            verified = list(pool.map(lambda entry: self._verify(entry, hidden_states), parsed))
        self.entries = [entry for entry, ok in zip(parsed, verified, strict=True) if ok]
        self.dropped = [entry for entry, ok in zip(parsed, verified, strict=True) if not ok]
        self.done = DoneSet()
        for table in self._result_tables():
            for index in table.column("record_index").to_pylist():
                self.done.add(index)
        return seen_lines

    def _repair(self, journal_lines: int) -> None:
        """Delete what no journal line accounts for and rewrite a journal with bad lines."""
        self._remove_unjournaled()
        if self.dropped or journal_lines != len(self.entries):
            self._rewrite_journal()

    def _verify(self, entry: ShardEntry, hidden_states: bool) -> bool:
        """Every file of the shard has its journaled size and checksum (hidden states only when
        `hidden_states`: reading them costs one pass over what may be many GB)."""
        for kind, described in entry.files.items():
            path = self.shards_path / described["name"]
            try:
                if path.stat().st_size != described["bytes"]:
                    return False
                if kind == "results" and file_sha256(path) != described["sha256"]:
                    return False
                if kind == "hidden" and hidden_states and file_crc32(path) != described["crc32"]:
                    return False
            except (FileNotFoundError, KeyError):
                return False
        return True

    def _remove_unjournaled(self) -> None:
        """Shard files without a journal line, and temporaries a killed write left (the caller
        holds the job lock, so no other writer is under way)."""
        keep = {described["name"] for entry in self.entries for described in entry.files.values()}
        for path in self.shards_path.iterdir():
            if path.name not in keep:
                path.unlink(missing_ok=True)
        for path in self.path.glob(".*.tmp"):
            path.unlink(missing_ok=True)

    def _rewrite_journal(self) -> None:
        lines = "".join(json.dumps(entry.__dict__, sort_keys=True) + "\n" for entry in self.entries)
        write_text(self.path / JOURNAL, lines)

    # ------------------------------------------------------------------ committing

    def _next_name(self) -> str:
        numbers = [int(entry.name) for entry in self.entries if entry.name.isdigit()]
        return f"{max(numbers, default=0) + 1:08d}"

    def commit(
        self, results: pa.Table, hidden: HiddenPayload | None = None, hidden_file: dict[str, Any] | None = None
    ) -> None:
        """Make one shard durable: files first, then the journal line that makes it count.
        `hidden_file` is a hidden shard a worker already wrote into shards/ (`write_shard_file`'s
        description); like any file, it counts only once this journal line is written. A disk
        error (full, read-only, gone) stops the job with what it means: earlier shards are kept, and
        whatever this one left behind is cleaned up when the job resumes."""
        try:
            self._commit(results, hidden, hidden_file)
        except OSError as error:
            raise ClefError(
                f"could not commit to the checkpoint {self.path}: {error.strerror or error}; the "
                f"{self.done.count} records committed before are kept: make room and rerun the same command "
                "to continue"
            ) from error

    def _commit(self, results: pa.Table, hidden: HiddenPayload | None, hidden_file: dict[str, Any] | None) -> None:
        name = self._next_name()
        table = results.cast(RESULT_SCHEMA)
        files = {"results": self._write_file(f"{name}.results.arrow", _ipc_bytes(table), "sha256")}
        if hidden is not None:
            # Hidden states are large: a CRC (several GB/s) guards them against damage, where the
            # small results files carry a SHA-256.
            files["hidden"] = self._write_file(f"{name}.hidden.safetensors", hidden.to_bytes(), "crc32")
        elif hidden_file is not None:
            files["hidden"] = hidden_file
        entry = ShardEntry(name=name, records=table.num_rows, files=files, run=self.run_id)
        with open(self.path / JOURNAL, "a", encoding="utf-8") as journal:
            journal.write(json.dumps(entry.__dict__, sort_keys=True) + "\n")
            journal.flush()
            os.fsync(journal.fileno())
        self.entries.append(entry)
        for index in table.column("record_index").to_pylist():
            self.done.add(index)

    def _write_file(self, file_name: str, data: bytes, checksum: str) -> dict[str, Any]:
        return write_shard_file(self.shards_path, file_name, data, checksum)

    # ------------------------------------------------------------------ reading

    def _result_tables(self) -> Iterator[pa.Table]:
        for entry in self.entries:
            source = pa.memory_map(str(self.shards_path / entry.files["results"]["name"]))
            yield ipc.open_file(source).read_all()

    def results(self) -> pa.Table:
        """Every committed row (memory-mapped, so a large job does not load it into RAM)."""
        tables = list(self._result_tables())
        return pa.concat_tables(tables) if tables else RESULT_SCHEMA.empty_table()

    def hidden_shards(self) -> list[HiddenShardFile]:
        from clef_cli.store.hidden_store import HiddenShardFile

        """The committed hidden-state shards, in commit order (read them with `hidden_reader`)."""
        shards = []
        for entry in self.entries:
            if entry.has_hidden:
                described = entry.files["hidden"]
                shards.append(HiddenShardFile(self.shards_path / described["name"], entry.records, described["crc32"]))
        return shards

    def hidden_reader(self) -> HiddenReader:
        from clef_cli.store.hidden_store import HiddenReader

        return HiddenReader(self.hidden_shards())

    def size_on_disk(self) -> int:
        return sum(path.stat().st_size for path in self.path.rglob("*") if path.is_file())

    def info(self) -> dict[str, Any]:
        manifest = self.manifest
        return {
            "path": str(self.path),
            "records_done": self.done.count,
            "shards": len(self.entries),
            "shards_with_hidden_states": sum(entry.has_hidden for entry in self.entries),
            "size_bytes": self.size_on_disk(),
            "model": manifest.get("model", {}),
            "inputs": manifest.get("inputs", []),
            "settings": manifest.get("settings", {}),
            "created": manifest.get("created"),
        }


def write_shard_file(folder: Path, file_name: str, data: bytes, checksum: str) -> dict[str, Any]:
    """Write a shard file atomically; its size and checksum (sha256 or crc32) come from the bytes
    in memory, so nothing is read back from disk."""
    write_bytes(folder / file_name, data)
    digest = hashlib.sha256(data).hexdigest() if checksum == "sha256" else zlib.crc32(data)
    return {"name": file_name, "bytes": len(data), checksum: digest}


def _comparable(manifest: dict[str, Any]) -> dict[str, Any]:
    """The parts of a manifest that must match for a checkpoint to be resumed, inputs spelled so
    that a difference reads well."""
    inputs = [
        f"{Path(item['path']).name} ({item['bytes']} bytes, sha256 {str(item['sha256'])[-12:]})"
        for item in manifest.get("inputs") or []
    ]
    return {"model": manifest.get("model"), "inputs": ", ".join(inputs), "settings": manifest.get("settings")}


def _ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def discard(path: Path) -> None:
    """Remove a checkpoint folder (only one that looks like a checkpoint)."""
    if not path.exists():
        return
    if not (path / MANIFEST).exists() and any(path.iterdir()):
        raise ClefError(f"refusing to delete {path}: it does not look like a clef checkpoint")
    shutil.rmtree(path)
