"""The checkpoint: a store of results keyed by record key (`record_key.py`), shared by every run
that uses the folder: an interrupted job, tomorrow's grown table, another input file. Its
manifest pins only the scoring fingerprint (weights, head, dtype); a run with another is refused.

Layout of a checkpoint folder::

    manifest.json          format version, the scoring fingerprint
    journal.jsonl          one line per committed shard (file sizes and checksums)
    keys.sqlite            the key index (key_index.py), derived from the journal and its shards
    shards/NNNNNNNN.results.arrow         one row per record (the output's columns and its key)
    shards/NNNNNNNN.hidden.safetensors    final hidden states, input ids, spans (optional;
                                          format in hidden_store.py)
    shards/ray-UUID.hidden.safetensors    the same, written by a `--ray` actor (journaled likewise)
    ray.log                the output of a quiet `--ray` run's Ray

A shard counts only once its journal line is written, and that line is written last (after the
files are fsynced and renamed into place, and their folder fsynced). A job killed at any instant,
or a power loss, therefore leaves either a complete, journaled shard or files that the next run
deletes. Every change to the disk goes through store/durable.py (tests/support/crash_model.py replays
each crash state it allows). A run checks every file of every
shard against its journal line (size, then SHA-256 for results, CRC32 for the hidden states); a
damaged shard is dropped, the index forgets its keys, and their records are computed again.
Opening only to read (`checkpoint info`, `--rehead`, train-head) checks hidden states as read.
"""

from __future__ import annotations

import functools
import json
import os
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.ipc as ipc

from clef_cli.errors import ClefError, UsageError
from clef_cli.results import RESULT_SCHEMA
from clef_cli.store import durable
from clef_cli.store.atomic import write_text
from clef_cli.store.key_index import INDEX_FILE, KeyIndex
from clef_cli.store.manifest import (
    MANIFEST,
    CheckpointMismatch,
    comparable,
    mismatch_message,
    read_manifest,
    write_manifest,
)
from clef_cli.store.shard_checks import Stamp, file_matches, read_verified, remember_verified
from clef_cli.store.shard_files import ipc_bytes, write_shard_file
from clef_cli.store.shard_names import ShardNames

if TYPE_CHECKING:
    from clef_cli.store.hidden_store import HiddenPayload, HiddenReader, HiddenShardFile
    from clef_cli.store.ledger import Ledger

Fetch = Callable[["Checkpoint", "ShardEntry", str], None]

JOURNAL = "journal.jsonl"
SHARDS = "shards"


@dataclass(frozen=True)
class ShardEntry:
    name: str
    records: int
    files: dict[str, dict[str, Any]]
    run: str
    remote: dict[str, Any] | None = None
    """A part of a segment of a store in a bucket (store/remote/): where its files lie there. They
    are downloaded into shards/ when first read (`Checkpoint.fetch`), so a missing one is no damage."""

    @property
    def has_hidden(self) -> bool:
        return "hidden" in self.files

    def line(self) -> str:
        """The entry's journal line (a local shard's has no `remote`, as before there was one)."""
        body = {key: value for key, value in self.__dict__.items() if key != "remote" or value is not None}
        return json.dumps(body, sort_keys=True) + "\n"


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

    sync_failures = 0
    """Syncs to a store in a bucket that failed in this run, known once it is closed (a folder: none)."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest
        """What made this checkpoint (read once when it is opened)."""
        self.shards_path = path / SHARDS
        self.entries: list[ShardEntry] = []
        self.index: KeyIndex | None = None
        self.ledger: Ledger | None = None
        """This job's ledger: fills each committed row's record_key."""
        self.run_id = uuid.uuid4().hex[:12]
        self.run_seq = 0
        self._tables: dict[str, pa.Table] = {}
        self._names = ShardNames()
        self.dropped: list[ShardEntry] = []
        """Shards found damaged on open; their records are computed again."""
        self.fetch: Fetch | None = None
        """Downloads a remote part's file (checkpoint, entry, kind) into shards/ (store/remote/cache.py)."""

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls, path: Path, manifest: dict[str, Any], restart: bool = False, fetch: Fetch | None = None
    ) -> Checkpoint:
        """Create, or reuse after checking that the stored scoring fingerprint matches this run's;
        `fetch`: where remote parts' files come from (a store in a bucket's cache)."""
        if restart and path.exists():
            discard(path)
        durable.mkdir(path)
        stored = read_manifest(path)
        if stored is None:
            durable.mkdir(path / SHARDS)
            durable.unlink(path / JOURNAL)
            stored = write_manifest(path, manifest)
        else:
            if comparable(stored) != comparable(manifest):
                raise CheckpointMismatch(mismatch_message(path, stored, manifest))
            durable.mkdir(path / SHARDS)
        checkpoint = cls(path, stored)
        checkpoint.fetch = fetch
        lines = checkpoint._read_journal(hidden_states=True)
        checkpoint._repair(lines)
        checkpoint._remember_verified()
        checkpoint._open_index()
        return checkpoint

    @classmethod
    def open_existing(cls, path: Path, fetch: Fetch | None = None) -> Checkpoint:
        """For reading (info, rehead, train-head): the checkpoint must exist; its shards are not
        changed (the key index is brought up to date with the journal)."""
        require_folder(path)
        manifest = read_manifest(path)
        if manifest is None:
            raise UsageError(f"{path} is not a clef checkpoint (no {MANIFEST})")
        checkpoint = cls(path, manifest)
        checkpoint.fetch = fetch
        checkpoint._read_journal()
        checkpoint._open_index()
        return checkpoint

    def _open_index(self) -> None:
        """Reconcile the key index with the journal: forget shards it no longer lists (damaged,
        pruned), index journaled shards it lacks (a kill between journal line and index rows)."""
        index = self.index = KeyIndex(self.path / INDEX_FILE)
        files = {entry.name: entry.files["results"]["name"] for entry in self.entries}
        indexed = index.indexed_shards(files)
        # a shard the journal no longer lists, or lists with other files (rewritten by a prune)
        stale = {name for name, file in indexed.items() if files.get(name) != file}
        missing = []
        for entry in self.entries:
            if entry.name not in indexed or entry.name in stale:
                results = self.shards_path / files[entry.name]
                started = results.stat().st_mtime if results.exists() else None  # a remote part not yet read
                run_seq = index.begin_run(entry.run or "unknown", started=started)
                missing.append((entry.name, self.shard_table(entry.name), entry.has_hidden, run_seq, files[entry.name]))
        if stale or missing:
            index.reconcile(stale, missing)

    def begin_run(self, inputs: Sequence[str | Path] = (), output: Path | str | None = None) -> int:
        """Record this run in the index, with what it reads and writes (for `checkpoint info`
        and `prune`)."""
        assert self.index is not None
        self.run_seq = self.index.begin_run(
            self.run_id, inputs=[_absolute(item) for item in inputs], output=_absolute(output) if output else None
        )
        return self.run_seq

    @property
    def where(self) -> str:
        """The store as messages and provenance name it (a bucket store: its URI)."""
        return str(self.path)

    def close(self, quiet: bool = False) -> None:
        """Close the key index (`quiet`: the job is failing; a store that syncs raises nothing more)."""
        if self.index is not None:
            self.index.close()

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
                    run, remote = raw.get("run", ""), raw.get("remote")
                    parsed.append(ShardEntry(raw["name"], int(raw["records"]), raw["files"], run, remote))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue  # a line cut short by a kill: its shard never counted
        memo = read_verified(self.path) if hidden_states else {}
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            verified = list(pool.map(lambda entry: self._verify(entry, hidden_states, memo), parsed))
        self.entries = [entry for entry, ok in zip(parsed, verified, strict=True) if ok]
        self.dropped = [entry for entry, ok in zip(parsed, verified, strict=True) if not ok]
        return seen_lines

    def _repair(self, journal_lines: int) -> None:
        """Delete what no journal line accounts for and rewrite a journal with bad lines."""
        self._remove_unjournaled()
        if self.dropped or journal_lines != len(self.entries):
            self._rewrite_journal()

    def _verify(self, entry: ShardEntry, hidden_states: bool, memo: dict[str, Stamp]) -> bool:
        """Every file of the shard matches its journal line (store/shard_checks.py); a remote part's
        file not yet downloaded is checked when it is."""
        return all(
            file_matches(self.shards_path / described["name"], kind, described, hidden_states, memo)
            for kind, described in entry.files.items()
            if not _in_bucket(entry, described) or (self.shards_path / described["name"]).exists()
        )

    def _remember_verified(self) -> None:
        hidden = [self.shards_path / entry.files["hidden"]["name"] for entry in self.entries if entry.has_hidden]
        remember_verified(self.path, [path for path in hidden if path.exists()])

    def _remove_unjournaled(self) -> None:
        """Shard files without a journal line, and temporaries a killed write left (the caller
        holds the job lock, so no other writer is under way)."""
        keep = {described["name"] for entry in self.entries for described in entry.files.values()}
        for path in self.shards_path.iterdir():
            if path.name not in keep:
                durable.unlink(path)
        for path in self.path.glob(".*.tmp"):
            durable.unlink(path)

    def _rewrite_journal(self) -> None:
        write_text(self.path / JOURNAL, "".join(entry.line() for entry in self.entries))

    # ------------------------------------------------------------------ committing

    def _next_name(self) -> str:
        return self._names.next_name(self.entries)

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
                f"{sum(entry.records for entry in self.entries)} records committed before are kept: make room "
                "and rerun the same command to continue"
            ) from error

    def _commit(self, results: pa.Table, hidden: HiddenPayload | None, hidden_file: dict[str, Any] | None) -> None:
        name = self._next_name()
        table = results.cast(RESULT_SCHEMA)
        if self.ledger is not None:
            table = self.ledger.keyed(table)
        files = {"results": self._write_file(f"{name}.results.arrow", ipc_bytes(table), "sha256")}
        if hidden is not None:
            # Hidden states are large: a CRC (several GB/s) guards them against damage, where the
            # small results files carry a SHA-256.
            files["hidden"] = self._write_file(f"{name}.hidden.safetensors", hidden.chunks(), "crc32")
        elif hidden_file is not None:
            files["hidden"] = hidden_file
        entry = ShardEntry(name=name, records=table.num_rows, files=files, run=self.run_id)
        durable.append(self.path / JOURNAL, entry.line().encode("utf-8"))
        self.entries.append(entry)
        if self.index is not None:
            self.index.add_shard(name, table, entry.has_hidden, self.run_seq, files["results"]["name"])

    def _write_file(self, file_name: str, data: bytes | Sequence[bytes | memoryview], checksum: str) -> dict[str, Any]:
        return write_shard_file(self.shards_path, file_name, data, checksum)

    # ------------------------------------------------------------------ reading

    def shard_table(self, name: str) -> pa.Table:
        """One committed shard's results (memory-mapped, opened once)."""
        if name not in self._tables:
            self._tables[name] = self.open_shard(name)
        return self._tables[name]

    def open_shard(self, name: str) -> pa.Table:
        """One committed shard's results, memory-mapped, not kept open by the checkpoint (the
        output's bounded reader closes what it no longer needs)."""
        entry = self._names.entry(self.entries, name)
        source = pa.memory_map(str(self.local_file(entry, "results")))
        return ipc.open_file(source).read_all()

    def results(self) -> pa.Table:
        """Every committed row (memory-mapped, so a large job does not load it into RAM)."""
        tables = [self.shard_table(entry.name) for entry in self.entries]
        return pa.concat_tables(tables) if tables else RESULT_SCHEMA.empty_table()

    def hidden_shards(self) -> list[HiddenShardFile]:
        from clef_cli.store.hidden_store import HiddenShardFile

        """The committed hidden-state shards, in commit order (read them with `hidden_reader`)."""
        shards = []
        for entry in self.entries:
            if entry.has_hidden:
                described = entry.files["hidden"]
                fetch = functools.partial(self.local_file, entry, "hidden") if _in_bucket(entry, described) else None
                path = self.shards_path / described["name"]
                shards.append(HiddenShardFile(path, entry.records, described["crc32"], fetch))
        return shards

    def set_aside_damaged(self) -> bool:
        """A store in a bucket checks the objects of the job's reused keys here (store/remote/store.py);
        a folder's shards were checked when it opened. True: some were set aside, decide again."""
        return False

    def local_file(self, entry: ShardEntry, kind: str) -> Path:
        """The shard's `kind` file (results, hidden), downloaded first when it is a remote part's."""
        path = self.shards_path / entry.files[kind]["name"]
        if _in_bucket(entry, entry.files[kind]) and self.fetch is not None and not path.exists():
            self.fetch(self, entry, kind)
        return path

    @property
    def hidden_target(self) -> str:
        """Where a `--ray` actor writes a batch's hidden-state shard (`shard_files.put_hidden_shard`)."""
        return str(self.shards_path.resolve())

    @property
    def needs_shared_disk(self) -> bool:
        """Whether `--ray` actors must see `hidden_target` on a disk every node mounts."""
        return True

    def hidden_reader(self) -> HiddenReader:
        from clef_cli.store.hidden_store import HiddenReader

        return HiddenReader(self.hidden_shards())

    def info(self) -> dict[str, Any]:
        """The scoring fingerprint, the keys, the size by kind, and the runs that used the store
        (store/checkpoint_info.py)."""
        from clef_cli.store.checkpoint_info import local_info

        return local_info(self)


def _in_bucket(entry: ShardEntry, described: dict[str, Any]) -> bool:
    """The file lies in a bucket store (a remote part's, or a `--ray` actor's upload), so missing
    here it is no damage: it is downloaded when read."""
    return entry.remote is not None or "object" in described


def _absolute(location: str | Path) -> str:
    """A local path made absolute (a run's files are named wherever `checkpoint info` is run); a
    URI, or `-` for stdin, as given."""
    text = str(location)
    return text if "://" in text or text == "-" else str(Path(text).absolute())


def discard(path: Path, keep_logs: bool = False) -> None:
    """Remove a checkpoint folder (only one that looks like a checkpoint). `keep_logs`: a failed
    job's engine log (`vllm.log`, `ray.log`), which its one-line error names, stays alone in it."""
    if not path.exists():
        return
    if not (path / MANIFEST).exists() and any(path.iterdir()):
        raise ClefError(f"refusing to delete {path}: it does not look like a clef checkpoint")
    logs = [item for item in path.iterdir() if item.suffix == ".log" and item.is_file()] if keep_logs else []
    if not logs:
        durable.rmtree(path)
        return
    for item in path.iterdir():
        if item not in logs:
            durable.rmtree(item) if item.is_dir() and not item.is_symlink() else durable.unlink(item)
