"""Stdin and pipes read once, in this process (inputs/streams.py): what counts as a stream, the
spool each stream is copied to (one per stream, its format told by its first bytes), and the
refusals. The end-to-end runs through real pipes are in test_table_formats.py; these run here so
that a planted bug in the module fails them (tools/mutate.py)."""

from __future__ import annotations

import gzip
import io
import os
import threading
from pathlib import Path

import pytest

from clef_cli.errors import UsageError
from clef_cli.inputs import streams
from clef_cli.inputs.streams import spooled_stream, stream_input

LINES = b'{"id": "a", "state": "x"}\n{"id": "b", "state": "y"}\n'


class FakeStdin:
    """A stdin as a test runner gives it: bytes behind `buffer`, no descriptor."""

    def __init__(self, data: bytes, tty: bool = False) -> None:
        self.buffer = io.BytesIO(data)
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty

    def fileno(self) -> int:
        raise io.UnsupportedOperation("no descriptor")


@pytest.fixture(autouse=True)
def fresh_spools(monkeypatch):
    monkeypatch.setattr(streams, "_spooled", {})


def feed_fifo(path: Path, data: bytes) -> threading.Thread:
    os.mkfifo(path)

    def write() -> None:
        with open(path, "wb") as pipe:
            pipe.write(data)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def test_what_names_a_stream(tmp_path):
    for name in ("-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"):
        assert stream_input(name) and stream_input(Path(name))
    plain = tmp_path / "r.jsonl"
    plain.write_bytes(LINES)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert not stream_input(str(plain)) and not stream_input(plain)
    assert stream_input(str(fifo)) and stream_input(fifo)
    assert stream_input("/dev/null")  # a character device
    assert not stream_input(str(tmp_path))  # a folder
    assert not stream_input(str(tmp_path / "missing"))
    assert not stream_input("a\0b")  # os.stat refuses a NUL: not a stream
    assert not stream_input(7) and not stream_input(None)


def test_stdin_is_copied_once_and_every_name_for_it_reads_the_same_spool(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.stdin", FakeStdin(LINES))
    first = spooled_stream("-")
    assert Path(first.path).read_bytes() == LINES and first.size == len(LINES)
    assert first.path.endswith(".jsonl") and first.shown == "stdin" and first.base == str(tmp_path)
    assert Path(first.path).parent.name.startswith("clef-stdin-")
    assert spooled_stream("/dev/stdin") is first and spooled_stream("-") is first  # read once


@pytest.mark.parametrize(
    ("data", "suffix"),
    [
        (b"PAR1" + b"\0" * 8, ".parquet"),
        (gzip.compress(LINES), ".jsonl.gz"),
        (b"\x28\xb5\x2f\xfd" + b"\0" * 8, ".jsonl.zst"),
        (LINES, ".jsonl"),
        (b"", ".jsonl"),
    ],
    ids=["parquet", "gzip", "zstd", "jsonl", "empty"],
)
def test_a_streams_format_is_told_by_its_first_bytes(monkeypatch, data, suffix):
    monkeypatch.setattr("sys.stdin", FakeStdin(data))
    spool = spooled_stream("-")
    name = Path(spool.path).name
    assert name.endswith(suffix) and not name.endswith(".spool")
    if suffix == ".jsonl":
        assert not name.endswith((".parquet", ".jsonl.gz", ".jsonl.zst"))
    assert Path(spool.path).read_bytes() == data and spool.size == len(data)


def test_two_pipes_get_two_spools_and_each_is_named_by_its_path(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    writers = [feed_fifo(one, LINES), feed_fifo(two, LINES.replace(b'"a"', b'"c"'))]
    first, second = spooled_stream(str(one)), spooled_stream(str(two))
    for writer in writers:
        writer.join(5)
    assert first.path != second.path and first.shown == str(one) and second.shown == str(two)
    assert Path(first.path).read_bytes() == LINES and b'"c"' in Path(second.path).read_bytes()
    assert spooled_stream(str(one)) is first


def test_a_large_stream_is_copied_whole(monkeypatch):
    data = b"".join(b'{"id": "%d", "state": "%s"}\n' % (n, b"w" * 200) for n in range(20000))  # > 1 MiB
    monkeypatch.setattr("sys.stdin", FakeStdin(data))
    spool = spooled_stream("-")
    assert spool.size == len(data) and Path(spool.path).read_bytes() == data


def test_a_terminal_or_a_missing_stdin_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr("sys.stdin", FakeStdin(LINES, tty=True))
    with pytest.raises(UsageError) as refused:
        spooled_stream("-")
    assert str(refused.value) == "-: stdin is a terminal; pipe records into clef (`zcat x.jsonl.gz | clef score -`)"
    monkeypatch.setattr("sys.stdin", None)
    with pytest.raises(UsageError) as refused:
        spooled_stream("/dev/stdin")
    assert str(refused.value) == "/dev/stdin: this process has no stdin"


def test_a_stream_that_cannot_be_read_is_refused_naming_it(tmp_path):
    with pytest.raises(UsageError) as refused:
        spooled_stream(str(tmp_path))  # a folder: open() fails
    assert str(refused.value).startswith(f"cannot read {tmp_path}: ")


@pytest.mark.parametrize(
    "head",
    [
        b"id,state\nr1,hello\n",
        b"\n\n  id\tstate\nr1\thello\n",
        b"\xef\xbb\xbfticket_id,body\n",
    ],
    ids=["csv", "tsv-after-blank-lines", "csv-with-bom"],
)
def test_a_csv_or_tsv_on_a_stream_is_refused_once(monkeypatch, head):
    monkeypatch.setattr("sys.stdin", FakeStdin(head))
    with pytest.raises(UsageError) as refused:
        spooled_stream("-")
    first = head.decode("utf-8").lstrip("\n").splitlines()[0].lstrip("\ufeff").strip()
    assert str(refused.value) == (
        f"-: a stream is read as JSONL (or Parquet, or gzip/zstd JSONL), and its first line {first[:60]!r} is "
        "not JSON: a CSV or TSV header? save it as a file named .csv or .tsv and give that path "
        "(`... > export.csv && clef score export.csv ...`)"
    )


def test_a_long_csv_header_is_shown_cut_to_60_characters(monkeypatch):
    header = ",".join(f"column_{n}" for n in range(20))
    monkeypatch.setattr("sys.stdin", FakeStdin(header.encode() + b"\n"))
    with pytest.raises(UsageError) as refused:
        spooled_stream("-")
    assert repr(header[:60]) in str(refused.value) and repr(header[:61]) not in str(refused.value)


def test_a_gzipped_csv_on_a_stream_is_refused_too(monkeypatch):
    monkeypatch.setattr("sys.stdin", FakeStdin(gzip.compress(b"id,state\nr1,x\n")))
    with pytest.raises(UsageError, match="'id,state' is not JSON"):
        spooled_stream("-")


@pytest.mark.parametrize(
    "data",
    [
        b'\n  \n{"id": "a", "state": "x"}\n',  # blank lines first
        b'[{"id": "a"}]\n',
        b'\xef\xbb\xbf{"id": "a", "state": "x"}\n',  # a BOM
        b'"just a string"\n',  # a JSON value: the record's error later, not the stream's
        b"42\n",
        b'{"id": "a", broken\n',  # a broken first record stays its error
        b"\n\n",
        b"\x1f\x8b\x08\x00broken",  # a damaged gzip stream: its reading names the problem
    ],
    ids=["blank-lines-first", "array", "bom", "string", "number", "broken-object", "blank", "damaged-gzip"],
)
def test_streams_that_read_as_jsonl_are_accepted(monkeypatch, data):
    monkeypatch.setattr("sys.stdin", FakeStdin(data))
    spool = spooled_stream("-")
    assert Path(spool.path).read_bytes() == data


def test_the_first_line_is_found_in_the_streams_first_64_kib(monkeypatch):
    blank = b"\n" * (streams.HEAD_BYTES + 10)  # the first line lies past what is read: nothing to judge
    monkeypatch.setattr("sys.stdin", FakeStdin(blank + b"id,state\n"))
    assert Path(spooled_stream("-").path).read_bytes().endswith(b"id,state\n")


@pytest.mark.parametrize(
    ("head", "shown"),
    [
        (b"\xff\xfe,id\n", "\ufffd\ufffd,id"),  # not UTF-8: read with replacements, never a traceback
        (b"XID,state\n", "XID,state"),  # a BOM is stripped, and nothing else
    ],
    ids=["not-utf8", "starts-with-x"],
)
def test_a_csv_header_is_shown_as_it_reads(monkeypatch, head, shown):
    monkeypatch.setattr("sys.stdin", FakeStdin(head))
    with pytest.raises(UsageError) as refused:
        spooled_stream("-")
    assert f"its first line {shown!r} is not JSON" in str(refused.value)


def test_a_first_line_that_opens_an_array_stays_the_records_error(monkeypatch):
    data = b'[{"id": "a",\n'  # broken, but JSONL: the record's error later, not a refusal
    monkeypatch.setattr("sys.stdin", FakeStdin(data))
    assert Path(spooled_stream("-").path).read_bytes() == data


def test_a_later_pipe_at_the_same_name_is_another_stream(tmp_path):
    """`<(cmd)` names /dev/fd/N; a later call with another pipe at that number is another stream."""
    number = os.dup(0)
    try:
        for data in (LINES, LINES.replace(b'"a"', b'"z"')):
            read_end, write_end = os.pipe()
            os.write(write_end, data)
            os.close(write_end)
            os.dup2(read_end, number)
            os.close(read_end)
            assert Path(spooled_stream(f"/dev/fd/{number}").path).read_bytes() == data
    finally:
        os.close(number)


def test_each_stdin_a_runner_gives_is_its_own_stream(monkeypatch):
    first, second = FakeStdin(LINES), FakeStdin(LINES.replace(b'"a"', b'"z"'))  # both alive: distinct ids
    monkeypatch.setattr("sys.stdin", first)
    assert Path(spooled_stream("-").path).read_bytes() == LINES
    monkeypatch.setattr("sys.stdin", second)
    assert b'"z"' in Path(spooled_stream("-").path).read_bytes()


def test_the_spool_folder_is_removed_when_the_process_ends_even_if_it_is_gone(monkeypatch):
    registered = []
    monkeypatch.setattr(streams, "_folder", [])
    monkeypatch.setattr(streams.atexit, "register", lambda function, *args: registered.append((function, args)))
    monkeypatch.setattr("sys.stdin", FakeStdin(LINES))
    folder = Path(spooled_stream("-").path).parent
    ((function, args),) = registered
    function(*args)
    assert not folder.exists()
    function(*args)  # already gone (a second clef in the process, a cleaner): no error at exit


class CountingReader(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.sizes: list[object] = []

    def read(self, size=-1):  # type: ignore[override]
        self.sizes.append(size)
        return super().read(size)

    def readinto(self, buffer):  # type: ignore[override]
        self.sizes.append(len(buffer))
        return super().readinto(buffer)


def test_a_stream_is_copied_in_bounded_reads(monkeypatch):
    stdin = FakeStdin(b"")
    stdin.buffer = CountingReader(LINES * 40000)  # about 2 MiB
    monkeypatch.setattr("sys.stdin", stdin)
    assert spooled_stream("-").size == len(LINES) * 40000
    assert stdin.buffer.sizes and all(isinstance(size, int) and 0 < size <= 1 << 20 for size in stdin.buffer.sizes)
