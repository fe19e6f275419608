"""A recorder of the store's durable operations (clef_cli/store/durable.py) and the crash states
the POSIX/ext4 model allows after any prefix of them, built as real folders (test-only).

The model (the one ALICE, OSDI 2014, checks): a crash may land after any operation. Then
- a write not yet covered by an fsync of its file may be absent, or cut at a 4 KiB boundary;
- a create, rename, unlink or mkdir not yet covered by an fsync of its folder may be absent;
- SQLite (the key index) keeps every transaction committed before the crash (synchronous=FULL):
  its files are copied, between transactions, at every recorded operation. The index may also be
  lost whole (it is derived data; the store must rebuild it).
Each state starts from a copy of the folder as it was before the workload and replays the
recorded operations onto it, skipping or cutting the chosen ones.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

BLOCK = 4096
SQLITE_SUFFIXES = ("", "-wal")  # -shm is rebuilt from the WAL by SQLite itself
DIR_OPS = ("create", "rename", "unlink", "mkdir", "rmtree")


@dataclass
class Op:
    kind: str
    path: str
    target: str | None = None
    offset: int = 0
    data: bytes | None = None
    size: int = 0
    index: dict[str, bytes | None] = field(default_factory=dict)
    """The SQLite files (relative path -> bytes, None when absent) as they were before this op."""


class Recorder:
    """An observer for `durable.observe`: every operation under `root`, in order."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.ops: list[Op] = []
        self.databases: dict[str, Any] = {}
        """Relative path of each SQLite database opened -> the lock its connection is used under."""
        self.keys_of: dict[str, list[str]] = {}
        """Results file name -> its record keys (read as the file is renamed into place)."""
        self.final_index: dict[str, bytes | None] = {}
        self._guard = threading.Lock()

    def relative(self, path: Path) -> str | None:
        try:
            return str(Path(path).resolve().relative_to(self.root))
        except ValueError:
            return None

    def __call__(self, kind: str, path: Path, details: dict[str, Any]) -> None:
        relative = self.relative(path)
        if relative is None:
            return
        if kind == "sqlite_open":
            self.databases[relative] = details.get("lock")
        target = details.get("target")
        if kind == "rename" and str(target).endswith(".results.arrow"):
            table = ipc.open_file(pa.BufferReader(Path(path).read_bytes())).read_all()
            self.keys_of[Path(target).name] = [key for key in table.column("record_key").to_pylist() if key]
        op = Op(kind, relative, self.relative(target) if target else None, details.get("offset", 0),
                details.get("data"), details.get("size", 0), self.index_files())  # fmt: skip
        with self._guard:
            self.ops.append(op)

    def index_files(self) -> dict[str, bytes | None]:
        """The SQLite files now, each copied while its connection is between transactions."""
        copies: dict[str, bytes | None] = {}
        for database, lock in list(self.databases.items()):
            held = lock.acquire(timeout=5) if lock is not None else False
            try:
                for suffix in SQLITE_SUFFIXES:
                    file = self.root / (database + suffix)
                    copies[database + suffix] = file.read_bytes() if file.exists() else None
            finally:
                if held:
                    lock.release()
        return copies

    def finish(self) -> None:
        self.final_index = self.index_files()


# ----------------------------------------------------------------------------- coverage


def _parent(path: str) -> str:
    return str(Path(path).parent)


def uncovered(ops: list[Op], prefix: int) -> list[int]:
    """The operations among the first `prefix` that a power loss may undo: writes and truncates
    no later fsync of their file covers, names no later fsync of their folder covers."""
    found = []
    for position in range(prefix):
        op = ops[position]
        later = ops[position + 1 : prefix]
        if op.kind in ("write", "truncate"):
            covered = any(o.kind == "fsync" and o.path == op.path for o in later)
        elif op.kind in DIR_OPS:
            folders = {_parent(op.path)} | ({_parent(op.target)} if op.target else set())
            synced = {o.path for o in later if o.kind == "fsync_dir"}
            covered = folders <= synced
        else:
            continue
        if not covered:
            found.append(position)
    return found


def committed_shards(ops: list[Op], prefix: int, journal: str) -> set[str]:
    """Shards whose journal line was appended and fsynced within the first `prefix` operations."""
    names: set[str] = set()
    for position in range(prefix):
        op = ops[position]
        synced = any(o.kind == "fsync" and o.path == journal for o in ops[position + 1 : prefix])
        if op.kind == "write" and op.path == journal and op.data and synced:
            names.update(json.loads(line)["name"] for line in op.data.decode().splitlines())
    return names


# ----------------------------------------------------------------------------- states


@dataclass(frozen=True)
class CrashState:
    prefix: int
    """The crash lands before operation `prefix` (all earlier ones were issued)."""
    dropped: frozenset[int] = frozenset()
    cut: tuple[tuple[int, int], ...] = ()
    """(write, bytes kept) for writes cut at a 4 KiB boundary."""
    index_lost: bool = False

    def describe(self, ops: list[Op]) -> str:
        last = ops[self.prefix - 1] if self.prefix else None
        parts = [f"after op {self.prefix} ({last.kind} {last.path})" if last else "before any op"]
        parts += [f"lost {ops[i].kind} {ops[i].path}" for i in sorted(self.dropped)]
        parts += [f"{ops[i].kind} {ops[i].path} cut to {kept} bytes" for i, kept in self.cut]
        return "; ".join(parts + (["key index lost"] if self.index_lost else []))


def variants(ops: list[Op], prefix: int) -> Iterator[CrashState]:
    """The states of one prefix: as issued, each undoable operation undone (or a write cut at up
    to three 4 KiB boundaries), all of them undone at once, and the key index lost."""
    yield CrashState(prefix)
    yield CrashState(prefix, index_lost=True)
    loose = uncovered(ops, prefix)
    for position in loose:
        yield CrashState(prefix, frozenset({position}))
        op = ops[position]
        if op.kind == "write" and op.data:
            end = op.offset + len(op.data)
            bounds = list(range((op.offset // BLOCK + 1) * BLOCK, end, BLOCK))
            for bound in sorted({bounds[0], bounds[len(bounds) // 2], bounds[-1]} if bounds else set()):
                yield CrashState(prefix, cut=((position, bound - op.offset),))
    if len(loose) > 1:
        yield CrashState(prefix, frozenset(loose))


@dataclass
class Tree:
    """A folder's content as the replay sees it: names pointing at inodes."""

    dirs: set[str]
    names: dict[str, int]
    inodes: dict[int, bytearray]

    @classmethod
    def read(cls, root: Path) -> Tree:
        tree = cls(set(), {}, {})
        for path in sorted(root.rglob("*")):
            relative = str(path.relative_to(root))
            if path.is_dir():
                tree.dirs.add(relative)
            else:
                tree.names[relative] = tree.new(path.read_bytes())
        return tree

    def new(self, data: bytes = b"") -> int:
        number = len(self.inodes) + 1
        self.inodes[number] = bytearray(data)
        return number

    def copy(self) -> Tree:
        return Tree(set(self.dirs), dict(self.names), {k: bytearray(v) for k, v in self.inodes.items()})

    def apply(self, op: Op, keep: int | None = None) -> None:
        if op.kind == "create":
            self.names[op.path] = self.new()
        elif op.kind == "write" and op.path in self.names:
            data = op.data or b""
            data = data if keep is None else data[:keep]
            content = self.inodes[self.names[op.path]]
            content.extend(b"\0" * max(0, op.offset - len(content)))
            content[op.offset : op.offset + len(data)] = data
        elif op.kind == "truncate" and op.path in self.names:
            del self.inodes[self.names[op.path]][op.size :]
        elif op.kind == "rename" and op.path in self.names and op.target:
            self.names[op.target] = self.names.pop(op.path)
        elif op.kind == "unlink":
            self.names.pop(op.path, None)
        elif op.kind == "mkdir":
            self.dirs.add(op.path)
        elif op.kind == "rmtree":
            inside = lambda name: name == op.path or name.startswith(op.path + "/")  # noqa: E731
            self.dirs = {name for name in self.dirs if not inside(name)}
            self.names = {name: ino for name, ino in self.names.items() if not inside(name)}

    def files(self) -> dict[str, bytes]:
        """Every reachable file (a name whose folder is absent is lost with it)."""
        reachable = lambda name: all(str(p) in self.dirs for p in Path(name).parents if str(p) != ".")  # noqa: E731
        return {name: bytes(self.inodes[ino]) for name, ino in self.names.items() if reachable(name)}


def crashed_files(base: Tree, recorder: Recorder, state: CrashState) -> tuple[set[str], dict[str, bytes]]:
    """The folders and files of `state`: the replay of its prefix, SQLite's files as they were."""
    ops, tree = recorder.ops, base.copy()
    cut = dict(state.cut)
    for position in range(state.prefix):
        if position not in state.dropped:
            tree.apply(ops[position], cut.get(position))
    files = tree.files()
    index = ops[state.prefix].index if state.prefix < len(ops) else recorder.final_index
    for name, data in index.items():
        files.pop(name, None)
        if data is not None and not state.index_lost:
            files[name] = data
    if state.index_lost:
        for database in recorder.databases:
            for suffix in ("", "-wal", "-shm"):
                files.pop(database + suffix, None)
    return tree.dirs, files


def digest(dirs: set[str], files: dict[str, bytes]) -> str:
    hashed = hashlib.sha256()
    for name in sorted(dirs):
        hashed.update(b"d" + name.encode() + b"\0")
    for name, data in sorted(files.items()):
        hashed.update(b"f" + name.encode() + b"\0" + hashlib.sha256(data).digest())
    return hashed.hexdigest()


def crash_states(base: Tree, recorder: Recorder, cap: int, seed: int = 29) -> tuple[int, list[CrashState]]:
    """(how many distinct states the model allows, those to check): every prefix's variants,
    deduplicated by content; beyond `cap`, a fixed-seed sample that always keeps each prefix's
    as-issued state when it can."""
    seen: dict[str, CrashState] = {}
    for prefix in range(len(recorder.ops) + 1):
        for state in variants(recorder.ops, prefix):
            seen.setdefault(digest(*crashed_files(base, recorder, state)), state)
    states = list(seen.values())
    if len(states) <= cap:
        return len(states), states
    plain = [s for s in states if not s.dropped and not s.cut and not s.index_lost]
    rest = [s for s in states if s not in plain]
    generator = random.Random(seed)
    chosen = generator.sample(plain, min(len(plain), cap // 2))
    chosen += generator.sample(rest, min(len(rest), cap - len(chosen)))
    return len(states), sorted(chosen, key=lambda s: (s.prefix, sorted(s.dropped), s.cut, s.index_lost))


def build(base: Tree, recorder: Recorder, state: CrashState, folder: Path) -> Path:
    """Make `state` a real folder at `folder` (emptied first)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    dirs, files = crashed_files(base, recorder, state)
    for name in sorted(dirs):
        (folder / name).mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder
