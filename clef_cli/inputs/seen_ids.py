"""The record ids a pass over the input has seen, and where each was first used: what tells a
duplicate id. A job of millions of records must not hold one Python string per record, so past
`IN_MEMORY` ids they move to a temporary SQLite file (deleted when closed) whose page cache is
bounded: memory stays flat, at a few microseconds an id.
"""

from __future__ import annotations

import sqlite3

IN_MEMORY = 16384
"""Ids kept in a dict before they move to disk (small jobs never touch SQLite)."""


class SeenIds:
    """id -> the index of the first record that used it."""

    def __init__(self, in_memory: int = IN_MEMORY) -> None:
        self.in_memory = in_memory
        self.recent: dict[str, int] = {}
        self.db: sqlite3.Connection | None = None

    def first_use(self, record_id: str, index: int) -> int | None:
        """The index that first used `record_id`, or None when this is its first use (recorded)."""
        if record_id in self.recent:
            return self.recent[record_id]
        if self.db is not None:
            found = self.db.execute("SELECT first FROM ids WHERE id = ?", (record_id,)).fetchone()
            if found is not None:
                return int(found[0])
        self.recent[record_id] = index
        if len(self.recent) >= self.in_memory:
            self._spill()
        return None

    def _spill(self) -> None:
        if self.db is None:
            # "": a private temporary database on disk, removed when the connection closes
            self.db = sqlite3.connect("", check_same_thread=False, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=OFF")
            self.db.execute("PRAGMA synchronous=OFF")
            self.db.execute("CREATE TABLE ids (id TEXT PRIMARY KEY, first INTEGER NOT NULL) WITHOUT ROWID")
        self.db.execute("BEGIN")
        self.db.executemany("INSERT OR IGNORE INTO ids VALUES (?, ?)", self.recent.items())
        self.db.execute("COMMIT")
        self.recent.clear()

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None

    def __del__(self) -> None:
        self.close()
