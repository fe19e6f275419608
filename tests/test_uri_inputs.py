"""Inputs given as URIs: resolved in one place (`clef_cli.sources`), the same from the command line
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
from clef_cli.records import read_records
from clef_cli.sources import expand_inputs, is_uri, local_path

from .conftest import SAMPLE_DATA, TINY_MODEL, require_ray

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
def test_cli_ray_run_reads_a_file_uri(copied_sample, tmp_path):
    """The real entry point (`python -m clef_cli`, `--ray` parsing included) in a fresh process."""
    require_ray()
    local = runner.invoke(
        app, ["score", str(copied_sample / "records.parquet"), "-o", str(tmp_path / "l.parquet"), *COMMON]
    )
    assert local.exit_code == 0, local.output
    uri = f"file://{quote(str(copied_sample / 'records.parquet'))}"
    command = [sys.executable, "-m", "clef_cli", "score", uri, "-o", str(tmp_path / "r.parquet"), *COMMON]
    command += ["--ray", "--num-workers", "1", "--cpus-per-worker", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ray_rows = pq.read_table(tmp_path / "r.parquet").to_pylist()
    local_rows = pq.read_table(tmp_path / "l.parquet").to_pylist()
    assert [row["id"] for row in ray_rows] == [row["id"] for row in local_rows] and len(ray_rows) == 4
    for got, want in zip(ray_rows, local_rows, strict=True):
        assert got["error"] is None and got["prompt_tokens"] == want["prompt_tokens"]
        for a, b in zip(got["answers"], want["answers"], strict=True):
            assert a["answer"] == b["answer"]
            assert [x["probability"] for x in a["labels"]] == pytest.approx(
                [y["probability"] for y in b["labels"]], abs=1e-6
            )
