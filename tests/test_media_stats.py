"""The store's stat cache of media files (store/media_stats.py): an unchanged file is keyed
without reading it again; a change the stat shows, a change within the racy window that it does
not show, and every change under --verify-media are keyed from the bytes."""

from __future__ import annotations

import io
import os
import shutil
import time
from pathlib import Path

import pytest

import clef_cli.store.record_key as record_key
from clef_cli.encoding.media_limits import MediaLimits
from clef_cli.store.key_index import KeyIndex
from clef_cli.store.media_stats import RACY_NS, MediaStats
from clef_cli.store.record_key import MediaHasher

from .support.helpers import MEDIA, write_jsonl
from .test_store import score, ticket

HOUR_NS = 3600 * 10**9


def age(path: Path, ns: int = HOUR_NS) -> None:
    """Date the file's mtime `ns` back, as a file untouched since an earlier night."""
    info = path.stat()
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns - ns))


def key(index: KeyIndex, path: Path, **stats: bool) -> tuple[str, MediaStats]:
    """One job's keying of `path` (a fresh hasher: nothing cached in memory), its entries written."""
    cache = MediaStats(index, **stats)
    hasher = MediaHasher(MediaLimits(), stats=cache)
    digest = hasher.entry(str(path), None)
    hasher.flush()
    return digest, cache


def png(color: tuple[int, int, int]) -> bytes:
    """A 32x32 PNG stored uncompressed: every color gives a valid image of the same size."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), color).save(buffer, format="PNG", compress_level=0)
    return buffer.getvalue()


def same_size_rewrite(path: Path, color: tuple[int, int, int] = (200, 10, 10)) -> None:
    """Another image of the same size, with the mtime the file had (a change within one tick)."""
    info = path.stat()
    content = png(color)
    assert len(content) == info.st_size
    path.write_bytes(content)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


@pytest.fixture
def index(tmp_path):
    opened = KeyIndex(tmp_path / "keys.sqlite")
    yield opened
    opened.close()


@pytest.fixture
def photo(tmp_path) -> Path:
    path = tmp_path / "photo.png"
    path.write_bytes(png((10, 200, 10)))
    return path


@pytest.fixture
def blind_ctime(monkeypatch):
    """A stat that shows nothing of a same-tick rewrite: ctime left out (a real one moves it)."""
    stamp = lambda info: (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, 0)  # noqa: E731
    monkeypatch.setattr(record_key, "stamp_of", stamp)


def test_an_unchanged_file_is_keyed_from_the_cache_without_reading_it(index, photo, monkeypatch):
    age(photo)
    first, cache = key(index, photo)
    assert (cache.hits, cache.misses) == (0, 1)
    monkeypatch.setattr(record_key, "file_sha256", lambda path: pytest.fail(f"{path} was read again"))
    again, cache = key(index, photo)
    assert again == first and (cache.hits, cache.misses) == (1, 0)


def test_a_change_the_stat_shows_is_hashed_again(index, photo):
    age(photo)
    first, _ = key(index, photo)
    shutil.copy(MEDIA / "image_b.png", photo)
    age(photo)
    changed, cache = key(index, photo)
    assert changed != first and cache.misses == 1


def test_a_same_size_change_in_the_racy_window_is_caught(index, photo, blind_ctime):
    first, cache = key(index, photo)  # the file was just written: its entry is racy
    same_size_rewrite(photo)
    changed, cache = key(index, photo)
    assert changed != first and cache.misses == 1
    again, cache = key(index, photo)  # cached afresh; still racy until RACY_NS has passed
    assert again == changed


def test_outside_the_racy_window_a_change_the_stat_cannot_show_needs_verify_media(index, photo, blind_ctime):
    age(photo, 2 * RACY_NS)
    first, _ = key(index, photo)
    same_size_rewrite(photo)
    trusted, cache = key(index, photo)
    assert trusted == first and cache.hits == 1  # what the rule allows: the stamp did not move
    verified, cache = key(index, photo, trusted=False)
    assert verified != first and cache.misses == 1
    assert key(index, photo)[0] == verified  # --verify-media recorded what it found


def test_a_same_size_same_mtime_rewrite_that_moved_the_ctime_is_hashed_again(index, photo):
    """Outside the racy window, a rewrite that keeps the size and puts the mtime back still moves
    the ctime (no call can set it): that alone must make the entry a miss."""
    age(photo, 2 * RACY_NS)
    first, _ = key(index, photo)
    before = photo.stat()
    time.sleep(0.05)  # past the kernel's coarse timestamp tick, so the ctime can move
    same_size_rewrite(photo)
    after = photo.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert after.st_ctime_ns != before.st_ctime_ns
    changed, cache = key(index, photo)
    assert changed != first and (cache.hits, cache.misses) == (0, 1)


def test_a_dry_run_reads_the_cache_and_writes_nothing(index, photo):
    age(photo)
    key(index, photo, writable=False)
    _, cache = key(index, photo)
    assert cache.misses == 1  # nothing was cached by the dry run


def test_verify_media_rescores_an_image_the_cache_trusted(tmp_path, blind_ctime):
    photo = tmp_path / "photo.png"
    photo.write_bytes(png((10, 200, 10)))
    age(photo, 2 * RACY_NS)
    inputs = write_jsonl(tmp_path / "in.jsonl", [ticket(0), {**ticket(1), "images": ["photo.png"]}])
    store = str(tmp_path / "store.ckpt")
    assert score(inputs, tmp_path / "a.parquet", "--checkpoint", store) == (2, 0, 0, 0)
    same_size_rewrite(photo)
    assert score(inputs, tmp_path / "b.parquet", "--checkpoint", store) == (0, 2, 0, 0)
    assert score(inputs, tmp_path / "c.parquet", "--checkpoint", store, "--verify-media") == (1, 1, 0, 0)


def test_an_object_entry_made_within_the_racy_window_of_its_last_modified_is_not_trusted(index):
    """A store dates objects to the second: an object written again within the second its entry
    was made keeps size and last-modified, so that entry is never trusted; one made `RACY_NS`
    or more after the object's last-modified is (the S3 tests set RACY_NS to 0, so only here)."""
    from clef_cli.store.media_stats import ObjectStats

    written = 1_700_000_000 * 10**9  # the object's last-modified, to the second
    stats = ObjectStats(index)
    stats.remember("s3://b/racy.png", 100, written, "", written + RACY_NS // 2, "digest of the racy entry")
    stats.remember("s3://b/edge.png", 100, written, "", written + RACY_NS, "digest of the entry at the edge")
    stats.remember("s3://b/old.png", 100, written, "", written + 2 * RACY_NS, "digest of the old entry")
    stats.flush()
    assert stats.digest("s3://b/racy.png", 100, written) is None
    assert stats.digest("s3://b/edge.png", 100, written) is None
    assert stats.digest("s3://b/old.png", 100, written) == "digest of the old entry"
    assert stats.digest("s3://b/old.png", 101, written) is None  # another size: another object
    assert (stats.hits, stats.misses) == (1, 3)


def test_a_file_entry_made_exactly_racy_ns_after_its_mtime_is_not_trusted(index):
    """The racy rule's edge for files, as for objects: an entry made `RACY_NS` after the file's
    mtime is rehashed; one made later is trusted."""
    stamp = (1, 2, 100, 1_700_000_000 * 10**9, 1_700_000_000 * 10**9)
    stats = MediaStats(index)
    stats.remember("/m/edge.png", stamp, stamp[3] + RACY_NS, "digest of the entry at the edge")
    stats.remember("/m/old.png", stamp, stamp[3] + RACY_NS + 1, "digest of the older entry")
    stats.flush()
    assert stats.digest("/m/edge.png", stamp) is None
    assert stats.digest("/m/old.png", stamp) == "digest of the older entry"
