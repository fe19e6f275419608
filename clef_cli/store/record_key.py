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
  a local file's content (never its path), a data: URL's decoded bytes, a remote http(s) URL's
  bytes as this job fetched them (once: the job keeps them for its encoding workers, see
  `remote_spool`, so the key hashes exactly the bytes decoded and a file replaced under the same
  URL is scored again), an object in a store's bytes (`object_keys.py`: unchanged objects from
  the store's cache, no download). Without --allow-remote-media a URL is keyed by its text (`url:`). An
  entry that cannot be read is keyed by why (`missing:`, `unreadable:`, `oversize:` with the
  path; `refused:` with the reason, for an entry the fence refuses (`fence.place`: outside
  --media-root or the input's folder, a local file named by a record from an object store, a
  control character or credentials in it: decided from its text alone) or a URL the fetcher
  refuses; `unfetched:` a fetch
  that may work next time), so the record is tried again once the file exists. Bytes the
  record carries itself (a binary cell, a `datasets` `{bytes, path}` struct) are keyed as a
  file of those bytes is, `sha256:` of them, so a store made from files is reused by the same
  media given inline; pre-decoded samples by `samples:` and the SHA-256 of their float32 bytes.

The column mapping (`--columns`, `--state-columns`) is not hashed: it decides which columns
become the state, the questions and the media, and the key hashes those results, so a mapped
record is keyed by the prompt it makes, the same as a plain record making that prompt (a shape
is not a meaning: ARCHITECTURE.md).

- `special_tokens`: `"text"`, only for a record whose text (state, question ids, instructions,
  options) holds one of the release's added-token strings, read under `--special-tokens text`.
  Only such a record's prompt depends on the mode; every other record keeps the key it had before
  the mode existed (the reference's reading, `parse`), so stores made before it are still reused.
  A release without `tokenizer.json` keys the mode for every record (its added tokens are not
  listed where clef can read them without loading the tokenizer).

Never the id or the record's position. Nothing is decoded: hashing a file is cheap, decoding a
video is not. Remote media are fetched several at a time (`MediaHasher.prefetch`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_cli.encoding.media_limits import MediaLimits
from clef_cli.encoding.remote_objects import object_uris
from clef_cli.encoding.remote_spool import RemoteSpool
from clef_cli.encoding.render import render, render_instructions, render_option
from clef_cli.inputs.media_cells import MediaEntry
from clef_cli.inputs.records import MEDIA_FIELDS, Record
from clef_cli.locations.fence import MediaBase, Place, open_confined, place
from clef_cli.locations.remote_fetch import FetchError, fetch
from clef_cli.locations.uris import LocationProblem
from clef_cli.release import file_sha256
from clef_cli.store.media_stats import MediaStats, stamp_of
from clef_cli.store.object_keys import ObjectKeys

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


def processor_files_digest(release_path: Path) -> dict[str, str]:
    """Name -> SHA-256 of every release file the tokenizer and processor are built from."""
    names = {path.name for pattern in PROCESSOR_FILE_PATTERNS for path in release_path.glob(pattern) if path.is_file()}
    return {name: file_sha256(release_path / name) for name in sorted(names)}


@dataclass(frozen=True)
class PromptShape:
    """What shapes every record's prompt besides the record: the settings' digest, and under
    `--special-tokens text` the added-token strings whose presence in a record's text changes its
    prompt (None: not known, so every record's key holds the mode)."""

    digest: str
    literal_marks: frozenset[str] | None = frozenset()

    def as_metadata(self) -> str:
        """The output's `clef.key_prompt`: what `clef review` needs to recompute a record's key."""
        marks = None if self.literal_marks is None else sorted(self.literal_marks)
        return json.dumps({"digest": self.digest, "literal_marks": marks}, ensure_ascii=False)

    @classmethod
    def from_metadata(cls, text: str) -> PromptShape:
        found = json.loads(text)
        marks = found["literal_marks"]
        return cls(found["digest"], None if marks is None else frozenset(marks))

    def mode_shapes(self, texts: Iterable[str]) -> bool:
        """Whether reading these texts literally gives other ids than the reference's reading."""
        if self.literal_marks is None:
            return True
        return any(mark in text for text in texts for mark in self.literal_marks)


def added_token_strings(release_path: Path) -> frozenset[str] | None:
    """The contents of the release tokenizer's added tokens (special or not), from tokenizer.json."""
    try:
        spec = json.loads((release_path / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return frozenset(token["content"] for token in spec.get("added_tokens") or [] if token.get("content"))


def prompt_digest(
    release_path: Path, family: str, max_length: int, overflow: str, limits: MediaLimits, special_tokens: str
) -> PromptShape:
    """The digest of every setting that shapes a prompt besides the record itself."""
    body = {
        "family": family,
        "max_length": max_length,
        "overflow": overflow,
        "media_limits": limits.as_dict(),
        "processor_files": processor_files_digest(release_path),
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    if special_tokens == "parse":
        return PromptShape(digest)
    return PromptShape(digest, added_token_strings(release_path))


@dataclass
class MediaHasher:
    """Content digests of media entries; a file seen again (same path, size and mtime) or a URL
    seen again within one job is not read again (bounded caches, so memory stays flat). With the
    store's `stats` (media_stats.py), an unchanged local file is not read again on a later night."""

    limits: MediaLimits
    cache_size: int = 4096
    url_cache_size: int = 65536
    fetch_threads: int = 8
    stats: MediaStats | None = None
    _cache: OrderedDict[tuple[str, int, int], str] = field(default_factory=OrderedDict)
    _urls: OrderedDict[str, str] = field(default_factory=OrderedDict)
    _objects: ObjectKeys | None = None

    @property
    def objects(self) -> ObjectKeys:
        if self._objects is None:
            self._objects = ObjectKeys(self.limits, self.stats.objects if self.stats is not None else None)
        return self._objects

    def prefetch(self, records: Iterable[Record]) -> None:
        """Key the remote media of `records` ahead, `fetch_threads` fetches at a time (a fetch
        waits on the network, so keying a chunk of records need not wait on each in turn)."""
        records = list(records)
        self._prefetch_objects(records)
        if not self.limits.allow_remote:
            return
        entries = (entry for record in records for name in MEDIA_FIELDS for entry in getattr(record, name))
        remote = (entry for entry in entries if isinstance(entry, str) and entry.startswith(("http://", "https://")))
        urls = [url for url in dict.fromkeys(remote) if url not in self._urls]
        if not urls:
            return
        with ThreadPoolExecutor(min(self.fetch_threads, len(urls)), thread_name_prefix="clef-fetch") as pool:
            for url, keyed in zip(urls, pool.map(self._fetched, urls), strict=True):
                self._remember(self._urls, url, keyed, self.url_cache_size)

    def _prefetch_objects(self, records: list[Record]) -> None:
        """Objects in a store, keyed `fetch_threads` at a time (the same listing serves them all)."""
        uris = list(dict.fromkeys(uri for record in records for uri in object_uris(record, self.limits)))
        if len(uris) < 2:
            return
        with ThreadPoolExecutor(min(self.fetch_threads, len(uris)), thread_name_prefix="clef-objects") as pool:
            for _ in pool.map(self.objects.entry, uris):
                pass

    def _place(self, entry: str, base_dir: MediaBase) -> Place | str:
        """Where the entry leads (`fence.place`, the one fence decoding applies too), or the key
        part of a refused entry: why, decided from the text before any file or object is looked
        at, so the key says nothing of what exists."""
        try:
            return place(entry, base_dir, self.limits.roots)
        except LocationProblem as problem:
            return f"refused:{problem}"

    def _url(self, url: str) -> str:
        if not self.limits.allow_remote:
            return "url:" + url  # the record is refused anyway (remote media are off)
        if url in self._urls:
            self._urls.move_to_end(url)
            return self._urls[url]
        return self._remember(self._urls, url, self._fetched(url), self.url_cache_size)

    def _fetched(self, url: str) -> str:
        """The digest of the bytes `url` gives this job (spooled for its workers), or why not."""
        policy = self.limits.fetch_policy()
        try:
            if self.limits.remote_spool is not None:
                return "sha256:" + RemoteSpool(self.limits.remote_spool).digest(url, policy)
            return "sha256:" + hashlib.sha256(fetch(url, policy)).hexdigest()
        except FetchError as error:
            return f"unfetched:{url}" if error.transient else f"refused:{url}:{error}"

    def flush(self) -> None:
        """Write the stat cache's new entries (the ledger calls it once per chunk of records)."""
        if self.stats is not None:
            self.stats.flush()

    def _stored(self, path: Path, info: os.stat_result) -> str | None:
        return self.stats.digest(os.path.abspath(path), stamp_of(info)) if self.stats is not None else None

    def _store(self, path: Path, info: os.stat_result, before: int, digest: str) -> str:
        if self.stats is not None and digest.startswith("sha256:"):
            self.stats.remember(os.path.abspath(path), stamp_of(info), before, digest)
        return digest

    @staticmethod
    def _remember(cache: OrderedDict[Any, str], key: Any, value: str, size: int) -> str:
        cache[key] = value
        if len(cache) > size:
            cache.popitem(last=False)
        return value

    def entry(self, entry: MediaEntry, base_dir: MediaBase) -> str:
        if not isinstance(entry, str):  # the record's own bytes: keyed as a file of them is
            return entry.key
        where = self._place(entry, base_dir)
        if isinstance(where, str):
            return where
        if where.kind == "data":
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
        if where.kind == "url":
            return self._url(entry)
        if where.kind == "object":
            return self.objects.entry(str(where.location))
        path = Path(where.location)
        return self._confined(path, where.shown) if self.limits.media_roots else self._file(path)

    def _confined(self, path: Path, name: str) -> str:
        """A file under --media-root, read through the same confined open as its decoding."""
        before = time.time_ns()  # dates a stat cache entry: taken before the stat (media_stats.py)
        try:
            handle = open_confined(path, self.limits.media_roots, self.limits.max_file_bytes, name)
        except LocationProblem as error:
            return f"refused:{error}"
        with handle:
            info = os.fstat(handle.fileno())
            cached = (str(path), info.st_size, info.st_mtime_ns)
            if cached in self._cache:
                self._cache.move_to_end(cached)
                return self._cache[cached]
            if (stored := self._stored(path, info)) is not None:
                return self._remember(self._cache, cached, stored, self.cache_size)
            digest = hashlib.sha256()
            try:
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
            except OSError:
                return f"unreadable:{path}"
        keyed = self._store(path, info, before, "sha256:" + digest.hexdigest())
        return self._remember(self._cache, cached, keyed, self.cache_size)

    def _file(self, path: Path) -> str:
        before = time.time_ns()  # dates a stat cache entry: taken before the stat (media_stats.py)
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
        if (stored := self._stored(path, info)) is not None:
            return self._remember(self._cache, cached, stored, self.cache_size)
        try:
            digest = self._store(path, info, before, "sha256:" + file_sha256(path))
        except (OSError, ValueError):
            return f"unreadable:{path}"
        return self._remember(self._cache, cached, digest, self.cache_size)


def record_key(record: Record, prompt: PromptShape, media: MediaHasher) -> str:
    """The record's key (hex SHA-256, version `KEY_VERSION`); `prompt` is `prompt_digest(...)`."""
    state = render(record.state)
    questions = [
        [
            question.id,
            question.type,
            render_instructions(question),
            [render_option(option_id, description) for option_id, description in question.options],
            list(question.criteria_order),
        ]
        for question in record.questions
    ]
    body: dict[str, Any] = {
        "v": KEY_VERSION,
        "prompt": prompt.digest,
        "state": state,
        "questions": questions,
        "media": {
            name: [media.entry(entry, record.base_dir) for entry in getattr(record, name)] for name in MEDIA_FIELDS
        },
    }
    texts = [state, *(text for question in questions for text in _texts(question))]
    if prompt.mode_shapes(texts):
        body["special_tokens"] = "text"
    return hashlib.sha256(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


def _texts(value: Any) -> Iterable[str]:
    """Every string in a nested list (a question's keyed fields)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)
