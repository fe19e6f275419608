"""The pipe protocol between clef and its vLLM worker: length-prefixed pickle frames.

Stdlib only: the worker runs this file's twin functions in vLLM's own environment (worker.py
keeps a copy, since it must not import clef), so both sides agree on 8-byte big-endian lengths.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any, BinaryIO

HEADER = struct.Struct(">Q")


def send(stream: BinaryIO, message: Any) -> None:
    """One frame: the pickled message after its length."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(payload)) + payload)
    stream.flush()


def receive(stream: BinaryIO) -> Any:
    """The next frame's message; EOFError when the other side has gone."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        raise EOFError("the vLLM worker closed its pipe")
    (size,) = HEADER.unpack(header)
    payload = stream.read(size)
    if len(payload) < size:
        raise EOFError("the vLLM worker closed its pipe mid-message")
    return pickle.loads(payload)
