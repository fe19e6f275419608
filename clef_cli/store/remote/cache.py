"""A store's cache folder kept in step with its bucket: brought up to date from the latest
manifest when it is opened, and filled with a part's files when they are first read.

Bringing it up to date costs one request per new segment (its keys object, read a batch at a
time into the key index: no key is ever held in a Python set) and none per record. A segment's
parts become journal lines of the cache's checkpoint, as shards whose files are downloaded when
read: a results object whole (it is small), a hidden-state file by its range. A segment no longer
named (compacted, pruned, a restart) is forgotten with its downloaded files.

`remote.json` (the mark) says which of the cache's own shards are in the store already: those up
to `synced_through`, in the segments listed under `mine`. A sync writes its segment there as
`pending` before it commits the manifest, so a kill between the two is settled at the next open
from what the manifest says, and nothing is uploaded twice or imported as another machine's.

Every object is checked against its name before its bytes are used (a keys or results object by
its content hash, a part's piece by its checksum). A segment with an object missing or damaged is
set aside (`set_aside` in the mark, with why): never imported, its parts forgotten, so the job
that needs its records computes them again, and the next commit drops it from the manifest.
"""

from __future__ import annotations

import json
import threading
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clef_cli.locations.object_store import MissingObject
from clef_cli.locations.uris import LocationProblem
from clef_cli.store import durable
from clef_cli.store.atomic import write_bytes, write_text
from clef_cli.store.checkpoint import JOURNAL, Checkpoint, ShardEntry
from clef_cli.store.remote.damage import damaged, set_aside_line
from clef_cli.store.remote.manifests import Chain, Manifest, store_problems
from clef_cli.store.remote.segments import DamagedObject, Part, named_by, read_keys, read_parts, split_results

MARK = "remote.json"


@dataclass
class Mark:
    store: str
    seq: int = 0
    """The manifest the cache was last brought up to date with, or committed."""
    synced_through: int = 0
    """The cache's own shards numbered up to this are in the store."""
    mine: dict[str, list[str]] = field(default_factory=dict)
    """Segments this cache uploaded -> its shards they hold."""
    pending: dict[str, Any] | None = None
    """A segment uploaded whose manifest may not be committed: segment, shards, through."""
    set_aside: dict[str, str] = field(default_factory=dict)
    """Segments with an object missing or damaged -> what was found (the next commit drops them)."""

    @classmethod
    def load(cls, folder: Path, store: str) -> Mark:
        try:
            raw = json.loads((folder / MARK).read_text(encoding="utf-8"))
            if raw.get("store") == store:
                kept = {name: raw[name] for name in ("store", "seq", "synced_through", "mine", "pending")}
                return cls(**kept, set_aside=dict(raw.get("set_aside") or {}))
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return cls(store)

    def save(self, folder: Path) -> None:
        write_text(folder / MARK, json.dumps(asdict(self), sort_keys=True))

    def settle(self, manifest: Manifest | None) -> None:
        """A pending segment the manifest names is this cache's; one it does not name never counted."""
        pending, self.pending = self.pending, None
        if pending and manifest is not None and pending["segment"] in manifest.segments:
            self.mine[pending["segment"]] = list(pending["shards"])
            self.synced_through = max(self.synced_through, int(pending["through"]))


def part_name(segment: str, number: int) -> str:
    return f"{segment}-{number:05d}"


def part_entry(segment: str, number: int, part: Part) -> ShardEntry:
    """A segment's part as a shard of the cache (its files downloaded when read)."""
    name = part_name(segment, number)
    files: dict[str, dict[str, Any]] = {
        "results": {"name": f"{name}.results.arrow", "bytes": part.results[1], "sha256": part.results[2]}
    }
    if part.hidden is not None:
        files["hidden"] = {"name": f"{name}.hidden.safetensors", "bytes": part.hidden[2], "crc32": part.hidden[3]}
    return ShardEntry(name, part.records, files, part.run, {"segment": segment, "part": number, **part.described()})


class Cache:
    """The link between one cache folder's checkpoint and its store's bucket."""

    def __init__(self, chain: Chain, folder: Path) -> None:
        self.chain = chain
        self.folder = folder
        self.lock = threading.Lock()
        self.downloaded = 0
        """Bytes this process downloaded into the cache (for benchmarks and `checkpoint info`)."""
        self.mark: Mark | None = None
        """The cache's mark (`refresh`'s), where a segment found damaged is set aside."""

    # ------------------------------------------------------------------ reading parts

    def fetch(self, checkpoint: Checkpoint, entry: ShardEntry, kind: str) -> None:
        """Download a remote part's `kind` file (or a `--ray` actor's hidden-state upload) into
        shards/ (Checkpoint.fetch; also while the checkpoint opens, before `refresh`: a part
        journaled by an import that was killed before its keys were indexed is read to index it)."""
        with self.lock, store_problems(self.chain.uri):
            if (checkpoint.shards_path / entry.files[kind]["name"]).exists():
                return
            try:
                if kind == "results":
                    self._fetch_results(checkpoint, entry.remote["segment"])  # type: ignore[index]
                else:
                    self._fetch_hidden(checkpoint, entry)
            except (DamagedObject, MissingObject) as found:
                raise self._set_aside(checkpoint, entry, found) from None

    def _set_aside(self, checkpoint: Checkpoint, entry: ShardEntry, found: Exception) -> DamagedObject:
        """A part's object found missing or damaged while read: its segment is set aside in the
        mark (the next open forgets its parts; the next commit drops it); the error that says so."""
        segment = entry.remote["segment"] if entry.remote else ""
        damage = found if isinstance(found, DamagedObject) else damaged(self.chain, segment, "", found)
        if not segment:
            return damage
        if self.mark is None:
            self.mark = Mark.load(self.folder, self.chain.uri)
        self.mark.set_aside[segment] = str(damage)
        self.mark.save(self.folder)
        records = sum(item.records for item in checkpoint.entries if item.remote and item.remote["segment"] == segment)
        return DamagedObject(set_aside_line(damage, records), damage.obj, segment)

    def _fetch_results(self, checkpoint: Checkpoint, segment: str) -> None:
        """Every part of the segment that the cache names gets its results file (one GET,
        streamed to a file in the cache folder, then cut: bounded memory however large)."""
        entries = [entry for entry in checkpoint.entries if entry.remote and entry.remote["segment"] == segment]
        obj = entries[0].remote["results_object"]  # type: ignore[index]
        whole = self.folder / f".{segment}.results.tmp"
        try:
            try:
                self.downloaded += self.chain.bucket.download(self.chain.key(obj), whole)
            except MissingObject as missing:
                raise damaged(self.chain, segment, obj, missing) from None
            if not named_by(whole, obj):
                raise damaged(self.chain, segment, obj, "its bytes are not those its name was made of")
            parts = [Part.read(entry.remote) for entry in entries]  # type: ignore[arg-type]
            with open(whole, "rb") as source:
                for entry, piece in zip(entries, split_results(source, parts, self.chain.uri + obj), strict=True):
                    path = checkpoint.shards_path / entry.files["results"]["name"]
                    if not path.exists():
                        write_bytes(path, piece)
        finally:
            durable.unlink(whole)

    def _fetch_hidden(self, checkpoint: Checkpoint, entry: ShardEntry) -> None:
        described = entry.files["hidden"]
        if entry.remote is not None:
            obj, offset, size, crc = entry.remote["hidden"]
        else:  # a `--ray` actor's upload, whole
            obj, offset, size, crc = described["object"], 0, described["bytes"], described["crc32"]
        segment = entry.remote["segment"] if entry.remote else ""
        try:
            data = self.chain.bucket.get_range(self.chain.key(obj), offset, offset + size)
        except MissingObject as missing:
            raise damaged(self.chain, segment, obj, missing) from None
        except LocationProblem:  # a range past its end (416): an object cut short is damage, not a failure
            if self.chain.bucket.head(self.chain.key(obj)).size >= offset + size:
                raise
            raise damaged(self.chain, segment, obj, "it is shorter than the hidden states its segment names") from None
        self.downloaded += len(data)
        if len(data) != size or zlib.crc32(data) != crc:
            raise damaged(self.chain, segment, obj, "it does not hold the hidden states its segment names")
        write_bytes(checkpoint.shards_path / described["name"], data)

    # ------------------------------------------------------------------ up to date

    def refresh(self, checkpoint: Checkpoint, manifest: Manifest | None, mark: Mark) -> None:
        """Make the cache's checkpoint hold what `manifest` names (see the module's note)."""
        self.mark = mark
        mark.settle(manifest)
        wanted = manifest.segments if manifest is not None else {}
        mark.set_aside = {segment: why for segment, why in mark.set_aside.items() if segment in wanted}
        present = {entry.remote["segment"] for entry in checkpoint.entries if entry.remote}
        gone_mine = {segment for segment in mark.mine if segment not in wanted}
        gone = {name for segment in gone_mine for name in mark.mine.pop(segment)}
        dropped = [
            entry
            for entry in checkpoint.entries
            if (entry.remote and not _counts(entry.remote["segment"], wanted, mark)) or entry.name in gone
        ]
        if dropped:
            self._forget(checkpoint, dropped)
        assert checkpoint.index is not None
        runs = checkpoint.index.merge_runs(manifest.runs) if manifest is not None else {}
        for segment in wanted:
            if segment not in present and segment not in mark.mine and segment not in mark.set_aside:
                try:
                    self._import(checkpoint, segment, manifest, runs)  # type: ignore[arg-type]
                except (DamagedObject, MissingObject) as found:
                    obj = manifest.segments[segment].keys  # type: ignore[union-attr]
                    mark.set_aside[segment] = str(found if isinstance(found, DamagedObject) else damaged(
                        self.chain, segment, obj, found))  # fmt: skip
        mark.seq = manifest.seq if manifest is not None else 0
        mark.save(self.folder)

    def forget_segments(self, checkpoint: Checkpoint, segments: set[str]) -> None:
        """Forget the parts of segments set aside while the job runs (their keys leave the index)."""
        self._forget(
            checkpoint, [entry for entry in checkpoint.entries if entry.remote and entry.remote["segment"] in segments]
        )

    def _forget(self, checkpoint: Checkpoint, dropped: list[ShardEntry]) -> None:
        """Drop entries (and their downloaded files) the store no longer names."""
        names = {entry.name for entry in dropped}
        checkpoint.entries = [entry for entry in checkpoint.entries if entry.name not in names]
        checkpoint._tables.clear()
        checkpoint._rewrite_journal()
        assert checkpoint.index is not None
        checkpoint.index.reconcile(names, [])
        for entry in dropped:
            for described in entry.files.values():
                durable.unlink(checkpoint.shards_path / described["name"])

    def _import(self, checkpoint: Checkpoint, segment: str, manifest: Manifest, runs: dict[str, int]) -> None:
        """A segment of another machine: its parts as journal lines, its keys into the index."""
        described = manifest.segments[segment]
        keys_file = self.folder / f".{segment}.keys.tmp"
        try:
            try:
                self.downloaded += self.chain.bucket.download(self.chain.key(described.keys), keys_file)
            except MissingObject as missing:
                raise damaged(self.chain, segment, described.keys, missing) from None
            if not named_by(keys_file, described.keys):
                raise damaged(self.chain, segment, described.keys, "its bytes are not those its name was made of")
            parts = read_parts(keys_file, self.chain.uri + described.keys)
            entries = [part_entry(segment, number, part) for number, part in enumerate(parts)]
            for entry in entries:
                assert entry.remote is not None
                entry.remote["results_object"] = described.results
            durable.append(checkpoint.path / JOURNAL, "".join(entry.line() for entry in entries).encode("utf-8"))
            checkpoint.entries.extend(entries)
            run_of = [runs.get(part.run) or checkpoint.index.begin_run(part.run or "unknown") for part in parts]  # type: ignore[union-attr]
            shards = [(entry.name, entry.files["results"]["name"]) for entry in entries]
            assert checkpoint.index is not None
            checkpoint.index.add_keys(shards, _rows(keys_file, entries, run_of))
        finally:
            durable.unlink(keys_file)


def _counts(segment: str, wanted: dict, mark: Mark) -> bool:
    """Whether a segment's parts stay in the cache: the manifest names it and it was not set aside."""
    return segment in wanted and segment not in mark.set_aside


def _rows(keys_file: Path, entries: list[ShardEntry], run_of: list[int]):  # type: ignore[no-untyped-def]
    """(key, shard, row, final, hidden, run seq) of a keys object, a batch at a time."""
    names = [entry.name for entry in entries]
    for batch in read_keys(keys_file):
        columns = batch.to_pydict()
        for key, part, row, final, hidden in zip(
            columns["key"], columns["part"], columns["row"], columns["final"], columns["hidden"], strict=True
        ):
            yield key.hex(), names[part], row, int(final), int(hidden), run_of[part]
