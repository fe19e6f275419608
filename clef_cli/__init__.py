"""clef: batch scoring for Cloudflare's Clef decision models (Clef-Omni, Clef, Clef-Flash).

The CLI (`clef`) is a thin layer over this library; a Python caller uses the same pieces:

    from clef_cli import PromptEncoder, load_scorer, read_records, resolve_release, load_processor

    release = resolve_release("Cloudflare/clef-omni")
    encoder = PromptEncoder(load_processor(release))
    scorer = load_scorer(release)
    encoded = [encoder.encode(r) for r in read_records(["records.jsonl"])]
    results = scorer.score(encoded)
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("clef-cli")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

_EXPORTS = {
    "ClefError": "clef_cli.errors",
    "ModelLoadError": "clef_cli.errors",
    "RecordError": "clef_cli.errors",
    "UsageError": "clef_cli.errors",
    "MediaLimits": "clef_cli.encoding.media",
    "EncodedRecord": "clef_cli.encoding.encoded",
    "OverflowPolicy": "clef_cli.choices",
    "PromptEncoder": "clef_cli.encoding.prompt",
    "InvalidRecord": "clef_cli.inputs.records",
    "Record": "clef_cli.inputs.records",
    "read_records": "clef_cli.inputs.readers",
    "load_processor": "clef_cli.release",
    "resolve_release": "clef_cli.release",
    "ScoreJob": "clef_cli.engines.local.pipeline",
    "ScoreSettings": "clef_cli.job.settings",
    "ScoredRecord": "clef_cli.results",
    "Scorer": "clef_cli.model.scoring",
    "load_scorer": "clef_cli.model.scoring",
}
__all__ = [*sorted(_EXPORTS), "__version__"]


def __getattr__(name: str) -> object:
    """Exports load lazily, so `clef --help` does not pay for importing torch."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'clef_cli' has no attribute {name!r}")
