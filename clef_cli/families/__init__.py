"""The Clef model families, chosen in one place from the release's `config.json` model_type."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clef_cli.families.base import Family
    from clef_cli.release import Release


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
