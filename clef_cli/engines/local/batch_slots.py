"""Shared-memory slots that encoding workers write batches into, reused from batch to batch.

New shared memory costs more than the copy into it: the 22 MB of float32 patches of a 720p image
took about 25 ms of page faults in a fresh segment against 3 ms into pages already mapped
(issue 24), as much as encoding the image. So the main process owns a few slots (one per batch in
flight). A batch goes to a worker with a free slot; the worker lays the batch's tensors out in it
(keeping its mapping from batch to batch), the main process maps the same pages, and the slot is
free again once the batch has run. What does not fit a slot goes to fresh shared memory, and
the slot grows to fit the next batch like it.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass

import torch

ALIGNMENT = 64
"""Bytes: each tensor starts on a cache line (and on a multiple of every dtype's size)."""
GROWTH = 1.25
"""A slot that was too small is remade this much larger than the batch that needed it."""


@dataclass
class Slot:
    """One shared-memory buffer, named by `number` across processes."""

    number: int
    storage: torch.UntypedStorage

    @property
    def nbytes(self) -> int:
        return self.storage.nbytes()


def _shared_storage(nbytes: int) -> torch.UntypedStorage:
    """Shared memory whose pages are made when first written (in the worker, off the main
    thread): torch's own `_new_shared` touches all of it on the calling thread, 145 ms for a
    325 MB slot here, holding the GIL. An anonymous memfd, not a file in /dev/shm, so a
    container's small /dev/shm (Docker's 64 MB) does not bound it."""
    if not hasattr(os, "memfd_create"):  # not Linux
        return torch.UntypedStorage._new_shared(nbytes)
    descriptor = os.memfd_create("clef-batch-slot")
    try:
        os.ftruncate(descriptor, nbytes)
        return torch.UntypedStorage._new_shared_fd_cpu(descriptor, nbytes)
    finally:
        os.close(descriptor)  # the storage keeps its own duplicate


@dataclass
class SlotAllocator:
    """`collate`'s allocator in a worker: tensors laid out one after another in the slot, fresh
    shared memory for any that would overrun it; `needed` is the bytes the batch would take."""

    slot: Slot | None
    needed: int = 0
    spilled: int = 0
    """Bytes that did not fit and went to fresh shared memory."""

    def __call__(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = math.prod(shape) * itemsize
        start = -(-self.needed // ALIGNMENT) * ALIGNMENT
        self.needed = start + nbytes
        if self.slot is None or self.needed > self.slot.nbytes:
            self.spilled += nbytes
            return torch.empty(0, dtype=dtype).set_(_shared_storage(max(nbytes, 1)), 0, shape)
        return torch.empty(0, dtype=dtype).set_(self.slot.storage, start // itemsize, shape)


_mapped: dict[int, torch.UntypedStorage] = {}
"""In a worker: the slots it has written, kept mapped (torch then maps a slot it is sent again to
these same pages instead of mapping it anew, which would fault every page in again)."""


def allocator_for(slot: Slot | None) -> SlotAllocator:
    if slot is not None:
        _mapped[slot.number] = slot.storage
    return SlotAllocator(slot)


class BatchSlots:
    """The main process's slots: `take` one for a batch, `give_back` it once that batch has run.
    Every slot is made as large as the largest batch yet (with room to spare), so that batches
    of different sizes can use any slot."""

    def __init__(self) -> None:
        self._free: list[Slot] = []
        self._numbers = itertools.count()
        self._size = ALIGNMENT

    def take(self) -> Slot:
        if self._free:
            return self._free.pop()
        return Slot(next(self._numbers), _shared_storage(self._size))

    def give_back(self, slot: Slot, needed: int) -> None:
        """Free again; remade larger when a batch has needed more than it holds (under the same
        number, so that a worker's mapping of the old one is replaced, and released)."""
        if needed > self._size:
            self._size = int(needed * GROWTH)
        if slot.nbytes < self._size:
            slot = Slot(slot.number, _shared_storage(self._size))
        self._free.append(slot)
