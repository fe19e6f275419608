"""--media-root (issue 31): local media paths confined to the operator's folders, checked after
symlinks and `..` are resolved, and opened so that a symlink swapped in after the check cannot
lead outside. An escape is that record's error; without roots, paths stay unconfined."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.encoding.media import MediaLimits
from clef_cli.encoding.prompt import PromptEncoder
from clef_cli.errors import RecordError
from clef_cli.inputs.readers import read_records
from clef_cli.locations import fence as media_root
from clef_cli.locations.fence import open_confined
from clef_cli.locations.uris import LocationProblem
from clef_cli.store.record_key import MediaHasher

from .support.helpers import MEDIA, TINY_MODEL, write_jsonl

IMAGE = (MEDIA / "image_a.png").read_bytes()
NOUL = {"q": {"type": "noul", "instructions": "Is it a parcel?"}}


@pytest.fixture
def tree(tmp_path):
    """root/ (the media root) holding in.png, sub/in.png and links; secret/ beside it."""
    root, secret = tmp_path / "root", tmp_path / "secret"
    (root / "sub").mkdir(parents=True)
    secret.mkdir()
    for path in (root / "in.png", root / "sub" / "in.png", secret / "out.png"):
        path.write_bytes(IMAGE)
    (root / "to-secret.png").symlink_to(secret / "out.png")
    (root / "to-inside.png").symlink_to(root / "sub" / "in.png")
    (root / "secret-dir").symlink_to(secret, target_is_directory=True)
    return root, secret


def read(path: Path, root: Path, max_bytes: int = 1 << 20) -> bytes:
    with open_confined(path, (root,), max_bytes) as handle:
        return handle.read()


def test_paths_inside_the_root_open(tree):
    root, _ = tree
    assert read(root / "in.png", root) == IMAGE
    assert read(root / "sub" / ".." / "sub" / "in.png", root) == IMAGE
    assert read(root / "to-inside.png", root) == IMAGE  # a link that stays inside is fine


@pytest.mark.parametrize(
    "relative", ["../secret/out.png", "sub/../../secret/out.png", "to-secret.png", "secret-dir/out.png"]
)
def test_an_escape_by_dots_or_symlink_is_refused(tree, relative):
    root, secret = tree
    with pytest.raises(LocationProblem, match=r"is outside the media roots \(--media-root\)") as refused:
        read(root / relative, root)
    # the path as given, never where it resolved: a symlink's target is the host's, not the record's
    assert str(root / relative) in str(refused.value) and str(secret / "out.png") not in str(refused.value)


def test_not_found_fifo_and_oversize_are_refused(tree):
    root, _ = tree
    with pytest.raises(LocationProblem, match="file not found"):
        read(root / "nope.png", root)
    os.mkfifo(root / "pipe")
    with pytest.raises(LocationProblem, match="not a regular file"):  # and the open does not block
        read(root / "pipe", root)
    with pytest.raises(LocationProblem, match=f"file is {len(IMAGE)} bytes, over the limit of 100"):
        read(root / "in.png", root, max_bytes=100)
    assert read(root / "in.png", root, max_bytes=len(IMAGE)) == IMAGE  # the limit itself is allowed


def test_a_refusal_names_the_path_as_given_or_as_the_record_wrote_it(tree):
    """Without a name the message shows the path given (escaped); with one, only that name."""
    root, _ = tree
    with pytest.raises(LocationProblem) as refused:
        read(root / "nope.png", root)
    assert str(refused.value) == f"file not found: {root / 'nope.png'}"
    with pytest.raises(LocationProblem) as refused:
        open_confined(root / "nope.png", (root,), 100, name="nope.png")
    assert str(refused.value) == "file not found: nope.png"
    with pytest.raises(LocationProblem) as refused:  # a path no system call takes
        read(root / "a\x00b.png", root)
    assert str(refused.value) == f"not a usable path: {root}{os.sep}a\\x00b.png"
    too_long = root / ("x" * 300)  # the open's own failure, with its reason
    with pytest.raises(LocationProblem) as refused:
        open_confined(too_long, (root,), 100, name="long.png")
    reason = str(refused.value).removeprefix("cannot read long.png: ")
    assert reason and reason != str(refused.value)


def test_the_filesystem_root_as_media_root_allows_every_file(tree):
    root, _ = tree
    assert read(root / "in.png", Path(os.sep)) == IMAGE


def test_a_failed_open_neither_leaks_nor_closes_a_descriptor(tree, tmp_path):
    """A root that is gone, a file not found, a folder on the way that is a file: the process's
    open descriptors are the same after each refusal."""
    root, _ = tree
    gone = tmp_path / "gone"
    before = sorted(os.listdir("/proc/self/fd"))
    for path, where in ((gone / "a.png", gone), (root / "sub" / "nope.png", root), (root / "in.png" / "x", root)):
        with pytest.raises(LocationProblem):
            read(path, where)
        assert sorted(os.listdir("/proc/self/fd")) == before, path


@pytest.mark.parametrize("swapped", ["sub/in.png", "sub"])
def test_a_symlink_swapped_in_after_the_check_is_not_followed(tree, monkeypatch, swapped):
    """The race: the path is checked, then the file (or a folder on its way) becomes a link out."""
    root, secret = tree
    checked = media_root.confined_parts

    def check_then_swap(path, roots, *name):
        parts = checked(path, roots, *name)
        target = root / swapped
        shutil.rmtree(target) if target.is_dir() else target.unlink()
        target.symlink_to(secret / "out.png" if swapped.endswith(".png") else secret)
        if not swapped.endswith(".png"):
            (secret / "in.png").write_bytes(b"secret")
        return parts

    monkeypatch.setattr(media_root, "confined_parts", check_then_swap)
    with pytest.raises(LocationProblem, match="changed while it was opened"):
        read(root / "sub" / "in.png", root)


def test_an_escape_is_the_records_error_and_its_key_reads_nothing(processor, tree):
    root, _ = tree
    inputs = write_jsonl(
        root / "r.jsonl",
        [
            {"id": "in", "state": "s", "questions": NOUL, "images": ["sub/in.png"]},
            {"id": "out", "state": "s", "questions": NOUL, "images": ["../secret/out.png"]},
        ],
    )
    inside, outside = read_records([inputs])
    limits = MediaLimits(media_roots=(root,))
    encoder = PromptEncoder(processor, max_length=4096, limits=limits)
    unconfined = PromptEncoder(processor, max_length=4096)
    assert encoder.encode(inside).input_ids == unconfined.encode(inside).input_ids
    assert unconfined.encode(outside).input_ids  # by default paths are unconfined
    with pytest.raises(RecordError) as refused:
        encoder.encode(outside)
    assert refused.value.field == "images[0]" and "outside the media roots" in refused.value.message
    hasher = MediaHasher(limits)
    assert hasher.entry("sub/in.png", root) == MediaHasher(MediaLimits()).entry("sub/in.png", root)
    refused = "refused:../secret/out.png is outside the media roots (--media-root)"  # as written, not resolved
    assert hasher.entry("../secret/out.png", root) == refused


def test_score_with_a_media_root(tree, tmp_path):
    root, _ = tree
    records = [
        {"id": "in", "state": "inside", "questions": NOUL, "images": ["sub/in.png"]},
        {"id": "link", "state": "a link out", "questions": NOUL, "images": ["to-secret.png"]},
    ]
    inputs = write_jsonl(root / "r.jsonl", records)
    args = ["score", str(inputs), "-o", str(tmp_path / "o.parquet"), "-m", str(TINY_MODEL), "--workers", "0"]
    result = CliRunner().invoke(app, [*args, "--quiet", "--media-root", str(root)])
    assert result.exit_code == 3, result.output
    out = {row["id"]: row for row in pq.read_table(tmp_path / "o.parquet").to_pylist()}
    assert out["in"]["error"] is None
    assert out["link"]["error_kind"] == "media" and "outside the media roots" in out["link"]["error"]
    missing = CliRunner().invoke(app, [*args, "--media-root", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "nowhere" in missing.output


@pytest.fixture
def sibling(tmp_path):
    """media/ (the root) and media-private/ beside it: a name that starts with the root's."""
    root, private = tmp_path / "media", tmp_path / "media-private"
    root.mkdir()
    private.mkdir()
    (private / "x.png").write_bytes(b"private bytes")
    (root / "in.png").write_bytes(IMAGE)
    (root / "link.png").symlink_to(private / "x.png")
    (root / "private-dir").symlink_to(private, target_is_directory=True)
    return root, private


@pytest.mark.parametrize(
    "path", ["{root}/../media-private/x.png", "{private}/x.png", "{root}/link.png", "{root}/private-dir/x.png"]
)
def test_a_sibling_whose_name_starts_with_the_roots_is_outside(sibling, path):
    """`media-private` starts with `media`: a prefix test without the separator let it in (and
    the walk from the root then climbed `..` into it), by path and by symlink alike."""
    root, private = sibling
    with pytest.raises(LocationProblem, match=r"is outside the media roots \(--media-root\)") as refused:
        read(Path(path.format(root=root, private=private)), root)
    assert str(refused.value).startswith(path.format(root=root, private=private))  # as given, not as resolved
    with pytest.raises(LocationProblem, match="outside the media roots"):  # a root given with its trailing slash too
        read(Path(path.format(root=root, private=private)), Path(f"{root}{os.sep}"))
    assert read(root / "in.png", root) == IMAGE
