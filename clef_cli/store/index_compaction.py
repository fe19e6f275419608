"""The key index after a prune, changed in bulk: the keys a prune drops are deleted and the kept
keys of each rewritten shard get their new row, in one transaction of a few statements.

Why not a statement a key: a prune rewrites a shard under its own name (prune.py), so a kept key
keeps its shard and seq and only its row moves down by the dropped rows before it. Updating
millions of keys one `UPDATE` each, at random places of a B-tree larger than SQLite's cache,
took 615 s for 10M keys; one `UPDATE` that walks the keys in key order touches each page once,
and leaves the shard index (`keys_by_shard`) alone, since no shard name changes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from clef_cli.store.key_index import KeyIndex

WALK_SHARE = 32
"""Walk every key (in key order) when the rewritten shards hold more than 1/WALK_SHARE of the
keys; fewer are found through the shard index, a shard at a time."""


@dataclass(frozen=True)
class Rewritten:
    """One shard a prune rewrote under its name: its new results file and the rows it no longer
    has (sorted; the keys that pointed to them are deleted from the index)."""

    name: str
    file: str
    gone_rows: Sequence[int]


def compact(index: KeyIndex, rewritten: Sequence[Rewritten], removed: Sequence[str], total_keys: int) -> None:
    """Forget the `removed` shards' keys and the rewritten shards' dropped keys, and move every
    other key of a rewritten shard to its row in the new file (one transaction)."""
    with index.transaction() as db:
        db.execute("CREATE TEMP TABLE IF NOT EXISTS moved (name TEXT PRIMARY KEY) WITHOUT ROWID")
        db.execute(
            "CREATE TEMP TABLE IF NOT EXISTS gone (shard TEXT, row INTEGER, before INTEGER NOT NULL, "
            "PRIMARY KEY (shard, row)) WITHOUT ROWID"
        )
        try:
            _fill(db, rewritten)
            walk = bool(rewritten) and _rows_in(db) * WALK_SHARE > total_keys
            _drop_and_move(db, rewritten, walk)
            files = [(shard.file, shard.name) for shard in rewritten]
            db.executemany("UPDATE shards SET file = ? WHERE name = ?", files)
            for name in removed:
                db.execute("DELETE FROM keys WHERE shard = ?", (name,))
                db.execute("DELETE FROM shards WHERE name = ?", (name,))
        finally:
            db.execute("DELETE FROM temp.moved")
            db.execute("DELETE FROM temp.gone")


def _fill(db: sqlite3.Connection, rewritten: Sequence[Rewritten]) -> None:
    """`moved`: the rewritten shards; `gone`: each one's dropped rows with how many of them lie at
    or before each (a kept row moves down by the count of the nearest gone row before it)."""
    db.executemany("INSERT INTO temp.moved(name) VALUES (?)", [(shard.name,) for shard in rewritten])
    db.executemany(
        "INSERT INTO temp.gone(shard, row, before) VALUES (?, ?, ?)",
        ((shard.name, int(row), number) for shard in rewritten for number, row in enumerate(shard.gone_rows, 1)),
    )


_GONE_ROW = "SELECT 1 FROM temp.gone g WHERE g.shard = keys.shard AND g.row = keys.row"
_NEW_ROW = (
    "row - COALESCE((SELECT g.before FROM temp.gone g WHERE g.shard = keys.shard AND g.row < keys.row "
    "ORDER BY g.row DESC LIMIT 1), 0)"
)


def _drop_and_move(db: sqlite3.Connection, rewritten: Sequence[Rewritten], walk: bool) -> None:
    """Delete the keys of gone rows, then set each kept key's new row. Walking: `key >= ''` makes
    SQLite go through the table in key order (left to itself it reads the keys from the shard
    index and updates the table at random, 10x slower) and `+shard` keeps it off the shard index.
    Otherwise a shard at a time through the shard index (few keys to touch)."""
    if walk:
        moved = "key >= '' AND +shard IN (SELECT name FROM temp.moved)"
        db.execute(f"DELETE FROM keys WHERE {moved} AND EXISTS ({_GONE_ROW})")
        db.execute(f"UPDATE keys SET row = {_NEW_ROW} WHERE {moved}")
        return
    for shard in rewritten:
        db.execute(f"DELETE FROM keys WHERE shard = ? AND EXISTS ({_GONE_ROW})", (shard.name,))
        db.execute(f"UPDATE keys SET row = {_NEW_ROW} WHERE shard = ?", (shard.name,))


def _rows_in(db: sqlite3.Connection) -> int:
    """Keys the index points into the rewritten shards (counted on the shard index)."""
    return int(db.execute("SELECT COUNT(*) FROM keys WHERE shard IN (SELECT name FROM temp.moved)").fetchone()[0])
