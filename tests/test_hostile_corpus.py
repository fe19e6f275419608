"""One `clef score` job over a corpus of hostile records (tests/support/hostile.py: over 60 kinds) among
good ones: exit 3, one row per record in input order, one named error per bad record, every good
record scored with finite numbers, and no hang (the job runs under a timeout). Records that write
special-token strings into their text are among the good ones: they score, their strings read as
text."""

from __future__ import annotations

import math
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from clef_cli.errors import UNEXPECTED

from .support.helpers import MEDIA, TINY_MODEL
from .support.hostile import INJECTIONS, JSONL_CASES, RAW_LINES, build_corpus


def test_the_corpus_has_over_forty_kinds():
    assert len(JSONL_CASES) + len(RAW_LINES) + 5 >= 40
    assert len(INJECTIONS) >= 9


def test_injected_records_hold_no_control_token_of_their_own(processor):
    """Outside its media segment, each injection's prompt holds the template's added tokens
    alone (`--special-tokens text`); under `parse` it holds more."""
    from clef_cli.encoding.prompt import PromptEncoder
    from clef_cli.inputs.records import RecordBuilder

    added = set(processor.tokenizer.added_tokens_decoder)
    counts = {}
    for mode in ("text", "parse"):
        encoder = PromptEncoder(processor, 4096, special_tokens=mode)
        for kind, raw in INJECTIONS:
            encoded = encoder.encode(RecordBuilder(check_duplicates=False).build(raw, 0, MEDIA))
            start, stop = encoded.media_span
            outside = encoded.input_ids[:start] + encoded.input_ids[stop:]
            counts[mode, kind] = sum(token in added for token in outside)
    assert {counts["text", kind] for kind, _ in INJECTIONS} == {7}  # <|im_start|> x3, <|im_end|> x2, <think>, </think>
    assert all(counts["parse", kind] > 7 for kind, _ in INJECTIONS)


@pytest.mark.slow
def test_one_job_over_the_hostile_corpus_fails_only_the_bad_records(tmp_path):
    corpus = build_corpus(tmp_path)
    output = tmp_path / "out.parquet"
    command = [sys.executable, "-m", "clef_cli", "score", *map(str, corpus.inputs), "-o", str(output)]
    command += ["--model", str(TINY_MODEL), "--hidden-states", "drop", "--max-length", "4096", "--quiet"]
    command += ["--keep-columns", "note"]  # pass-through text that is not Unicode, an integer past int64
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    good = len(corpus.expected) - corpus.bad
    assert done.stderr.startswith(f"{good} scored, {corpus.bad} failed of {len(corpus.expected)} records")
    rows = pq.read_table(output).to_pylist()
    notes = {row["id"]: row["note"] for row in rows if row["note"] is not None}
    assert notes == {"good-text": "fine", "17": "x\ufffd", "good-image": str(2**70)}
    assert [row["record_index"] for row in rows] == list(range(len(corpus.expected)))
    assert [row["id"] for row in rows] == [row_id for row_id, _ in corpus.expected]
    for row, (_, error) in zip(rows, corpus.expected, strict=True):
        if error is None:
            assert row["error"] is None, row["error"]
            labels = [label for answer in row["answers"] for label in answer["labels"]]
            assert labels and all(math.isfinite(x["probability"]) and math.isfinite(x["logit"]) for x in labels)
        else:
            assert row["answers"] is None
            assert row["error"].startswith(error), (row["error"], error)
            assert UNEXPECTED not in row["error"]
