"""A checkpoint's manifest: the format version and the scoring fingerprint (the backbone, the
head, the dtype) that every run using the store must share, and what made the store."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from clef_cli.errors import ClefError, UsageError
from clef_cli.store.atomic import write_text

FORMAT_VERSION = 2
"""2: content-addressed (results carry record_key and error_kind; the manifest has no inputs)."""
MANIFEST = "manifest.json"


class CheckpointMismatch(UsageError):
    """The checkpoint was made by another model, head, dtype or engine (or another clef's format):
    a refusal (exit 2) that leaves the store as it was, for the user to point elsewhere."""


def describe_differences(stored: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """Human lines for every leaf that differs between two manifests."""
    lines = []
    for key in sorted(set(stored) | set(current)):
        name = f"{prefix}{key}"
        old, new = stored.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            lines.extend(describe_differences(old, new, f"{name}."))
        elif old != new:
            lines.append(f"{name}: checkpoint has {_short(old)}, this run has {_short(new)}")
    return lines


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 160 else text[:157] + "..."


def read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as error:
        raise ClefError(f"checkpoint manifest {path / MANIFEST} is unreadable: {error}") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointMismatch(
            f"checkpoint {path} has format version {manifest.get('format_version')}, this clef writes "
            f"{FORMAT_VERSION} (use --checkpoint to give this run another folder, or --restart to discard it)"
        )
    return manifest


def write_manifest(path: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    body = {**manifest, "format_version": FORMAT_VERSION, "created": time.time()}
    write_text(path / MANIFEST, json.dumps(body, indent=2, sort_keys=True))
    return body


DISPLAY_ONLY = ("id", "path")
"""Manifest `model` fields that say where the release was found, not what it is: a release is its
content (config, weights, head; tokenizer and processor files are in every record's key), so the
same bytes reached by another spelling, a symlink or a copy on another disk use the same store."""


def scored_model(manifest: dict[str, Any], given: str | None = None) -> str | None:
    """The release to read a store with: the one given, else the one its manifest names (the
    model that made it: its absolute folder while that still exists, else the id it was given
    as), so `--rehead` and train-head need no --model for their own store from any folder."""
    if given:
        return given
    model = manifest.get("model") or {}
    path = model.get("path")
    if path and Path(path).is_dir():
        return str(path)
    return model.get("id")


def comparable(manifest: dict[str, Any]) -> dict[str, Any]:
    """The scoring fingerprint: what must match for a run to use the store (never the path)."""
    model = {key: value for key, value in (manifest.get("model") or {}).items() if key not in DISPLAY_ONLY}
    return {"model": model, "settings": {"engine": stored_engine(manifest)} | (manifest.get("settings") or {})}


def stored_engine(manifest: dict[str, Any]) -> str:
    """The engine whose results a store holds (`hf` stores name none: they predate the choice)."""
    return str((manifest.get("settings") or {}).get("engine") or "hf")


FIELD_WORDS = {
    "model.family": "family",
    "model.config_sha256": "config",
    "model.weights": "weights",
    "model.head_sha256": "head",
    "model.head_config_sha256": "head",
    "settings.dtype": "dtype",
    "settings.engine": "engine",
}
"""The scoring fingerprint's fields in the words a mismatch names them by (hashes are not shown)."""
SHOWN_VALUES = ("model.family", "settings.dtype", "settings.engine")
"""Fields whose values say something to a reader, so a mismatch shows both."""


def _flat(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """`{"model": {"weights": w}}` as `{"model.weights": w}` (the fingerprint is two levels deep)."""
    return {f"{group}.{key}": value for group, fields in fingerprint.items() for key, value in (fields or {}).items()}


def differing_fields(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The fingerprint fields that differ between a store's manifest and this run's, in words,
    each once, in `FIELD_WORDS`' order (`family (omni there, dense here)`, `weights`, `head`)."""
    old, new = _flat(comparable(stored)), _flat(comparable(current))
    order = {name: position for position, name in enumerate(FIELD_WORDS)}
    named: list[str] = []
    for name in sorted(set(old) | set(new), key=lambda name: (order.get(name, len(order)), name)):
        if old.get(name) == new.get(name):
            continue
        word = FIELD_WORDS.get(name, name.rsplit(".", 1)[-1])
        if name in SHOWN_VALUES:
            word += f" ({_short(old.get(name))} there, {_short(new.get(name))} here)"
        if word not in named:
            named.append(word)
    return named


def mismatch_message(path: Path | str, stored: dict[str, Any], current: dict[str, Any]) -> str:
    """One line for a store made otherwise: what differs in words, the model that made it, and
    what to do: another folder before `--restart` (which discards a store other jobs may share)."""
    fields = differing_fields(stored, current)
    listed = ", ".join(fields[:-1]) + f" and {fields[-1]}" if len(fields) > 1 else "".join(fields)
    model = stored.get("model") or {}
    made_with = model.get("path") or model.get("id") or "an unknown model"
    hint = mismatch_hint(stored, current, remote="://" in str(path))
    return f"checkpoint {path} was scored with {made_with}; this run differs in {listed}: {hint}"


def mismatch_hint(stored: dict[str, Any], current: dict[str, Any], remote: bool = False) -> str:
    """What to do about a store made otherwise: its own engine first, when that is the difference,
    then another folder; `--restart` last, since it discards every result the store holds (a
    bucket store's, every machine's: refused without `--confirm-restart`, so both are named)."""
    engine = stored_engine(stored)
    other_engine = engine != stored_engine(current)
    use = f"score with --engine {engine} to use it, " if other_engine else ""
    if remote:
        return f"{use}use --checkpoint to give this run another store, or --restart --confirm-restart to discard it"
    return f"{use}use --checkpoint to give this run another folder, or --restart to discard this store"
