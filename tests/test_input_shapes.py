"""One reading for every shape (issue 51): the same records through every input shape (JSONL,
JSON, Parquet, CSV, TSV, gzip, stdin, a folder, Hive parts, a glob, a `datasets` table), with the
record's own column names or others mapped with --columns, and every form a media cell takes (a
path, a list, binary, `{bytes, path}`, `datasets` Image/Audio) give the same record keys and so
the same probabilities. The records are scored once, into a store every case shares: a case whose
prompts equal the plain records' runs nothing (`clef.records_run` 0) and gets their results."""

from __future__ import annotations

import csv
import gzip
import io
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.errors import UsageError
from clef_cli.inputs.columns import parse_columns
from clef_cli.inputs.readers import read_records
from clef_cli.inputs.records import InvalidRecord, Record

from .support.helpers import MEDIA, TINY_MODEL, require, write_jsonl

runner = CliRunner()
QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Is this urgent?"},
    "team": {"type": "choice", "criteria": {"billing": "Payments", "tech": None}},
}
PLAIN = {"id": "id", "state": "state", "questions": "questions", "images": "images", "audio": "audio"}
MAPPED = {"id": "ticket", "state": "body", "questions": "schema", "images": "attachments", "audio": "clip"}
COLUMNS = ",".join(f"{field}={column}" for field, column in MAPPED.items())
COMMON = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--hidden-states", "drop"]


def base_records(media: Path) -> list[dict]:
    """The records, the one without media first (a first record that lacks the optional keys)."""
    image_a, image_b, tone = (str(media / name) for name in ("image_a.png", "image_b.png", "tone_16k_mono.wav"))
    return [
        {"id": "b", "state": {"text": "app is down", "n": 2}, "questions": QUESTIONS},
        {"id": "a", "state": "refund please", "questions": QUESTIONS, "images": [image_a], "audio": [tone]},
        {"id": "c", "state": "two pictures", "questions": QUESTIONS, "images": [image_a, image_b]},
    ]


# ----------------------------------------------------------------------------- media cell forms


def media_cell(entries: list[str] | None, form: str, single: bool) -> object:
    """A media field's cell in one form (`single`: a column of one entry a cell, as audio here)."""
    if not entries:
        return None
    if form == "path":
        return entries[0] if len(entries) == 1 else entries
    if form == "list":
        return entries
    inline = [Path(entry).read_bytes() for entry in entries]
    if form == "binary":
        return inline[0] if single else inline
    structs = [{"bytes": data, "path": Path(entry).name} for data, entry in zip(inline, entries, strict=True)]
    return structs[0] if single else structs


def rows_for(records: list[dict], form: str, names: dict[str, str]) -> list[dict]:
    """The records as rows under `names`, media in `form`; a record without a medium lacks the key."""
    rows = []
    for record in records:
        row = {names[f]: record[f] for f in ("id", "state", "questions")}
        for field in ("images", "audio"):
            cell = media_cell(record.get(field), form, single=field == "audio")
            if cell is not None:
                row[names[field]] = cell
        rows.append(row)
    return rows


def text_cell(value: object) -> str:
    return "" if value is None else value if isinstance(value, str) else json.dumps(value)


# ----------------------------------------------------------------------------- shapes


def jsonl_bytes(rows: list[dict]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def delimited_bytes(rows: list[dict], names: dict[str, str], delimiter: str) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, delimiter=delimiter)
    header = [names[field] for field in ("id", "state", "questions", "images", "audio")]
    writer.writerow(header)
    for row in rows:
        writer.writerow([text_cell(row.get(column)) for column in header])  # no medium: an empty cell
    return out.getvalue().encode()


def parquet_table(rows: list[dict], names: dict[str, str], form: str) -> pa.Table:
    """Nested values as JSON text; a media column of paths and lists holds lists throughout."""
    images, audio = names["images"], names["audio"]
    listed = form != "path" or any(isinstance(row.get(images), list) for row in rows)
    entry = {"path": pa.string(), "list": pa.string(), "binary": pa.binary()}.get(form)
    if entry is None:
        entry = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema(
        [(names["id"], pa.string()), (names["state"], pa.string()), (names["questions"], pa.string()),
         (images, pa.list_(entry) if listed or form != "path" else entry),
         (audio, pa.list_(entry) if form == "list" else entry)]
    )  # fmt: skip
    table_rows = []
    for row in rows:
        cells = {key: text_cell(value) if key in (names["state"], names["questions"]) else value
                 for key, value in row.items()}  # fmt: skip
        if form == "path" and isinstance(cells.get(images), str):
            cells[images] = [cells[images]]
        table_rows.append(cells)
    return pa.Table.from_pylist(table_rows, schema=schema)


def write_shape(shape: str, folder: Path, rows: list[dict], names: dict[str, str], form: str) -> tuple[str, bytes]:
    """The input as `clef score` is given it (and stdin's bytes), in a folder of its own."""
    folder.mkdir(parents=True)
    if shape in ("jsonl", "stdin"):
        (folder / "r.jsonl").write_bytes(jsonl_bytes(rows))
        return ("-" if shape == "stdin" else str(folder / "r.jsonl")), jsonl_bytes(rows)
    if shape == "json":
        (folder / "r.json").write_text(json.dumps(rows))
    elif shape == "jsonl.gz":
        (folder / "r.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(rows)))
    elif shape in ("folder", "glob"):
        (folder / "parts").mkdir()
        (folder / "parts" / "part-1.jsonl").write_bytes(jsonl_bytes(rows[:2]))
        (folder / "parts" / "part-2.jsonl").write_bytes(jsonl_bytes(rows[2:]))
        return str(folder / "parts") if shape == "folder" else str(folder / "parts" / "part-*.jsonl"), b""
    elif shape in ("csv", "tsv", "csv.gz"):
        data = delimited_bytes(rows, names, "\t" if shape == "tsv" else ",")
        (folder / f"r.{shape}").write_bytes(gzip.compress(data) if shape == "csv.gz" else data)
    elif shape in ("parquet", "stdin-parquet"):
        pq.write_table(parquet_table(rows, names, form), folder / "r.parquet")
        if shape == "stdin-parquet":
            return "-", (folder / "r.parquet").read_bytes()
    elif shape == "hive":
        table = parquet_table(rows, names, form).append_column("lang", pa.array(["en", "de", "en"]))
        pq.write_to_dataset(table, folder / "hive", partition_cols=["lang"])
        return str(folder / "hive"), b""
    elif shape == "datasets":
        return str(write_dataset(folder / "r.parquet", rows, names)), b""
    return str(next(folder.iterdir())), b""


def write_dataset(path: Path, rows: list[dict], names: dict[str, str]) -> Path:
    """Under `datasets`' own Arrow schema: a List(Image()) column and an Audio() column."""
    datasets = require("datasets")
    spec = datasets.Features({
        names["id"]: datasets.Value("string"), names["state"]: datasets.Value("string"),
        names["questions"]: datasets.Value("string"),
        names["images"]: datasets.List(datasets.Image()), names["audio"]: datasets.Audio(),
    })  # fmt: skip
    cells = [{key: text_cell(value) if key in (names["state"], names["questions"]) else value
              for key, value in row.items()} for row in rows]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(cells, schema=spec.arrow_schema), path)
    return path


FORMS = {
    "jsonl": ("path", "list"), "json": ("path", "list"), "jsonl.gz": ("path", "list"), "stdin": ("path", "list"),
    "folder": ("path", "list"), "glob": ("path", "list"),
    "csv": ("path", "list"), "tsv": ("path", "list"), "csv.gz": ("path", "list"),
    "parquet": ("path", "list", "binary", "struct"), "hive": ("path", "list", "binary", "struct"),
    "stdin-parquet": ("binary", "struct"), "datasets": ("datasets",),
}  # fmt: skip
CASES = [(shape, form, mapped) for shape, forms in FORMS.items() for form in forms for mapped in (False, True)]
QUICK = {("csv", "path", True), ("jsonl", "path", True), ("parquet", "binary", True), ("datasets", "datasets", False)}
"""The quick loop's cases: the two shapes issue 51 found read otherwise (a mapped CSV with empty
and JSON-list media cells; a JSONL whose first record lacks the mapped keys), inline bytes, datasets."""


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """The plain records scored once into a store every case shares: the output's rows by id."""
    root = tmp_path_factory.mktemp("shapes")
    shutil.copytree(MEDIA, root / "media", ignore=shutil.ignore_patterns("*.mp4", "*.webm"))
    records = base_records(root / "media")
    store = root / "store.ckpt"
    plain = write_jsonl(root / "plain.jsonl", records)
    done = runner.invoke(app, ["score", str(plain), "-o", str(root / "plain.parquet"), "--checkpoint", str(store),
                               *COMMON])  # fmt: skip
    assert done.exit_code == 0, done.output
    return root, records, {row["id"]: row for row in pq.read_table(root / "plain.parquet").to_pylist()}


@pytest.mark.parametrize(
    ("shape", "form", "mapped"),
    [pytest.param(*case, marks=() if case in QUICK else pytest.mark.slow) for case in CASES],
    ids=lambda value: {True: "mapped", False: "plain"}.get(value, value) if isinstance(value, bool) else value,
)
def test_every_shape_and_cell_form_keys_as_the_plain_records(scored, shape, form, mapped, monkeypatch):
    from clef_cli.inputs import streams

    monkeypatch.setattr(streams, "_spooled", {})  # each case's stdin is its own (the runner's stand-ins share ids)
    root, records, want = scored
    names = MAPPED if mapped else PLAIN
    case = root / f"{shape}-{form}-{'mapped' if mapped else 'plain'}"
    location, piped = write_shape(shape, case, rows_for(records, form, names), names, form)
    out = case / "out.parquet"
    args = ["score", location, "-o", str(out), "--checkpoint", str(root / "store.ckpt"), *COMMON]
    done = runner.invoke(app, [*args, *(["--columns", COLUMNS] if mapped else [])], input=piped)
    assert done.exit_code == 0, done.output
    table = pq.read_table(out)
    metadata = table.schema.metadata
    assert (metadata[b"clef.records_run"], metadata[b"clef.records_reused"]) == (b"0", b"3")  # every key the plain's
    got = {row["id"]: row for row in table.to_pylist()}
    assert set(got) == set(want)
    for record_id, row in got.items():
        assert row["error"] is None and row["record_key"] == want[record_id]["record_key"], record_id
        assert row["answers"] == want[record_id]["answers"], record_id


# ----------------------------------------------------------------------------- the readings, one by one


@pytest.mark.parametrize(("field", "column"), [("images", "attachments"), ("audio", "clip_path")])
def test_a_mapped_csv_media_column_reads_as_a_column_of_the_fields_own_name(tmp_path, field, column):
    """An empty cell is no media and a JSON-list cell a list, whatever the column is named: the
    cells are read per field after the mapping (formats.Cells.text), not per column before it."""
    lines = ["id,state,{},notes", "a,hi,,", 'b,hi,"[""x.wav"", ""y.wav""]",', 'c,hi,z.wav,"[""kept""]"']
    (tmp_path / "own.csv").write_text("\n".join(lines).format(field) + "\n", encoding="utf-8")
    (tmp_path / "mapped.csv").write_text("\n".join(lines).format(column) + "\n", encoding="utf-8")
    own = list(read_records([tmp_path / "own.csv"], questions=QUESTIONS))
    mapped = list(read_records([tmp_path / "mapped.csv"], questions=QUESTIONS,
                               columns=parse_columns(f"{field}={column}", None)))  # fmt: skip
    assert all(isinstance(record, Record) for record in own + mapped), own + mapped
    want = [(), ("x.wav", "y.wav"), ("z.wav",)]
    assert [getattr(r, field) for r in mapped] == [getattr(r, field) for r in own] == want
    state = list(read_records([tmp_path / "own.csv"], questions=QUESTIONS, columns=parse_columns(None, "notes")))
    assert [r.state for r in state] == [{"notes": ""}, {"notes": ""}, {"notes": '["kept"]'}]  # a column's text as is


@pytest.mark.parametrize("column", ["questions", "schema"])
def test_a_csv_whose_questions_cells_are_all_empty_is_refused_mapped_or_not(tmp_path, column):
    """An empty questions cell is none, whatever the column is named: with no --questions the job
    is refused once (no record has questions), not run as records whose questions are empty text."""
    (tmp_path / "t.csv").write_text(f"id,state,{column}\na,hello,\nb,world,\n", encoding="utf-8")
    mapping = ["--columns", f"questions={column}"] if column != "questions" else []
    done = runner.invoke(app, ["score", str(tmp_path / "t.csv"), "-o", str(tmp_path / "o.parquet"), *mapping, *COMMON])
    assert done.exit_code == 2 and "no questions: no 'questions' field in the first 2 records" in done.stderr
    assert not (tmp_path / "o.parquet.ckpt").exists()


def test_an_optional_mapped_key_gives_one_answer_whatever_the_order(tmp_path):
    """A JSONL whose first record lacks the mapped `attachments` reads as the same records in
    another order; a column no record of the whole input has is refused, one later records may
    have is a warning of the first window."""
    from clef_cli.inputs.first_window import FIRST_WINDOW, check_first_window
    from clef_cli.inputs.table_shape import check_columns

    rows = [{"id": "a", "state": "s"}, {"id": "b", "state": "t", "attachments": ["x.png"]}]
    mapping = parse_columns("images=attachments", None)
    for order in (rows, rows[::-1]):
        path = write_jsonl(tmp_path / f"{order[0]['id']}.jsonl", order)
        check_columns(mapping, [path])
        assert check_first_window([path], True, columns=mapping) == []
        assert {r.id: r.images for r in read_records([path], QUESTIONS, columns=mapping)} == {"a": (), "b": ("x.png",)}
    with pytest.raises(UsageError, match=r"no column 'attachment' in .*: no record has it"):
        check_columns(parse_columns("images=attachment", None), [tmp_path / "a.jsonl"])
    many = write_jsonl(tmp_path / "many.jsonl", [rows[0]] * FIRST_WINDOW + [rows[1]])
    check_columns(mapping, [many])  # the window does not hold every record: no refusal
    [warning] = check_first_window([many], True, columns=mapping)
    assert f"none of the first {FIRST_WINDOW} JSON records has a column 'attachments'" in warning


def test_hive_keys_are_columns_to_map_and_parts_are_named_by_their_path(tmp_path):
    """`--state-columns body,lang` over Hive parts that share a file name: the partition key is a
    column like any other; a mapped column a part lacks is refused naming that part by its path."""
    from clef_cli.inputs.table_shape import check_columns

    for lang in ("de", "en"):
        (tmp_path / "hive" / f"lang={lang}").mkdir(parents=True)
        part = tmp_path / "hive" / f"lang={lang}" / "part-0.parquet"
        pq.write_table(pa.table({"id": [lang], "body": ["hello"]}), part)
    mapping = parse_columns(None, "body,lang")
    check_columns(mapping, [tmp_path / "hive"])
    records = list(read_records([tmp_path / "hive"], QUESTIONS, columns=mapping))
    assert [(r.id, r.state) for r in records] == [("de", {"body": "hello", "lang": "de"}),
                                                  ("en", {"body": "hello", "lang": "en"})]  # fmt: skip
    pq.write_table(pa.table({"id": ["x"], "text": ["hello"]}), tmp_path / "hive" / "lang=en" / "part-0.parquet")
    with pytest.raises(UsageError, match=f"no column 'body' in {tmp_path}/hive/lang=en/part-0.parquet "):
        check_columns(mapping, [tmp_path / "hive"])


def test_csv_on_stdin_is_refused_once_with_a_way_out(tmp_path):
    out = tmp_path / "out.parquet"
    done = runner.invoke(app, ["score", "-", "-o", str(out), *COMMON], input=b"id,state\na,hello\n")
    assert done.exit_code == 2, done.output
    assert done.stderr.count("\n") == 1 and "first line 'id,state' is not JSON" in done.stderr
    assert "a file named .csv" in done.stderr and not out.exists() and not (tmp_path / "out.parquet.ckpt").exists()
    (tmp_path / "q.json").write_text(json.dumps(QUESTIONS))
    broken = runner.invoke(app, ["score", "-", "-o", str(out), "--dry-run", "--questions", str(tmp_path / "q.json"),
                                 *COMMON], input=b'{"id": "a", "state": \n{"id": "b", "state": "s"}\n')  # fmt: skip
    assert broken.exit_code == 0, broken.output  # a broken first JSONL line stays that record's error


def test_inspect_spans_reads_a_mapped_table(tmp_path):
    """`inspect-spans --columns/--state-columns/--questions`: the record `clef score` would read."""
    path = tmp_path / "t.csv"
    path.write_text('ticket,subject,body\nT-1,Refund,"Where is ""my"" money?"\n', encoding="utf-8")
    (tmp_path / "q.json").write_text(json.dumps(QUESTIONS))
    args = ["inspect-spans", str(path), "--model", str(TINY_MODEL), "--questions", str(tmp_path / "q.json"), "--json"]
    shown = runner.invoke(app, [*args, "--columns", "id=ticket", "--state-columns", "subject,body"])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.stdout)
    assert report["id"] == "T-1" and [q["question_id"] for q in report["questions"]] == ["urgent", "team"]
    plain = write_jsonl(tmp_path / "plain.jsonl",
                        [{"id": "T-1", "state": {"subject": "Refund", "body": 'Where is "my" money?'}}])  # fmt: skip
    twin = runner.invoke(app, ["inspect-spans", str(plain), *args[2:]])
    assert json.loads(twin.stdout) == report  # the same prompt, token for token
    missing = runner.invoke(app, [*args, "--columns", "id=ticket_id"])
    assert missing.exit_code == 2 and "no column 'ticket_id'" in missing.stderr
    assert isinstance(next(iter(read_records([path], QUESTIONS))), InvalidRecord)  # unmapped: no state


def test_a_tables_refusal_names_it_by_its_path_as_given(tmp_path, monkeypatch):
    """`clef score exports/tickets.csv` without a state column: the refusal names
    `exports/tickets.csv`, not a path the user did not write."""
    (tmp_path / "exports").mkdir()
    (tmp_path / "exports" / "tickets.csv").write_text("ticket,body\nT-1,hello\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    args = ["score", "exports/tickets.csv", "-o", "out.parquet", *COMMON]
    done = runner.invoke(app, args)
    assert done.exit_code == 2, done.output
    assert done.stderr.startswith("error: exports/tickets.csv has no 'state' column")
    assert str(tmp_path) not in done.stderr
    mapped = runner.invoke(app, [*args, "--columns", "state=text"])
    assert mapped.exit_code == 2 and "no column 'text' in exports/tickets.csv " in mapped.stderr, mapped.output
