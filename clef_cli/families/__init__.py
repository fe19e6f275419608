"""The Clef model families, chosen in one place from the release's `config.json` model_type."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clef_cli.families.base import Family
    from clef_cli.release import Release

FAMILY_BY_MODEL_TYPE = {"qwen3_omni_moe": "omni", "qwen3_5": "dense", "qwen3_5_moe": "dense"}
"""Kept here as plain names so that finding a release never imports torch."""


def family_named(name: str) -> Family:
    if name == "omni":
        from clef_cli.families.omni import OmniFamily

        return OmniFamily()
    if name == "dense":
        from clef_cli.families.dense import DenseFamily

        return DenseFamily()
    raise ValueError(f"unknown model family {name!r}")


def family_of(release: Release) -> Family:
    return family_named(release.family)
