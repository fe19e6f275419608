"""A record's key: the SHA-256 of everything that shapes its prompt, so a prompt the thinker has
already run is never run again (the checkpoint is a store keyed by it).

Version 1 of the key hashes, in this order, as one canonical JSON document:

- `v`: `KEY_VERSION`;
- `prompt`: the prompt-shaping settings' digest (`prompt_digest`): --max-length, --on-overflow,
  the media limits, the model family, and the SHA-256 of each of the release's tokenizer and
  processor files (config.json, tokenizer*, *processor*_config.json, chat_template*, vocab,
  merges...);
- `state`: the state as the prompt renders it (a string as is, anything else compact JSON with
  sorted keys);
- `questions`: per question, in order, after the schema rules (the noul defaults, the
  `--questions` file): its id, type, rendered instruction, rendered options in head order, and
  the order the record wrote its criteria (choice ties go to the first of these);
- `media`: per field (images, audio, videos), per entry in order, the SHA-256 of its bytes:
  a local file's content (never its path), a data: URL's decoded bytes. A remote http(s) URL is
  keyed by its text (`url:` + URL): fetching it to hash it would download every record each
  night, so a remote file replaced under the same URL keeps its stored result (use a new URL,
  a local copy or `--restart`). An entry that cannot be read is keyed by why (`missing:`,
  `unreadable:`, `oversize:` with the path), so the record is tried again once the file exists.

Never the id or the record's position. Nothing is decoded: hashing a file is cheap, decoding a
video is not.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_cli.encoding.media import MediaLimits
from clef_cli.encoding.prompt import render, render_instructions, render_option
from clef_cli.inputs.records import MEDIA_FIELDS, Record

KEY_VERSION = 1
PROCESSOR_FILE_PATTERNS = (
    "config.json",
    "*tokenizer*",
    "*processor*config*.json",
    "preprocessor_config.json",
    "chat_template*",
    "vocab.*",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "*.tiktoken",
    "spm*.model",
)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def processor_files_digest(release_path: Path) -> dict[str, str]:
    """Name -> SHA-256 of every release file the tokenizer and processor are built from."""
    names = {path.name for pattern in PROCESSOR_FILE_PATTERNS for path in release_path.glob(pattern) if path.is_file()}
    return {name: _sha256_file(release_path / name) for name in sorted(names)}


def prompt_digest(release_path: Path, family: str, max_length: int, overflow: str, limits: MediaLimits) -> str:
    """The digest of every setting that shapes a prompt besides the record itself."""
    body = {
        "family": family,
        "max_length": max_length,
        "overflow": overflow,
        "media_limits": limits.as_dict(),
        "processor_files": processor_files_digest(release_path),
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


@dataclass
class MediaHasher:
    """Content digests of media entries; a file seen again (same path, size and mtime) within
    one job is not read again (a bounded cache, so memory stays flat)."""

    limits: MediaLimits
    cache_size: int = 4096
    _cache: OrderedDict[tuple[str, int, int], str] = field(default_factory=OrderedDict)

    def entry(self, entry: str, base_dir: Path | None) -> str:
        if entry.startswith("data:"):
            header, _, payload = entry.partition(",")
            declared = header.removeprefix("data:").split(";")[0].strip().lower()  # its MIME type is checked
            try:
                digest = hashlib.sha256(base64.b64decode(payload, validate=True)).hexdigest()
                # a declared type is checked against the field, so it shapes the outcome; none (or
                # application/octet-stream) is judged by content, like a file's bytes
                untyped = declared in ("", "application/octet-stream")
                return f"sha256:{digest}" if untyped else f"sha256:{digest}:type={declared}"
            except (binascii.Error, ValueError):
                return "undecodable:" + hashlib.sha256(entry.encode()).hexdigest()
        if entry.startswith(("http://", "https://")):
            return "url:" + entry
        path = Path(entry)
        if not path.is_absolute():
            if base_dir is None:
                return "unresolvable:" + entry
            path = base_dir / path
        return self._file(path)

    def _file(self, path: Path) -> str:
        try:
            info = os.stat(path)
        except FileNotFoundError:
            return f"missing:{path}"
        except (OSError, ValueError):  # ValueError: a NUL or a lone surrogate in the path
            return f"unreadable:{path!r}"
        if not stat.S_ISREG(info.st_mode):
            return f"unreadable:{path}"
        if info.st_size > self.limits.max_file_bytes:
            return f"oversize:{path}:{info.st_size}"
        cached = (str(path), info.st_size, info.st_mtime_ns)
        if cached in self._cache:
            self._cache.move_to_end(cached)
            return self._cache[cached]
        try:
            digest = "sha256:" + _sha256_file(path)
        except (OSError, ValueError):
            return f"unreadable:{path}"
        self._cache[cached] = digest
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return digest


def record_key(record: Record, prompt: str, media: MediaHasher) -> str:
    """The record's key (hex SHA-256, version `KEY_VERSION`); `prompt` is `prompt_digest(...)`."""
    body: dict[str, Any] = {
        "v": KEY_VERSION,
        "prompt": prompt,
        "state": render(record.state),
        "questions": [
            [
                question.id,
                question.type,
                render_instructions(question),
                [render_option(option_id, description) for option_id, description in question.options],
                list(question.criteria_order),
            ]
            for question in record.questions
        ],
        "media": {
            name: [media.entry(entry, record.base_dir) for entry in getattr(record, name)] for name in MEDIA_FIELDS
        },
    }
    return hashlib.sha256(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()
