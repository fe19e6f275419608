"""`--columns FIELD=COLUMN` and `--state-columns` (issue 47): a table with its own column names
gives the records a table with the record's names gives, with the same keys (the mapping is
not hashed: the prompt it makes is), and every mapping mistake is a refusal naming the column."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.encoding.media_limits import MediaLimits
from clef_cli.errors import RecordError, UsageError
from clef_cli.inputs.columns import ColumnMapping, mapping_from_metadata, parse_columns
from clef_cli.inputs.media_cells import InlineBytes, InlineSamples, media_entries
from clef_cli.inputs.parquet_rows import AmbiguousNulls
from clef_cli.inputs.readers import read_records
from clef_cli.inputs.record_size import OversizeCell
from clef_cli.inputs.records import InvalidRecord, Record
from clef_cli.store.record_key import MediaHasher

from .support.helpers import MEDIA, TINY_MODEL, write_jsonl

runner = CliRunner()
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
TICKETS = [
    {"ticket_id": "T-1", "subject": "Refund", "body": "Where is my money?", "customer_tier": "gold", "n": 3},
    {"ticket_id": "T-2", "subject": "Login", "body": "Cannot sign in", "customer_tier": None, "n": 1},
]


def score(*args: str):
    return runner.invoke(app, ["score", *args, "--model", str(TINY_MODEL), "--workers", "0", "--quiet"])


def plain_twins() -> list[dict]:
    """The tickets as records with the record's own field names (the state as --state-columns builds it)."""
    return [
        {"id": t["ticket_id"], "state": {"body": t["body"], "customer_tier": t["customer_tier"],
                                         "subject": t["subject"]}, "questions": QUESTIONS}
        for t in TICKETS
    ]  # fmt: skip


def test_state_columns_and_ids_read_as_the_plain_records(tmp_path):
    exported = write_jsonl(tmp_path / "tickets.jsonl", [t | {"questions": QUESTIONS} for t in TICKETS])
    mapping = parse_columns("id=ticket_id", "subject,body,customer_tier")
    mapped = list(read_records([exported], columns=mapping))
    plain = list(read_records([write_jsonl(tmp_path / "plain.jsonl", plain_twins())]))
    assert all(isinstance(record, Record) for record in mapped)
    assert [(r.id, r.state, r.questions) for r in mapped] == [(r.id, r.state, r.questions) for r in plain]
    assert list(mapped[0].state) == ["subject", "body", "customer_tier"]  # rendered with sorted keys anyway


def test_parquet_columns_map_state_questions_and_media(tmp_path):
    """Parquet columns under other names: questions as JSON text, an image list, a struct state
    read under --struct-nulls as a `state` column would be."""
    path = tmp_path / "t.parquet"
    image = (MEDIA / "image_a.png").read_bytes()
    table = pa.table({
        "key": ["a", "b"],
        "ctx": [{"text": "x", "n": 1}, {"text": "y", "n": None}],
        "schema": [json.dumps(QUESTIONS)] * 2,
        "photos": pa.array([[image], [image]], pa.list_(pa.binary())),
    })  # fmt: skip
    pq.write_table(table, path)
    mapping = parse_columns("id=key,state=ctx,questions=schema,images=photos", None)
    records = list(read_records([path], columns=mapping))
    assert isinstance(records[0], Record) and records[0].state == {"text": "x", "n": 1}
    assert records[0].images == (InlineBytes(image),)
    assert isinstance(records[1], InvalidRecord) and "struct column 'ctx'" in records[1].error


def test_a_missing_state_column_in_one_jsonl_record_is_its_error(tmp_path):
    rows = [TICKETS[0] | {"questions": QUESTIONS}, {"ticket_id": "T-9", "body": "no subject", "questions": QUESTIONS}]
    mapping = parse_columns("id=ticket_id", "subject,body")
    records = list(read_records([write_jsonl(tmp_path / "t.jsonl", rows)], columns=mapping))
    assert isinstance(records[0], Record)
    assert isinstance(records[1], InvalidRecord) and records[1].id == "T-9" and "'subject'" in records[1].error


@pytest.mark.parametrize(
    ("columns", "state_columns", "expected"),
    [
        ("images=photo,images=pics", None, "mapped twice"),
        ("state=body", "subject", "does not go with --columns state="),
        ("picture=photo", None, "unknown field 'picture'"),
        ("images", None, "is not FIELD=COLUMN"),
        (None, "body,body", "named twice"),
    ],
)
def test_malformed_mappings_are_refused(columns, state_columns, expected):
    with pytest.raises(UsageError, match=expected):
        parse_columns(columns, state_columns)


def test_cli_refuses_a_mapping_the_input_cannot_meet_and_writes_nothing(tmp_path):
    exported = write_jsonl(tmp_path / "tickets.jsonl", [t | {"questions": QUESTIONS} for t in TICKETS])
    out = tmp_path / "out.parquet"
    missing = score(str(exported), "-o", str(out), "--columns", "id=ticket,state=body")
    assert missing.exit_code == 2, missing.output
    assert "no column 'ticket'" in missing.output and "ticket_id, subject, body" in missing.output
    twice = score(str(exported), "-o", str(out), "--columns", "state=body,state=subject")
    assert twice.exit_code == 2 and "mapped twice" in twice.output
    both = score(str(exported), "-o", str(out), "--columns", "state=body", "--state-columns", "subject")
    assert both.exit_code == 2 and "--state-columns" in both.output
    assert not out.exists() and not (tmp_path / "out.parquet.ckpt").exists()


def test_cli_refuses_a_datasets_image_column_mapped_to_audio(tmp_path):
    path = tmp_path / "t.parquet"
    metadata = {b"huggingface": json.dumps({"info": {"features": {"photo": {"_type": "Image"}}}}).encode()}
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("state", pa.string()), ("photo", kind)], metadata=metadata)
    pq.write_table(pa.Table.from_pylist([{"state": "s", "photo": None}], schema=schema), path)
    result = score(str(path), "-o", str(tmp_path / "out.parquet"), "--columns", "audio=photo")
    assert result.exit_code == 2 and "datasets Image features, not audio" in result.output


def test_mapped_records_reuse_the_plain_records_store(tmp_path):
    """The key hashes the prompt, not the mapping: the export, mapped, reuses what its plain twin
    stored; --dry-run says where each field comes from."""
    plain = write_jsonl(tmp_path / "plain.jsonl", plain_twins())
    exported = write_jsonl(tmp_path / "tickets.jsonl", [t | {"questions": QUESTIONS} for t in TICKETS])
    store = str(tmp_path / "store.ckpt")
    first = score(str(plain), "-o", str(tmp_path / "plain.parquet"), "--checkpoint", store, "--hidden-states", "drop")
    assert first.exit_code == 0, first.output
    mapping = ["--columns", "id=ticket_id", "--state-columns", "subject,body,customer_tier"]
    dry = runner.invoke(app, ["score", str(exported), "-o", str(tmp_path / "m.parquet"), "--model", str(TINY_MODEL),
                              "--workers", "0", "--dry-run", *mapping])  # fmt: skip
    assert dry.exit_code == 0, dry.output
    assert "id <- ticket_id: text" in dry.output
    assert "state <- subject, body, customer_tier: a JSON object keyed by column name" in dry.output
    mapped = score(str(exported), "-o", str(tmp_path / "m.parquet"), "--checkpoint", store, "--hidden-states", "drop",
                   *mapping)  # fmt: skip
    assert mapped.exit_code == 0, mapped.output
    got, want = pq.read_table(tmp_path / "m.parquet"), pq.read_table(tmp_path / "plain.parquet")
    assert got.column("id").to_pylist() == ["T-1", "T-2"]
    assert got.column("answers").to_pylist() == want.column("answers").to_pylist()
    assert got.schema.metadata[b"clef.records_reused"] == b"2" and got.schema.metadata[b"clef.records_run"] == b"0"
    assert json.loads(got.schema.metadata[b"clef.columns"])["state_columns"] == ["subject", "body", "customer_tier"]


def test_inline_bytes_key_as_the_file_of_those_bytes(tmp_path):
    hasher = MediaHasher(MediaLimits())
    image = MEDIA / "image_a.png"
    assert hasher.entry(InlineBytes(image.read_bytes()), None) == hasher.entry(str(image), None)
    (entry,) = media_entries([{"bytes": None, "path": "image_a.png"}], "images", "r")
    assert entry == "image_a.png"  # a path alone is a location, resolved as any path is
    with pytest.raises(Exception, match="shape"):
        media_entries({"array": [[0.0, 0.1], [0.2, 0.3]], "sampling_rate": 16000}, "audio", "r")
    samples = media_entries({"array": [0.0, 0.5], "sampling_rate": 16000}, "audio", "r")
    assert isinstance(samples[0], InlineSamples)
    assert hasher.entry(samples[0], None).startswith("samples:")


def test_a_mapped_look_alike_column_is_claimed_and_a_mapped_state_column_counts(tmp_path):
    """Issue 45's near-miss rule meets the mapping: `image` mapped to `images` is the user's column,
    not a near miss; a table whose state column is mapped (`state=body`) has a state column. Without
    the mapping both are whole-job refusals (the first window) or each record's error."""
    from clef_cli.inputs.first_window import check_first_window

    cells = [[str(MEDIA / "image_a.png")]]
    questions = [json.dumps(QUESTIONS)]
    table = pa.table({"ticket_id": ["T-1"], "body": ["Refund please"], "image": cells, "questions": questions})
    path = tmp_path / "tickets.parquet"
    pq.write_table(table, path)
    with pytest.raises(UsageError, match="no 'state' column"):
        check_first_window([path], questions_given=False, claimed=("image",))
    near = r"column 'image' is not a record field \(did you mean 'images'\?\); rename it, map it "
    near += r"\(--columns images=image\)"
    with pytest.raises(UsageError, match=near):
        check_first_window([path], questions_given=False, columns=parse_columns("state=body", None))
    mapping = parse_columns("id=ticket_id,state=body,images=image", None)
    assert check_first_window([path], questions_given=False, columns=mapping) == []
    [record] = read_records([path], columns=mapping)
    assert isinstance(record, Record), record
    assert (record.id, record.state, record.images) == ("T-1", "Refund please", tuple(cells[0]))
    [unmapped] = read_records([path], columns=parse_columns("id=ticket_id,state=body", None))
    assert isinstance(unmapped, InvalidRecord) and "did you mean 'images'" in unmapped.error


def test_a_csv_export_with_its_own_column_names_reads_as_its_plain_twin(tmp_path):
    """Issue 47's CSV export: `--columns id=ticket_id --state-columns ...` over CSV (quotes, a newline
    and unicode inside cells) gives the records the plain JSONL twin gives; the dry run's field
    lines speak of the CSV's header (columns it lacks are "no column"), not of a first record."""
    from clef_cli.inputs.sources import expand_inputs
    from clef_cli.inputs.table_shape import field_sources, table_shape

    rows = [("T-1", "Refund", 'Where is "my" money?\nSecond line, ünïcode', "gold"), ("T-2", "Login", "No", "free")]
    lines = ["ticket_id,subject,body,customer_tier"]
    lines += [",".join('"' + cell.replace('"', '""') + '"' for cell in row) for row in rows]
    csv = tmp_path / "tickets.csv"
    csv.write_text("\n".join(lines) + "\n", encoding="utf-8")
    twins = [{"id": i, "state": {"subject": s, "body": b, "customer_tier": c}, "questions": QUESTIONS}
             for i, s, b, c in rows]  # fmt: skip
    plain = list(read_records([write_jsonl(tmp_path / "plain.jsonl", twins)]))
    mapping = parse_columns("id=ticket_id", "subject,body,customer_tier")
    mapped = list(read_records([csv], questions=QUESTIONS, columns=mapping))
    assert all(isinstance(record, Record) for record in mapped), mapped
    assert [(r.id, r.state, r.questions) for r in mapped] == [(r.id, r.state, r.questions) for r in plain]
    [source] = expand_inputs([csv])
    described = field_sources(mapping, table_shape(source))
    state = "state <- subject, body, customer_tier: a JSON object keyed by column name"
    assert described[:2] == ["id <- ticket_id: text", state]
    assert described[2] == "questions: no column 'questions' (the --questions file, if given)"
    assert described[3:] == ["images: no column 'images'", "audio: no column 'audio'", "videos: no column 'videos'"]


def test_a_row_without_the_mapped_column_has_no_such_field_not_its_own_of_that_name(tmp_path):
    """With --columns images=attachments a record's images come from `attachments` alone: a line
    that lacks it has no images, whatever its own `images` key holds (it is an unmapped column)."""
    lines = [{"id": "a", "state": "s", "images": ["own.png"], "questions": QUESTIONS},
             {"id": "b", "state": "s", "attachments": [], "images": ["own.png"], "questions": QUESTIONS}]  # fmt: skip
    mapping = parse_columns("images=attachments", None)
    mapped = list(read_records([write_jsonl(tmp_path / "r.jsonl", lines)], columns=mapping))
    assert [(record.id, record.images) for record in mapped] == [("a", ()), ("b", ())]


def test_a_row_the_mapping_cannot_map_is_named_as_the_same_row_unmapped(tmp_path):
    """A row missing a --state-columns column is its record's error under the id the row has read
    without the mapping (its text or integer id, its position when it has none, null when its id
    is unusable), at the same index."""
    lines = [{"id": 7, "a": 1}, {"a": 1}, {"id": "", "a": 1}, {"id": "x", "a": 1}, {"id": 2.5, "a": 1}]
    path = write_jsonl(tmp_path / "r.jsonl", lines)
    mapped = list(read_records([path], QUESTIONS, columns=parse_columns(None, "a,b")))
    plain = list(read_records([path], QUESTIONS))  # no state at all: each row's own error
    assert all(isinstance(record, InvalidRecord) for record in mapped + plain)
    assert [(r.id, r.index) for r in mapped] == [(r.id, r.index) for r in plain]
    assert mapped[0].error == "record '7', field 'state': no column 'b' in this record (--state-columns)"


# ------------------------------------------------------------------ the mapping itself, unit by unit


@pytest.mark.parametrize(
    ("fields", "state_columns", "message"),
    [
        (
            (("picture", "p"),),
            (),
            "--columns: unknown field 'picture' (the fields are id, state, questions, images, audio, videos)",
        ),
        ((("id", ""),), (), "--columns: id= names no column"),
        ((("id", "a"), ("id", "b")), (), "--columns: field 'id' is mapped twice ('a' and 'b')"),
        ((("state", "body"),), ("a",), "--state-columns builds the state, so it does not go with --columns state=..."),
        ((), ("a", "b", "a"), "--state-columns: a column is named twice"),
    ],
)
def test_each_mapping_mistake_is_said_in_its_own_words(fields, state_columns, message):
    with pytest.raises(UsageError) as refused:
        ColumnMapping(fields, state_columns)
    assert str(refused.value) == message


def test_two_fields_may_come_from_one_column_and_state_columns_go_with_other_fields():
    mapping = ColumnMapping((("id", "key"), ("questions", "key")), ("a", "b"))
    assert mapping.columns == ("key", "a", "b")  # each column once, in the order given
    assert mapping.source_of("id") == "key" and mapping.source_of("images") == "images"
    assert mapping.nested_columns == ("state", "key", "a", "b")


@pytest.mark.parametrize(
    ("columns", "state_columns", "message"),
    [
        ("", None, "--columns '' names no column; give them, like --columns id=ticket_id"),
        (" , ", None, "--columns ' , ' names no column; give them, like --columns id=ticket_id"),
        (None, ",", "--state-columns ',' names no column; give them, like --state-columns a,b"),
        ("id=a,images", None, "--columns: 'images' is not FIELD=COLUMN"),
    ],
)
def test_options_that_name_nothing_or_no_pair_are_refused_in_their_own_words(columns, state_columns, message):
    with pytest.raises(UsageError) as refused:
        parse_columns(columns, state_columns)
    assert str(refused.value) == message


def test_options_are_read_with_spaces_and_empty_items_left_out():
    mapping = parse_columns(" id = ticket id ,, images=att=1 ", " body , subject ")
    assert mapping == ColumnMapping((("id", "ticket id"), ("images", "att=1")), ("body", "subject"))
    assert parse_columns(None, None) is None
    assert parse_columns(None, "body") == ColumnMapping((), ("body",))
    assert not ColumnMapping() and ColumnMapping((), ("a",)) and ColumnMapping((("id", "a"),))


def test_the_outputs_metadata_gives_back_the_same_mapping():
    mapping = ColumnMapping((("id", "número"), ("state", "body")), ())
    text = mapping.as_metadata()
    assert "número" in text  # written as the column is named, not escaped
    assert json.loads(text) == {"fields": {"id": "número", "state": "body"}, "state_columns": []}
    assert mapping_from_metadata(text) == mapping
    with_state = ColumnMapping((("id", "k"),), ("a", "b"))
    assert mapping_from_metadata(with_state.as_metadata()) == with_state
    assert mapping_from_metadata('{"state_columns": ["a"]}') == ColumnMapping((), ("a",))
    assert mapping_from_metadata('{"fields": {"id": "k"}}') == ColumnMapping((("id", "k"),), ())
    assert mapping_from_metadata(None) is None and mapping_from_metadata("") is None


def test_apply_takes_each_field_from_its_column_and_drops_a_field_whose_column_is_missing():
    mapping = ColumnMapping((("id", "key"), ("images", "photo")), ())
    row = mapping.apply({"key": "k1", "photo": ["a.png"], "images": ["own.png"], "other": 1}, "k1")
    assert row == {"key": "k1", "photo": ["a.png"], "images": ["a.png"], "other": 1, "id": "k1"}
    without = mapping.apply({"key": "k2", "images": ["own.png"]}, "k2")
    assert without == {"key": "k2", "id": "k2"}  # its own `images` is not the mapped column


def test_apply_builds_the_state_from_its_columns_in_the_order_given():
    mapping = ColumnMapping((), ("b", "a"))
    row = mapping.apply({"a": 1, "b": None, "c": 3}, "r")
    assert list(row["state"].items()) == [("b", None), ("a", 1)]
    with pytest.raises(RecordError) as refused:
        mapping.apply({"a": 1, "c": 3}, "r7")
    error = refused.value
    assert (error.record_id, error.field, error.message) == (
        "r7",
        "state",
        "no column 'b' in this record (--state-columns)",
    )


def test_a_refused_cell_in_a_state_column_stands_for_the_whole_state():
    nulls = AmbiguousNulls("a", ("a.x",))
    oversize = OversizeCell("b", "too large")
    mapping = ColumnMapping((), ("a", "b"))
    assert mapping.apply({"a": nulls, "b": 1}, "r")["state"] is nulls
    assert mapping.apply({"a": 1, "b": oversize}, "r")["state"] is oversize
    assert mapping.apply({"a": nulls, "b": oversize}, "r")["state"] is nulls  # the first one
