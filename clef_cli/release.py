"""Finding a Clef release (local folder or hub id through the HF cache) and its processor.

Nothing here touches the weights, so `clef inspect-spans` and `clef score --dry-run` stay cheap:
for a hub id only the small text files are fetched unless the caller asks for the weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_cli.errors import ModelLoadError, ModelRefused, UsageError

DEFAULT_MODEL = "Cloudflare/clef-omni"
HEAD_CONFIG = "joint_head_config.json"
HEAD_WEIGHTS = "joint_head.safetensors"
HEAD_FILES = (HEAD_CONFIG, HEAD_WEIGHTS)
TEXT_FILE_PATTERNS = ["*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
WEIGHT_INDEX = "model.safetensors.index.json"
FAMILY_BY_MODEL_TYPE = {"qwen3_omni_moe": "omni", "qwen3_5": "dense", "qwen3_5_moe": "dense"}
"""Family names by `config.json` model_type, as plain strings: finding a release never imports a
family (or torch); `clef_cli.families` turns the name into one."""


@dataclass(frozen=True)
class Release:
    """A resolved release folder and where it came from."""

    path: Path
    model_id: str
    revision: str | None
    config: dict[str, Any]

    @property
    def family(self) -> str:
        """`omni` (Qwen3-Omni thinker) or `dense` (Qwen3.5): see clef_cli/families/."""
        return FAMILY_BY_MODEL_TYPE[self.config["model_type"]]

    @property
    def text_config(self) -> dict[str, Any]:
        return self.config.get("thinker_config", self.config)["text_config"]

    @property
    def hidden_size(self) -> int:
        return int(self.text_config["hidden_size"])


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _download(model: str, revision: str | None, with_weights: bool) -> tuple[Path, str | None]:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    # an id that is no hub id, a model this machine cannot get, a revision that is not there: a
    # --model this run cannot use (exit 2, README's table); a network failure stays exit 1
    try:
        folder = snapshot_download(
            model,
            revision=revision,
            allow_patterns=None if with_weights else TEXT_FILE_PATTERNS,
            local_files_only=_offline(),
        )
    except HFValidationError:
        raise ModelRefused(f"model {model!r} is neither a local folder nor a valid hub id") from None
    except LocalEntryNotFoundError:
        hint = " (HF_HUB_OFFLINE is set)" if _offline() else ""
        raise ModelRefused(f"model {model!r} is not in the local HF cache and cannot be downloaded{hint}") from None
    except (RepositoryNotFoundError, GatedRepoError):
        raise ModelRefused(f"model {model!r} was not found on the hub or needs access rights") from None
    except RevisionNotFoundError:
        raise ModelRefused(f"model {model!r} has no revision {revision!r}") from None
    except OSError as error:
        raise ModelLoadError(f"cannot fetch model {model!r}: {error}") from None
    path = Path(folder)
    return path, path.name if path.parent.name == "snapshots" else revision


def resolve_release(
    model: str, revision: str | None = None, with_weights: bool = True, require_head: bool = True
) -> Release:
    """The release folder for a local path or hub id, checked for a Clef release's layout. A folder
    that is not one (no config.json, another model_type, no head) is refused (`ModelRefused`,
    exit 2) before anything is written; a hub that cannot be reached is a failure (exit 1)."""
    local = Path(model).expanduser()
    if local.exists():
        if not local.is_dir():
            raise UsageError(f"model path {local} is not a folder: give --model a release folder or a hub id")
        path, resolved_revision = local.resolve(), revision
    elif model.startswith((".", "/", "~")) or os.sep in model.strip("/").replace("/", "", 1):
        raise UsageError(f"model folder not found: {model}")
    else:
        path, resolved_revision = _download(model, revision, with_weights)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelRefused(f"{path} has no config.json: not a Clef release")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ModelRefused(f"cannot read {config_path}: {error}") from None
    model_type = config.get("model_type")
    known = ", ".join(repr(name) for name in FAMILY_BY_MODEL_TYPE)
    if model_type not in FAMILY_BY_MODEL_TYPE:
        raise ModelRefused(f"{config_path} has model_type {model_type!r}; a Clef release has one of {known}")
    text_config = config.get("thinker_config", config).get("text_config")
    if not isinstance(text_config, dict) or "hidden_size" not in text_config:
        where = "thinker_config.text_config" if model_type == "qwen3_omni_moe" else "text_config"
        raise ModelRefused(f"{config_path} has no {where}.hidden_size: not a Clef release")
    if require_head:
        missing = [name for name in HEAD_FILES if not (path / name).is_file()]
        if missing:
            raise ModelRefused(f"{path} lacks {' and '.join(missing)}: not a Clef release")
    return Release(path=path, model_id=model, revision=resolved_revision, config=config)


def load_processor(release: Release) -> Any:
    """The release's processor (tokenizer, and its family's image, audio and video processors)."""
    from transformers import AutoProcessor
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return AutoProcessor.from_pretrained(str(release.path))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ModelLoadError(f"cannot load the tokenizer and processor from {release.path}: {error}") from None
    finally:
        hf_logging.set_verbosity(verbosity)


def file_sha256(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def file_crc32(path: Path, chunk_size: int = 1 << 22) -> int:
    """CRC32 of a file, read once in large chunks (zlib releases the GIL, so threads overlap)."""
    crc = 0
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_size):
            crc = zlib.crc32(chunk, crc)
    return crc


def weights_fingerprint(release: Release, hash_below_bytes: int = 64 << 20) -> str:
    """Identifies the backbone weights without hashing tens of GB: the shard index, every shard's
    name and size, and the full hash of shards small enough to read quickly."""
    digest = hashlib.sha256()
    index = release.path / WEIGHT_INDEX
    if index.is_file():
        digest.update(index.read_bytes())
    for shard in sorted(release.path.glob("*.safetensors")):
        if shard.name in HEAD_FILES:
            continue
        size = shard.stat().st_size
        digest.update(f"{shard.name}:{size}\n".encode())
        if size < hash_below_bytes:
            digest.update(file_sha256(shard).encode())
    return digest.hexdigest()
