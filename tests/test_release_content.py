"""A store knows its release by content (issue 36.1): the same bytes reached by another spelling,
from another folder, through a symlink or as a copy elsewhere reuse the store; changed weights are
refused; a store whose manifest names a relative path (made before) is still accepted."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from clef_cli.engines.local.pipeline import ScoreJob
from clef_cli.errors import ClefError
from clef_cli.store.manifest import MANIFEST, comparable, mismatch_hint

from .support.helpers import TINY_MODEL, settings_for

RECORDS = 4


def run(folder: Path, model: str, scorer, **options):
    settings = settings_for(folder, model=model, limit=RECORDS, hidden_states="drop", max_length=4096, **options)
    return ScoreJob(settings, scorer=scorer).run()


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict[str, Path]:
    """The tiny release as a copy on another 'disk' and as a symlink to that copy."""
    root = tmp_path_factory.mktemp("releases")
    copy = root / "disk2" / "models" / "rel"
    shutil.copytree(TINY_MODEL, copy)
    link = root / "link-to-rel"
    link.symlink_to(copy, target_is_directory=True)
    return {"root": root, "copy": copy, "link": link}


def test_every_spelling_of_the_same_release_reuses_the_store(tmp_path, releases, scorer, monkeypatch):
    first = run(tmp_path, str(releases["copy"]), scorer)
    assert first.forwarded == RECORDS
    stored = json.loads((tmp_path / "out.parquet.ckpt" / MANIFEST).read_text())
    assert stored["model"]["path"] == str(releases["copy"].resolve())
    elsewhere = releases["root"] / "disk2"
    monkeypatch.chdir(elsewhere)
    spellings = ["models/rel", "./models/../models/rel", str(releases["link"]), str(TINY_MODEL.resolve())]
    spellings.append(os.path.relpath(releases["copy"], elsewhere / "models" / "rel"))  # from inside the release
    for spelling in spellings[:-1]:
        again = run(tmp_path, spelling, scorer)
        assert (again.forwarded, again.reused) == (0, RECORDS), spelling
    monkeypatch.chdir(releases["copy"])
    again = run(tmp_path, spellings[-1], scorer)
    assert (again.forwarded, again.reused) == (0, RECORDS)


def test_changed_weights_are_refused_whatever_the_spelling(tmp_path, releases, scorer):
    changed = tmp_path / "changed"
    shutil.copytree(releases["copy"], changed)
    run(tmp_path, str(releases["copy"]), scorer)
    shard = next(path for path in changed.glob("*.safetensors") if not path.name.startswith("joint_head"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # one byte of one weight
    shard.write_bytes(bytes(data))
    with pytest.raises(ClefError, match="this run differs in weights:") as refused:
        run(tmp_path, str(changed), scorer)
    assert "model.id" not in str(refused.value) and str(releases["copy"].resolve()) in str(refused.value)


def test_a_store_that_names_a_relative_path_is_accepted_when_the_content_matches(tmp_path, scorer):
    run(tmp_path, str(TINY_MODEL), scorer)
    path = tmp_path / "out.parquet.ckpt" / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["model"]["id"] = "models/rel"  # as an older clef wrote it, from another folder
    del manifest["model"]["path"]
    path.write_text(json.dumps(manifest))
    again = run(tmp_path, str(TINY_MODEL), scorer)
    assert (again.forwarded, again.reused) == (0, RECORDS)


def test_the_engine_is_named_in_words_and_offered_before_restart():
    hf = {"model": {"id": "a", "weights": "w"}, "settings": {"dtype": "float32"}}
    vllm = {"model": {"id": "b", "weights": "w"}, "settings": {"dtype": "float32", "engine": "vllm"}}
    assert comparable(hf)["settings"]["engine"] == "hf"
    assert comparable(hf)["model"] == comparable(vllm)["model"]
    hint = mismatch_hint(vllm, hf)
    assert hint.index("--engine vllm") < hint.index("--restart")
    assert "--engine" not in mismatch_hint(hf, hf)
