"""How a batch's hidden states cross from the vLLM worker to clef: shared-memory files, not pickle.

clef makes one file per batch in flight under /dev/shm (a RAM-backed filesystem; the system's
temporary folder where there is none), sized for the batch's right-padded `[B, L, H]` states
in the compute dtype (bf16 on a GPU, fp32 stays fp32). The worker maps the file and writes the
states into it once; clef maps it too and hands the head a tensor over those very pages, so no
byte is pickled, piped or copied on clef's side. A slot is lent for one batch: it is reused only
after the executor says the batch's states are no longer read (`release_read`), so the store's
copy of kept states (hidden_store.hidden_payload) is made before the pages are written again.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

SHM = Path("/dev/shm")


def shared_folder() -> Path:
    return SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else Path(tempfile.gettempdir())


@dataclass
class Slot:
    """One shared-memory file; `view` maps the states the worker wrote into it."""

    path: Path
    size: int = 0
    mapped: mmap.mmap | None = None

    def fit(self, needed: int) -> None:
        """Grow the file to hold `needed` bytes (never shrinks: a slot serves batches of any size)."""
        if needed <= self.size:
            return
        size = max(needed, 2 * self.size)
        with open(self.path, "r+b") as file:
            os.ftruncate(file.fileno(), size)
            self.mapped = mmap.mmap(file.fileno(), size)  # an older map, still viewed, lives on with its views
        self.size = size

    def view(self, shape: tuple[int, int, int], dtype: torch.dtype) -> torch.Tensor:
        assert self.mapped is not None
        count = shape[0] * shape[1] * shape[2]
        return torch.frombuffer(self.mapped, dtype=dtype, count=count).view(shape)


@dataclass
class StateSlots:
    """The slots of one worker: free ones, lent ones (submitted, or read by the head), and their files."""

    folder: Path = field(default_factory=shared_folder)
    free: list[Slot] = field(default_factory=list)
    read: list[Slot] = field(default_factory=list)
    every: list[Slot] = field(default_factory=list)
    _names: itertools.count = field(default_factory=itertools.count)

    def take(self, needed: int) -> Slot:
        if self.free:
            slot = self.free.pop()
        else:
            if not self.every:
                remove_orphans(self.folder)
            path = self.folder / f"clef-vllm-{os.getpid()}-{id(self):x}-{next(self._names)}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)
            slot = Slot(path)
            self.every.append(slot)
        slot.fit(needed)
        return slot

    def lend(self, slot: Slot) -> None:
        """The slot's states are being read (by the head, by the store's copy)."""
        self.read.append(slot)

    def give_back(self, slot: Slot) -> None:
        """A slot whose request failed: nothing of it is read."""
        self.free.append(slot)

    def release_read(self) -> None:
        """Every state read so far is done with: those slots take new batches."""
        self.free.extend(self.read)
        self.read.clear()

    def close(self) -> None:
        for slot in self.every:
            with contextlib.suppress(OSError):
                slot.path.unlink()
        self.every.clear()
        self.free.clear()
        self.read.clear()


def remove_orphans(folder: Path) -> None:
    """Slot files of a clef that was killed (its pid gone): nothing else removes them from RAM.
    Where there is no /proc to ask, nothing is removed (a live clef's files would look orphaned)."""
    if not Path("/proc/self").exists():
        return
    for path in folder.glob("clef-vllm-*"):
        pid = path.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                path.unlink()


def padded_bytes(batch: int, length: int, width: int, dtype: torch.dtype) -> int:
    return batch * length * width * torch.empty((), dtype=dtype).element_size()
