"""Inputs given as URIs: resolved in one place (`clef_cli.inputs.sources`), the same from the command line
as from the library, locally and on Ray."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.errors import UsageError
from clef_cli.inputs.readers import read_records
from clef_cli.inputs.sources import expand_inputs
from clef_cli.locations.uris import is_uri, local_path

from .support.helpers import SAMPLE_DATA, TINY_MODEL, assert_same_rows, require_ray
from .test_struct_nulls import write_struct_parquet

runner = CliRunner()
COMMON = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--hidden-states", "drop", "--limit", "4"]


@pytest.fixture(scope="module")
def copied_sample(tmp_path_factory) -> Path:
    """The sample records with their media, in a folder whose name needs percent-encoding in a URI."""
    folder = tmp_path_factory.mktemp("uri") / "a folder"
    folder.mkdir()
    shutil.copytree(SAMPLE_DATA / "media", folder / "media")
    shutil.copy(SAMPLE_DATA / "records.jsonl", folder / "records.jsonl")
    shutil.copy(SAMPLE_DATA / "records.parquet", folder / "records.parquet")
    return folder


def local_forms(path: Path) -> list[str]:
    """Every spelling of a local file that pyarrow's local filesystem accepts."""
    quoted = quote(str(path))
    return [f"file://{quoted}", f"file:{quoted}", f"local://{quoted}", f"local:{quoted}"]


def test_local_uri_forms_name_the_same_file(copied_sample):
    path = copied_sample / "records.jsonl"
    plain = expand_inputs([path])
    assert len(plain) == 1 and plain[0].location == str(path.resolve())
    for form in local_forms(path):
        assert is_uri(form), form
        assert local_path(form) == path
        assert expand_inputs([form]) == plain, form
    # a folder URI stands for its Parquet parts, as a folder path does
    assert expand_inputs([f"file://{quote(str(copied_sample))}"]) == expand_inputs([copied_sample])


def test_uri_records_resolve_media_against_the_file_folder(copied_sample):
    uri = f"file://{quote(str(copied_sample / 'records.jsonl'))}"
    from_uri = list(read_records([uri]))
    assert from_uri == list(read_records([copied_sample / "records.jsonl"]))
    assert {record.base_dir for record in from_uri} == {copied_sample.resolve()}
    assert any(record.images for record in from_uri)


def test_plain_names_with_a_colon_stay_local_paths(tmp_path):
    assert not is_uri("notes:2024.jsonl") and not is_uri(Path("file:/x"))
    assert local_path("notes:2024.jsonl") == Path("notes:2024.jsonl")
    with pytest.raises(UsageError, match=r"^input not found: file:///nowhere/records.jsonl$"):
        expand_inputs(["file:///nowhere/records.jsonl"])
    with pytest.raises(UsageError, match=re.escape("cannot open file:///a b.jsonl")):
        expand_inputs(["file:///a b.jsonl"])  # an unencoded space is not a URI


def test_cli_scores_a_file_uri_like_the_path(copied_sample, tmp_path):
    by_path = runner.invoke(
        app, ["score", str(copied_sample / "records.jsonl"), "-o", str(tmp_path / "p.parquet"), *COMMON]
    )
    assert by_path.exit_code == 0, by_path.output
    uri = f"file://{quote(str(copied_sample / 'records.jsonl'))}"
    by_uri = runner.invoke(app, ["score", uri, "-o", str(tmp_path / "u.parquet"), *COMMON])
    assert by_uri.exit_code == 0, by_uri.output
    assert "4 scored, 0 failed of 4 records" in by_uri.stderr
    assert pq.read_table(tmp_path / "u.parquet").to_pylist() == pq.read_table(tmp_path / "p.parquet").to_pylist()
    spans = runner.invoke(
        app,
        [
            "inspect-spans",
            f"file:{quote(str(copied_sample / 'records.parquet'))}",
            "--model",
            str(TINY_MODEL),
            "--json",
        ],
    )
    assert spans.exit_code == 0, spans.output


@pytest.mark.slow
@pytest.mark.ray
def test_cli_ray_run_reads_file_uris_and_refuses_struct_nulls_the_same_way(copied_sample, tmp_path):
    """The real entry point (`python -m clef_cli`, `--ray` parsing included) in a fresh process, on a
    Parquet file of struct columns (refused records) and one with media paths relative to it."""
    require_ray()
    write_struct_parquet(copied_sample / "struct.parquet")
    names = ("struct.parquet", "records.parquet")
    options = [*COMMON[:-1], "8"]  # --limit 8: the 4 struct records, then 4 sample records
    local = runner.invoke(
        app, ["score", *(str(copied_sample / n) for n in names), "-o", str(tmp_path / "l.parquet"), *options]
    )
    assert local.exit_code == 3, local.output
    uris = [f"file://{quote(str(copied_sample / name))}" for name in names]
    command = [sys.executable, "-m", "clef_cli", "score", *uris, "-o", str(tmp_path / "r.parquet"), *options]
    command += ["--ray", "--ray-actors", "1", "--cpus-per-worker", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr[-3000:]
    ray_rows = pq.read_table(tmp_path / "r.parquet").to_pylist()
    local_rows = pq.read_table(tmp_path / "l.parquet").to_pylist()
    assert len(ray_rows) == 8
    assert_same_rows(ray_rows, local_rows)
    assert [row["id"] for row in ray_rows if row["error"]] == ["r1", "r2", "r3"]
    assert all("null in the Parquet struct column" in row["error"] for row in ray_rows if row["error"])
