"""Where a store in a bucket keeps what, and where its local cache folder lies.

Under the store's prefix (`s3://bucket/prefix/`)::

    manifests/NNNNNNNNNN.json   the chain: manifest N+1 is written only where none is (If-None-Match)
    latest.json                 a hint: the number of a recent manifest (the listing finds later ones)
    segments/ID.keys            a segment's sorted binary keys and its parts (an Arrow file)
    segments/HASH.results       its parts' results files, one after another
    segments/HASH.hidden        its parts' hidden-state files, one after another (read by range)
    runs/RUN.keys               the keys a finished run used (what `prune --keep-runs` keeps)

Every object but the manifests' hint is named by its content (a hash of its bytes or of their
checksums) and never changed; a manifest names the segments that count.

The cache folder is a local checkpoint (journal, shards, key index) under `$CLEF_CACHE_DIR`, else
`$XDG_CACHE_HOME/clef`, else `~/.cache/clef` (`--cache-dir` replaces that root), in a folder named
after the store's URI; a second job on the same machine takes the next free one (`-2`, `-3`).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from clef_cli.errors import UsageError
from clef_cli.locations.uris import LocationProblem, is_object_uri, normalized

MANIFESTS = "manifests/"
SEGMENTS = "segments/"
RUNS = "runs/"
LATEST = "latest.json"
FOLDERS = (MANIFESTS, SEGMENTS, RUNS)
PROBE = ".clef-probe-"
"""A job's write probe (`store.probe_store`): put and deleted at once, left only where a delete was refused."""
OWN_NAME = re.compile(
    rf"{MANIFESTS}\d{{10}}\.json|{SEGMENTS}[0-9a-f]{{32}}\.(keys|results|hidden)|{RUNS}[0-9a-f]+\.keys|{re.escape(LATEST)}"
    rf"|{re.escape(PROBE)}[0-9a-f]{{12}}"
)
"""The names a store writes under its prefix; anything else there means the prefix is something else's."""


def own_name(name: str) -> bool:
    """Whether `name` (relative to the store's prefix) is one a store writes."""
    return OWN_NAME.fullmatch(name) is not None


def manifest_name(seq: int) -> str:
    return f"{MANIFESTS}{seq:010d}.json"


def manifest_seq(name: str) -> int | None:
    """The number of a manifest's name (relative to the prefix); None for another object."""
    match = re.fullmatch(re.escape(MANIFESTS) + r"(\d{10})\.json", name)
    return int(match.group(1)) if match else None


def store_uri(text: str, option: str = "--checkpoint") -> str:
    """`text` as a store's normalised folder URI (`s3://bucket/prefix/`), or a usage error."""
    try:
        uri = normalized(text, folder=True)
    except LocationProblem as problem:
        raise UsageError(f"{option} {text!r}: {problem}") from None
    if not is_object_uri(uri):
        raise UsageError(f"{option} {text}: not a store in a bucket (s3://bucket/prefix/) nor a local folder")
    return uri


def cache_root(cache_dir: Path | None = None) -> Path:
    """The folder of every store's cache on this machine."""
    if cache_dir is not None:
        return Path(cache_dir)
    if os.environ.get("CLEF_CACHE_DIR"):
        return Path(os.environ["CLEF_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "clef"
    return Path.home() / ".cache" / "clef"


def cache_folder(uri: str, cache_dir: Path | None = None, slot: int = 1) -> Path:
    """The cache folder of the store at `uri`: readable (bucket and prefix) and unique (a hash)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", uri.split("://", 1)[1]).strip("-")[:80]
    digest = hashlib.sha256(uri.encode("utf-8")).hexdigest()[:12]
    suffix = "" if slot == 1 else f"-{slot}"
    return cache_root(cache_dir) / "stores" / f"{readable}-{digest}{suffix}"
