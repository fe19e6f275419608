"""Folders walked once: a symbolic link loop or a second link to one folder (or file) is refused,
never read twice (issue 50: a loop in a Hive folder read one record 41 times, exit 0); a folder
reached once through a link is read; a part that is a link resolves its relative media against
the folder of the link, not its target's (docs/records.md, "Folders and globs")."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.errors import UsageError
from clef_cli.inputs.readers import read_records
from clef_cli.inputs.records import Record
from clef_cli.inputs.sources import expand_inputs

from .support.helpers import TINY_MODEL

RECORD = {"state": "s", "questions": {"q": {"type": "noul"}}}


def part(folder: Path, name: str, **fields: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps({**RECORD, **fields}) + "\n")
    return folder / name


def test_a_symlink_loop_in_a_hive_folder_is_refused_in_one_line(tmp_path):
    part(tmp_path / "hive" / "lang=en", "part.jsonl", id="a")
    os.symlink("..", tmp_path / "hive" / "lang=en" / "lang=fr")  # lang=en/lang=fr is hive/ again
    with pytest.raises(UsageError) as refused:
        expand_inputs([tmp_path / "hive"])
    assert "lang=fr" in str(refused.value) and "symbolic link" in str(refused.value)
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(app, ["score", str(tmp_path / "hive"), "-o", str(out), "--model", str(TINY_MODEL),
                                      "--dry-run"])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "lang=fr" in result.stderr
    assert not out.exists()


def test_a_self_loop_and_a_second_link_to_one_folder_are_refused(tmp_path):
    part(tmp_path / "self" / "a=1", "part.jsonl", id="a")
    os.symlink(".", tmp_path / "self" / "a=1" / "b=2")
    part(tmp_path / "twice" / "a=1", "part.jsonl", id="a")
    os.symlink("a=1", tmp_path / "twice" / "a=2")  # the same records under two partition values
    for folder in ("self", "twice"):
        with pytest.raises(UsageError, match="symbolic link"):
            expand_inputs([tmp_path / folder])


def test_a_folder_reached_once_through_a_link_is_read_once(tmp_path):
    part(tmp_path / "elsewhere" / "de", "part.jsonl", id="de")
    part(tmp_path / "hive" / "lang=en", "part.jsonl", id="en")
    os.symlink(tmp_path / "elsewhere" / "de", tmp_path / "hive" / "lang=de")
    os.symlink(tmp_path / "hive", tmp_path / "linked")  # the folder given is itself a link
    for given in ("hive", "linked"):
        files = expand_inputs([tmp_path / given])
        assert [file.partitions for file in files] == [(("lang", "de"),), (("lang", "en"),)]
        assert [record.id for record in read_records([tmp_path / given])] == ["de", "en"]


def test_a_glob_that_matches_one_file_twice_is_refused(tmp_path):
    part(tmp_path / "g" / "x=1", "part.jsonl", id="a")
    os.symlink("x=1", tmp_path / "g" / "x=2")
    with pytest.raises(UsageError, match="twice"):
        expand_inputs([str(tmp_path / "g" / "*" / "part.jsonl")])


@pytest.mark.parametrize("given", ["folder", "file", "glob"])
def test_a_linked_part_resolves_its_media_against_the_folder_of_the_link(tmp_path, given):
    target = part(tmp_path / "exports", "part.jsonl", id="a", images=["media/photo.png"])
    (tmp_path / "exports" / "media").mkdir()
    (tmp_path / "exports" / "media" / "photo.png").write_bytes(b"the target's photo")
    linked = tmp_path / "hive" / "day=1"
    (linked / "media").mkdir(parents=True)
    (linked / "media" / "photo.png").write_bytes(b"the link's photo")
    os.symlink(target, linked / "part.jsonl")
    inputs = {
        "folder": tmp_path / "hive",
        "file": linked / "part.jsonl",
        "glob": str(tmp_path / "hive" / "*" / "*.jsonl"),
    }
    [record] = read_records([inputs[given]])
    assert isinstance(record, Record) and record.base_dir == linked
    assert (record.base_dir / record.images[0]).read_bytes() == b"the link's photo"
    [file] = expand_inputs([inputs[given]])
    assert file.location == str(target.resolve())  # one file, one name, however it is reached
