"""Shard names of a checkpoint's entries, remembered between calls: the next shard's number
and an entry by name cost O(1) a commit or a read, where scanning every entry made a
million-record job (tens of thousands of shards) quadratic in both."""

from __future__ import annotations

from typing import Any


class ShardNames:
    """Follows one entries list as it grows; starts over when given another (pruned, reread)."""

    def __init__(self) -> None:
        self.entries: list | None = None
        self.scanned = self.highest = 0
        self.by_name: dict[str, Any] = {}
        self.floor = 0
        """Numbers at or below this are taken even when no entry has them (a bucket store's cache
        whose synced shards were replaced by a compacted segment: store/remote/)."""

    def _follow(self, entries: list) -> None:
        if entries is not self.entries or self.scanned > len(entries):
            self.entries, self.scanned, self.highest, self.by_name = entries, 0, 0, {}
        for entry in entries[self.scanned :]:
            self.by_name[entry.name] = entry
            if entry.name.isdigit():
                self.highest = max(self.highest, int(entry.name))
        self.scanned = len(entries)

    def next_name(self, entries: list) -> str:
        """One past the highest numbered name (and the floor)."""
        self._follow(entries)
        return f"{max(self.highest, self.floor) + 1:08d}"

    def entry(self, entries: list, name: str) -> Any:
        """The entry named `name` (a KeyError when there is none)."""
        self._follow(entries)
        return self.by_name[name]
