"""Tables as people have them: CSV/TSV, gzip/zstd streams, Hive-partitioned folders, globs, stdin
and pipes each read as the same records as their plain JSONL twin (same record keys, so the same
probabilities), and the flat output layout holds the long layout's numbers in one row per record."""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.errors import UsageError
from clef_cli.inputs.readers import count_records, read_records
from clef_cli.inputs.records import InvalidRecord, Record
from clef_cli.inputs.sources import expand_inputs
from clef_cli.job.output import passthrough_types

from .support.helpers import SAMPLE_DATA, TINY_MODEL, require, write_jsonl

runner = CliRunner()
COMMON = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--hidden-states", "drop"]
SAMPLE_IDS = ("ticket-001", "ticket-003", "ticket-007")
QUOTED = {
    "id": "quoted",
    "state": 'He said "refund, please",\nthen left\t— ünïcødé 日本語, 🙂',
    "questions": {
        "how sure?": {"type": "noul"},
        "a.b": {"type": "choice", "criteria": {"x.y": "the first", "50%": 'the second, "quoted"'}},
    },
}
VARIANTS = ("csv", "tsv", "csv.gz", "jsonl.gz", "jsonl.zst", "hive", "glob")


def twin_records() -> list[dict]:
    sample = [json.loads(line) for line in (SAMPLE_DATA / "records.jsonl").read_text().splitlines()]
    return [record for record in sample if record["id"] in SAMPLE_IDS] + [QUOTED]


def renamed(records: list[dict], prefix: str) -> list[dict]:
    return [{**record, "id": f"{prefix}:{record['id']}"} for record in records]


def text_cell(value: object) -> str:
    """A cell as a spreadsheet holds it: text as it is, anything else as JSON text."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def delimited(records: list[dict], delimiter: str, listed: bool = False) -> str:
    """A CSV (or TSV) export; a media cell holds one path, or with `listed` a JSON list."""
    out = io.StringIO()
    writer = csv.writer(out, delimiter=delimiter, lineterminator="\r\n")
    writer.writerow(["id", "state", "questions", "images"])
    for record in records:
        images = record.get("images")
        cell = images[0] if images and not listed else text_cell(images)
        writer.writerow([record["id"], text_cell(record["state"]), text_cell(record["questions"]), cell])
    return out.getvalue()


def jsonl_bytes(records: list[dict]) -> bytes:
    return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records).encode()


def write_hive(folder: Path, records: list[dict]) -> None:
    """What pandas' `partition_cols` and Spark write: `lang=de/...parquet`, state as JSON text,
    media as absolute paths (a part's folder is not the twin's)."""
    table = pa.table(
        {
            "id": [record["id"] for record in records],
            "state": [text_cell(record["state"]) for record in records],
            "questions": [json.dumps(record["questions"]) for record in records],
            "images": [[str(folder.parent / p) for p in record.get("images", [])] for record in records],
            "lang": ["de" if i % 2 else "en" for i in range(len(records))],
        }
    )
    pq.write_to_dataset(table, folder, partition_cols=["lang"])


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The twin (`twin.jsonl`) and each variant of it, ids prefixed by the variant's name."""
    root = tmp_path_factory.mktemp("formats")
    shutil.copytree(SAMPLE_DATA / "media", root / "media")
    records = twin_records()
    write_jsonl(root / "twin.jsonl", records)
    (root / "t.csv").write_text(delimited(renamed(records, "csv"), ","), encoding="utf-8")
    (root / "t.tsv").write_text(delimited(renamed(records, "tsv"), "\t", listed=True), encoding="utf-8")
    (root / "t.csv.gz").write_bytes(gzip.compress(delimited(renamed(records, "csv.gz"), ",").encode()))
    (root / "t.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(renamed(records, "jsonl.gz"))))
    with pa.CompressedOutputStream(str(root / "t.jsonl.zst"), "zstd") as out:
        out.write(jsonl_bytes(renamed(records, "jsonl.zst")))
    write_hive(root / "hive", renamed(records, "hive"))
    globbed = renamed(records, "glob")
    write_jsonl(root / "part-2.jsonl", globbed[2:])
    write_jsonl(root / "part-1.jsonl", globbed[:2])
    return root


def inputs_of(root: Path) -> list[str]:
    names = ["t.csv", "t.tsv", "t.csv.gz", "t.jsonl.gz", "t.jsonl.zst", "hive"]
    return [str(root / "twin.jsonl"), *(str(root / name) for name in names), str(root / "part-*.jsonl")]


def without_id(record: Record | InvalidRecord) -> tuple:
    assert isinstance(record, Record), record
    assert record.base_dir is not None
    media = tuple(str((record.base_dir / path).resolve()) for path in record.images)  # hive parts: absolute
    return record.id.split(":", 1)[-1], record.state, record.questions, media


def test_each_format_reads_as_the_records_of_its_jsonl_twin(folder):
    want = sorted(without_id(record) for record in read_records([folder / "twin.jsonl"]))
    for name, location in zip(("twin", *VARIANTS), inputs_of(folder), strict=True):
        got = list(read_records([location]))
        assert sorted(without_id(record) for record in got) == want, name
        assert count_records([location]) == len(want), name
    quoted = next(r for r in read_records([folder / "t.csv"]) if r.id == "csv:quoted")
    assert quoted.state == QUOTED["state"]  # quotes, a newline, a tab, commas and unicode inside one cell


def test_hive_partition_keys_are_columns_and_parts_go_in_name_order(folder):
    parts = expand_inputs([folder / "hive"])
    assert [dict(part.partitions)["lang"] for part in parts] == ["de", "en"]
    assert passthrough_types([folder / "hive"], ["lang"], None).types == {"lang": pa.string()}
    globbed = expand_inputs([str(folder / "hive" / "lang=*" / "*.parquet")])
    assert [part.location for part in globbed] == [part.location for part in parts]
    assert [dict(part.partitions) for part in globbed] == [{"lang": "de"}, {"lang": "en"}]


@pytest.fixture(scope="module")
def scored(folder, tmp_path_factory) -> tuple[Path, Path]:
    """One job over the twin and every variant (one store): the output and the checkpoint."""
    out = tmp_path_factory.mktemp("scored")
    output, checkpoint = out / "all.parquet", out / "store.ckpt"
    done = runner.invoke(
        app, ["score", *inputs_of(folder), "-o", str(output), "--checkpoint", str(checkpoint), *COMMON]
    )
    assert done.exit_code == 0, done.output
    return output, checkpoint


def by_twin_id(rows: list[dict], prefix: str | None) -> dict[str, dict]:
    found = {}
    for row in rows:
        head, _, tail = row["id"].rpartition(":")
        if (head or None) == prefix:
            found[tail] = row
    return found


def test_each_format_scores_with_the_keys_and_probabilities_of_its_twin(scored):
    rows = pq.read_table(scored[0]).to_pylist()
    twin = by_twin_id(rows, None)
    assert len(twin) == 4 and all(row["error"] is None for row in twin.values())
    for variant in VARIANTS:
        got = by_twin_id(rows, variant)
        assert got.keys() == twin.keys(), variant
        for record_id, row in got.items():
            assert row["error"] is None, (variant, row["error"])
            assert row["record_key"] == twin[record_id]["record_key"], (variant, record_id)
            assert row["answers"] == twin[record_id]["answers"], (variant, record_id)


def test_stdin_scores_from_the_store_of_the_same_records_in_a_file(folder, scored, tmp_path, monkeypatch):
    """`clef score -`: stdin is spooled once, so keying, scoring and --keep-columns each read it."""
    monkeypatch.chdir(folder)  # relative media resolve against the working directory
    output = tmp_path / "stdin.parquet"
    command = ["score", "-", "-o", str(output), "--checkpoint", str(scored[1]), "--keep-columns", "state", *COMMON]
    done = runner.invoke(app, command, input=(folder / "twin.jsonl").read_bytes())
    assert done.exit_code == 0, done.output
    rows = {row["id"]: row for row in pq.read_table(output).to_pylist()}
    twin = by_twin_id(pq.read_table(scored[0]).to_pylist(), None)
    assert rows.keys() == twin.keys()
    for record_id, row in rows.items():
        assert (row["record_key"], row["answers"]) == (twin[record_id]["record_key"], twin[record_id]["answers"])
    assert rows["quoted"]["state"] == QUOTED["state"]
    dry = ["score", "-", "-o", str(tmp_path / "d.parquet"), "--dry-run", *COMMON]
    empty = runner.invoke(app, dry, input=b"")  # an empty stdin is an empty input: refused (issue 51.1)
    assert empty.exit_code == 2 and "no records in -" in empty.stderr, empty.output
    allowed = runner.invoke(app, [*dry, "--allow-empty"], input=b"")
    assert allowed.exit_code == 0 and "records: 0" in allowed.output, allowed.output


READ_BACK = """
import sys
from clef_cli.inputs.readers import count_records, read_records
print(count_records([sys.argv[1]]))
for record in read_records([sys.argv[1]]):
    print(repr(record))
"""


@pytest.mark.parametrize("form", ["-", "/dev/stdin", "pipe", "gzip"])
def test_stdin_and_pipes_read_once_as_the_file_does(folder, form):
    """A real pipe in a fresh process (`<(cat twin.jsonl)` through bash for the pipe): counted and
    then read, which a pipe allows once; the records equal the file's, media against the cwd. A
    gzip stream on stdin is told by its first bytes."""
    data = (folder / "twin.jsonl").read_bytes()
    if form == "gzip":
        form, data = "-", gzip.compress(data)
    if form == "pipe":
        script = f'"{sys.executable}" -c "$0" <(cat twin.jsonl)'
        done = subprocess.run(["bash", "-c", script, READ_BACK], cwd=folder, capture_output=True, timeout=120)
    else:
        command = [sys.executable, "-c", READ_BACK, form]
        done = subprocess.run(command, cwd=folder, input=data, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    count, *records = done.stdout.decode().splitlines()
    want = list(read_records([folder / "twin.jsonl"]))
    assert int(count) == len(want)
    assert records == [repr(record) for record in want]


def test_integral_float_ids_are_the_integers_they_spell(tmp_path):
    import pandas as pd

    frame = pd.DataFrame({"id": [10, None, 30], "state": ["a", "b", "c"]})
    assert str(frame["id"].dtype) == "float64"  # what pandas makes of an id column with a gap
    frame["questions"] = json.dumps({"q": {"type": "noul"}})
    frame.to_parquet(tmp_path / "p.parquet")
    assert [record.id for record in read_records([tmp_path / "p.parquet"])] == ["10", "1", "30"]
    write_jsonl(tmp_path / "f.jsonl", [{"id": 2.0, "state": "s"}, {"id": 2.5, "state": "s"}])
    two, half = read_records([tmp_path / "f.jsonl"], questions={"q": {"type": "noul"}})
    assert isinstance(two, Record) and two.id == "2"
    assert isinstance(half, InvalidRecord) and half.error.startswith("record at index 1, field 'id': an id must be")


def test_one_media_string_is_a_list_of_one(tmp_path):
    base = {"state": "s", "questions": {"q": {"type": "noul"}}}
    records = [{"id": "a", **base, "images": "x.png"}, {"id": "b", **base, "images": ["x.png"]}]
    write_jsonl(tmp_path / "m.jsonl", records)
    one, listed = read_records([tmp_path / "m.jsonl"])
    assert one.images == listed.images == ("x.png",)


def test_what_cannot_be_read_is_refused_with_what_can(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("x")
    cases = {
        tmp_path / "notes.txt": "unsupported input type (use .jsonl, .ndjson, .json, .parquet, .pq, .csv or .tsv, "
        "the text ones also as .gz or .zst)",
        tmp_path / "empty": "holds no part clef reads (.parquet, .pq, .jsonl, .ndjson, .csv or .tsv, the text ones "
        "also as .gz or .zst)",
        tmp_path / "none-*.jsonl": "no input file matches",
    }
    for location, message in cases.items():
        with pytest.raises(UsageError, match=re.escape(message)):
            expand_inputs([location])
    for name in ("p.ndjson", "p.jsonl.gz", "p.tsv"):  # every kind the refusal names is a folder's part
        (tmp_path / name.replace(".", "-")).mkdir()
        (tmp_path / name.replace(".", "-") / name).write_bytes(b"")
        folder = tmp_path / name.replace(".", "-")
        assert [part.name for part in expand_inputs([folder])] == [f"{folder}/{name}"]  # a part: its path as given
    write_jsonl(tmp_path / "empty" / "r.jsonl", [{"id": "a", "state": "s"}])
    write_jsonl(tmp_path / "empty" / "questions.json", [{"id": "b", "state": "s"}])  # a folder's parts are JSONL
    assert [part.name for part in expand_inputs([tmp_path / "empty"])] == [f"{tmp_path}/empty/r.jsonl"]


def test_a_bad_csv_cell_is_its_rows_error_and_a_broken_row_refuses_the_file(tmp_path):
    (tmp_path / "b.csv").write_text('id,state,images\na,hi,"[not json"\nb,hi,\n', encoding="utf-8")
    bad, fine = read_records([tmp_path / "b.csv"], questions={"q": {"type": "noul"}})
    assert isinstance(bad, InvalidRecord)
    assert bad.error == "record 'a', field 'images': a cell starting with [ must be a JSON list of paths"
    assert isinstance(fine, Record) and fine.images == ()
    (tmp_path / "c.csv").write_text("id,state\na,hi\nb,hi,extra\n", encoding="utf-8")
    with pytest.raises(UsageError) as refused:  # clef's own words; pyarrow's reason after them varies by release
        list(read_records([tmp_path / "c.csv"]))
    assert "c.csv is not a readable CSV file: " in str(refused.value) and "\n" not in str(refused.value)


def flat_output(folder: Path, scored: tuple[Path, Path], tmp_path: Path, layout: str) -> Path:
    """The twin and an invalid record, in `layout`, from the shared store (the model runs nothing)."""
    write_jsonl(tmp_path / "bad.jsonl", [{"id": "bad", "questions": {"q": {"type": "noul"}}}])
    output = tmp_path / f"{layout}.parquet"
    inputs = [str(folder / "twin.jsonl"), str(tmp_path / "bad.jsonl")]
    command = ["score", *inputs, "-o", str(output), "--checkpoint", str(scored[1]), "--layout", layout, *COMMON]
    done = runner.invoke(app, command)
    assert done.exit_code == 3, done.output  # the invalid record: some records failed
    return output


def test_flat_layout_holds_the_long_layouts_numbers_in_a_row_per_record(folder, scored, tmp_path):
    from clef_cli.results import flat_part

    flat = pq.read_table(flat_output(folder, scored, tmp_path, "flat"))
    long_rows = pq.read_table(flat_output(folder, scored, tmp_path, "long")).to_pylist()
    wide = by_twin_id(pq.read_table(scored[0]).to_pylist(), None)
    rows = {row["id"]: row for row in flat.to_pylist()}
    assert list(rows) == [*(r["id"] for r in twin_records()), "bad"]
    assert rows["bad"]["error"] and all(v is None for k, v in rows["bad"].items() if k not in ("id", "error"))
    probabilities = 0
    for row in long_rows:
        if row["error"] is None:
            column = f"{flat_part(row['question_id'])}.p.{flat_part(row['label'])}"
            assert rows[row["id"]][column] == row["probability"], column
            probabilities += 1
    assert probabilities == sum(isinstance(v, float) and ".p." in k for r in rows.values() for k, v in r.items())
    for record_id, row in wide.items():
        for answer in row["answers"]:
            stem = flat_part(answer["question_id"])
            assert rows[record_id][f"{stem}.answer"] == answer["answer"]
            assert rows[record_id][f"{stem}.confidence"] == answer["confidence"]
    names = set(flat.schema.names)
    assert {"how%20sure%3F.answer", "a%2Eb.p.x%2Ey", "a%2Eb.p.50%25"} <= names
    mapping = {entry["column"]: entry for entry in json.loads(flat.schema.metadata[b"clef.flat_columns"])}
    assert mapping["a%2Eb.p.50%25"] == {
        "column": "a%2Eb.p.50%25", "question_id": "a.b", "field": "p", "option": "50%", "type": "choice"
    }  # fmt: skip
    assert set(mapping) == names - {"id", "error"}
    pd = require("pandas")  # a test dependency through `datasets`
    frame = pd.read_parquet(tmp_path / "flat.parquet")
    assert frame.loc[frame["id"] == "quoted", "a%2Eb.p.x%2Ey"].iloc[0] == rows["quoted"]["a%2Eb.p.x%2Ey"]
    assert not any(frame[column].map(lambda v: isinstance(v, (list, dict))).any() for column in frame.columns)
    assert not list(tmp_path.glob(".flat.parquet.*"))  # the spool of the results is gone


def test_ray_slices_read_each_format_as_the_local_reader_does(folder):
    """What a `--ray` task reads (engines/ray/reading.py): CSV and compressed streams whole, Parquet
    parts by row group with their partition keys, stdin's spool with the working directory."""
    import pickle

    from clef_cli.engines.ray.reading import _slice, read_slice
    from clef_cli.inputs.records import RecordBuilder

    for location in ("t.csv", "t.tsv", "t.jsonl.gz", "t.jsonl.zst", "hive"):
        builder, got, index = RecordBuilder(), [], 0
        for source in expand_inputs([folder / location]):
            kind = "parquet" if source.is_parquet else "json"
            for row in read_slice(vars(_slice(source, kind, 0, 0, index)), b"", None):
                raw = pickle.loads(row["payload"])
                base = Path(row["base_dir"])
                got.append(builder.build(raw, row["record_index"], base, row["cells"]))
                index += 1
        assert got == list(read_records([folder / location])), location
    hive_rows = read_slice(vars(_slice(expand_inputs([folder / "hive"])[0], "parquet", 0, 0, 0)), b"", None)
    assert {pickle.loads(row["payload"])["lang"] for row in hive_rows} == {"de"}


@pytest.mark.slow
def test_a_cron_line_scores_a_gzipped_stream_on_stdin(folder, scored, tmp_path):
    """`zcat night.jsonl.gz | clef score - -o out.parquet`, the real entry point in a fresh process:
    the store of the same records from a file has every result (nothing runs)."""
    (folder / "night.jsonl.gz").write_bytes(gzip.compress((folder / "twin.jsonl").read_bytes()))
    output = tmp_path / "out.parquet"
    clef = f'"{sys.executable}" -m clef_cli score - -o "{output}" --checkpoint "{scored[1]}"'
    line = f"zcat night.jsonl.gz | {clef} " + " ".join(f'"{part}"' for part in COMMON)
    done = subprocess.run(["bash", "-c", line], cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "0 run through the model, 4 from the checkpoint" in done.stderr, done.stderr
    twin = by_twin_id(pq.read_table(scored[0]).to_pylist(), None)
    rows = pq.read_table(output).to_pylist()
    assert [(row["id"], row["record_key"]) for row in rows] == [(i, twin[i]["record_key"]) for i in twin]


def test_a_flat_layout_past_what_people_read_is_refused():
    from clef_cli.results import FLAT_MAX_COLUMNS, FlatColumns

    columns = FlatColumns({f"q{i}": {} for i in range(FLAT_MAX_COLUMNS // 2)})
    assert len(columns.schema()) == FLAT_MAX_COLUMNS + 2
    columns.options["one more"] = {}
    with pytest.raises(UsageError, match="write --layout wide or long"):
        columns.schema()


def test_a_compressed_input_is_fingerprinted_as_it_is_stored(folder):
    import hashlib

    from clef_cli.inputs.sources import input_fingerprint

    (source,) = expand_inputs([folder / "t.jsonl.gz"])
    stored = (folder / "t.jsonl.gz").read_bytes()
    assert input_fingerprint(source) == {
        "path": str(folder / "t.jsonl.gz"),
        "bytes": len(stored),
        "sha256": hashlib.sha256(stored).hexdigest(),
    }


def test_every_csv_cell_is_read_as_its_text_never_a_guessed_type(tmp_path):
    """pyarrow would guess each column's type from its cells (`007` -> 7, `true` -> True, `NaN`
    -> nan, `1e3` -> 1000.0); an id or a state is the text the file holds, as in JSONL."""
    rows = [("007", "0012"), ("1e3", "true"), ("12", "NaN"), ("-0", "null")]
    lines = ["id,state"] + [f"{record_id},{state}" for record_id, state in rows]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    read = list(read_records([tmp_path / "t.csv"], questions={"q": {"type": "noul"}}))
    assert [(record.id, record.state) for record in read] == rows


def test_two_pipes_of_one_job_are_spooled_apart(tmp_path):
    """`clef score <(zcat a.gz) <(zcat b.gz)`: each pipe gets a spool of its own, so the second
    never overwrites the first's records (in a fresh process, with real pipes through bash)."""
    noul = {"q": {"type": "noul"}}
    write_jsonl(tmp_path / "a.jsonl", [{"id": "a1", "state": "s", "questions": noul}, {"id": "a2", "state": "t"}])
    write_jsonl(tmp_path / "b.jsonl", [{"id": "b1", "state": "u", "questions": noul}])
    code = (
        "import sys\nfrom clef_cli.inputs.readers import read_records\n"
        "print(' '.join(r.id for r in read_records(sys.argv[1:], questions={'q': {'type': 'noul'}})))"
    )
    script = f'"{sys.executable}" -c "$0" <(cat a.jsonl) <(cat b.jsonl)'
    done = subprocess.run(["bash", "-c", script, code], cwd=tmp_path, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().split() == ["a1", "a2", "b1"]


def test_a_null_hive_partition_is_null_not_its_folder_names_text(tmp_path):
    """pyarrow (as Hive and Spark) writes a null partition key as `lang=__HIVE_DEFAULT_PARTITION__`;
    that part's key is null, as pyarrow's own dataset reads it."""
    import pyarrow.dataset as ds

    table = pa.table({"id": ["a", "b"], "state": ["s", "t"], "lang": [None, "en"]})
    pq.write_to_dataset(table, tmp_path / "hive", partition_cols=["lang"])
    parts = expand_inputs([tmp_path / "hive"])
    got = sorted((dict(part.partitions)["lang"] or "") for part in parts)
    dataset = ds.dataset(tmp_path / "hive", partitioning="hive").to_table()
    assert got == sorted(value or "" for value in dataset.column("lang").to_pylist()) == ["", "en"]
    assert [dict(part.partitions)["lang"] for part in parts].count(None) == 1


def test_a_csv_past_one_read_block_keeps_its_quoted_newlines_big_cells_and_row_numbers(tmp_path):
    """pyarrow reads a CSV a block (4 MiB under a 1 MiB --max-record-bytes) at a time: quoted
    newlines where blocks end and a 2 MiB cell read as in a small file; a broken row in a later
    block is refused naming the last row read before it (it once named the first row of the
    broken row's block as the broken one)."""
    from clef_cli.inputs.record_size import ReadLimits

    limits = ReadLimits(record_bytes=1 << 20)
    filler = "x" * 90 + "\n" + "z" * 5  # every row's state spans two lines, so some block ends inside one
    rows = [f'r{n},"{filler}"' for n in range(50_000)]  # about 4.8 MiB
    rows[100] = f"big,{'y' * (2 << 20)}"
    (tmp_path / "t.csv").write_text("id,state\n" + "\n".join(rows) + "\n", encoding="utf-8")
    read = {
        record.id: record.state
        for record in read_records([tmp_path / "t.csv"], questions={"q": {"type": "noul"}}, limits=limits)
    }
    assert len(read) == 50_000 and read.pop("big") == "y" * (2 << 20)
    assert set(read.values()) == {filler}
    rows[48_000] = "broken,row,with,more,cells"  # in the second block
    (tmp_path / "b.csv").write_text("id,state\n" + "\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(UsageError) as refused:
        list(read_records([tmp_path / "b.csv"], questions={"q": {"type": "noul"}}, limits=limits))
    found = re.match(rf"{re.escape(str(tmp_path / 'b.csv'))}: cannot read past data row (\d+): ", str(refused.value))
    assert found is not None and 1 < int(found.group(1)) < 48_001, str(refused.value)  # where reading stopped, truly


def test_each_csv_media_cell_is_read_whatever_the_cells_before_it(tmp_path):
    """A row's media cells are read one by one: an empty or plain `images` cell never leaves the
    `audio` cell after it unread (a plain path, or a JSON list of paths)."""
    listed = '"[""b.wav"", ""c.wav""]"'
    lines = ["id,state,images,audio", "a,s,,clip.wav", f"b,s,a.png,{listed}", f"c,s,,{listed}"]
    (tmp_path / "m.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    a, b, c = read_records([tmp_path / "m.csv"], questions={"q": {"type": "noul"}})
    assert (a.images, a.audio) == ((), ("clip.wav",))
    assert (b.images, b.audio) == (("a.png",), ("b.wav", "c.wav"))
    assert (c.images, c.audio) == ((), ("b.wav", "c.wav"))
