"""Dtype names, once, without importing torch (the CLI's help and `checkpoint info` stay light)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from clef_cli.choices import HiddenDtype

if TYPE_CHECKING:
    import torch

COMPUTE_DTYPES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "float32": "float32",
    "fp32": "float32",
}
"""Spellings `--dtype` accepts, and the torch dtype each one names."""
HIDDEN_DTYPES = tuple(dtype.value for dtype in HiddenDtype)
"""What stored hidden states may be kept as (`--hidden-dtype`)."""
ITEM_SIZES = {"bfloat16": 2, "float16": 2, "float32": 4}


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, COMPUTE_DTYPES[name])
