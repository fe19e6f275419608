"""Every number a calibration file can hold: refused (exit 2, one line naming the file and the
temperature) or applied with finite probabilities that sum to 1, never a NaN (issue 50: 1e-310
passed the check and made every probability NaN with exit 0)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.errors import UsageError
from clef_cli.quality.calibrate.temperature import (
    T_BOUNDS,
    TEMPERATURE_RANGE,
    Calibration,
    apply,
    calibrate_results,
    load_calibration,
)
from clef_cli.quality.labels.scored import QuestionData
from clef_cli.results import RESULT_SCHEMA

FLOAT32_MAX = float(np.finfo(np.float32).max)
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.floats(min_value=1e-4, max_value=1e4),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.sampled_from(
        [
            0,
            -0.0,
            1e-310,
            5e-324,
            1e-3,
            1e3,
            math.nextafter(1e-3, 0),
            math.nextafter(1e3, math.inf),
            1e308,
            10**400,
            -1,
            1,
            0.5,
            True,
            False,
            None,
            "1",
            [],
            {},
        ]
    ),
)
LOGITS = st.lists(st.floats(min_value=-FLOAT32_MAX, max_value=FLOAT32_MAX, width=32), min_size=2, max_size=4)


def results(noul: list[float], choice: list[float]) -> pa.Table:
    """One scored record whose two questions hold these logits (probabilities from them at T = 1)."""
    answers = []
    for qid, qtype, logits in (("urgent", "noul", noul[:2]), ("team", "choice", choice)):
        labels = [{"label": str(i) if qtype == "choice" else ("true", "false")[i], "probability": 0.5, "logit": x}
                  for i, x in enumerate(logits)]  # fmt: skip
        answers.append({"question_id": qid, "type": qtype, "answer": labels[0]["label"], "confidence": 0.5,
                        "noul": None, "score": None, "labels": labels})  # fmt: skip
    row = {"id": "r", "record_index": 0, "prompt_tokens": 1, "state_tokens_cut": 0, "answers": answers}
    return pa.Table.from_pylist([row], schema=RESULT_SCHEMA)


def write(folder: Path, method: str, default: object, noul: object, choice: object, urgent: object) -> Path:
    path = folder / "cal.json"
    document = {"version": 1, "method": method, "default": default,
                "type_temperatures": {"noul": noul, "choice": choice}, "temperatures": {"urgent": urgent}}  # fmt: skip
    path.write_text(json.dumps(document))  # NaN and Infinity as Python's json writes and reads them
    return path


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(["global", "type", "question"]),
    numbers=st.tuples(NUMBERS, NUMBERS, NUMBERS, NUMBERS),
    noul=LOGITS,
    choice=LOGITS,
)
def test_a_calibration_is_refused_or_gives_finite_probabilities_summing_to_one(tmp_path, method, numbers, noul, choice):
    path = write(tmp_path, method, *numbers)
    try:
        calibration = load_calibration(path)
    except UsageError as refused:  # exit 2 (cli/errors.py), one line naming the file
        message = str(refused)
        assert "\n" not in message and str(path) in message and "temperature" in message
        assert any(not isinstance(n, (int, float)) or isinstance(n, bool) or not 1e-3 <= n <= 1e3 for n in numbers)
        return
    table = calibrate_results(results(noul, choice), calibration)
    for answer in table.to_pylist()[0]["answers"]:
        probabilities = [label["probability"] for label in answer["labels"]]
        assert all(math.isfinite(p) and 0 <= p <= 1 for p in probabilities), probabilities
        assert math.fsum(probabilities) == pytest.approx(1.0, abs=1e-12)
        logits = np.array([[label["logit"] for label in answer["labels"]]])
        options = tuple(label["label"] for label in answer["labels"])
        data = QuestionData(answer["question_id"], answer["type"], options, ["r"], logits, logits, np.array([0]))
        evaluated = apply(calibration, data)  # what `clef eval --calibration` computes
        assert np.isfinite(evaluated).all() and evaluated.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("value", [1e-310, 0.0009, 1000.5, 10**400])
def test_the_range_ends_are_the_documented_ones(tmp_path, value):
    assert TEMPERATURE_RANGE == (1e-3, 1e3)
    for edge in TEMPERATURE_RANGE:
        assert load_calibration(write(tmp_path, "question", edge, edge, edge, edge)).default == edge
    with pytest.raises(UsageError, match=r"temperature question 'urgent' must be a number from 0\.001 to 1000"):
        load_calibration(write(tmp_path, "question", 1.0, 1.0, 1.0, value))


def test_a_question_named_like_a_type_is_checked_too(tmp_path):
    """On 5c1bfd9 the types' temperatures overwrote the questions' of the same name before the check."""
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"version": 1, "method": "question", "default": 1.0,
                                "temperatures": {"noul": 1e-310}, "type_temperatures": {"noul": 1.0}}))  # fmt: skip
    with pytest.raises(UsageError, match="temperature question 'noul'"):
        load_calibration(path)


def test_calibrate_can_never_make_a_temperature_outside_the_range():
    """The fit searches T_BOUNDS, inside the range, and a Calibration refuses any other value."""
    assert TEMPERATURE_RANGE[0] <= T_BOUNDS[0] < T_BOUNDS[1] <= TEMPERATURE_RANGE[1]
    for bad in (1e-310, math.nan, math.inf, 0.0, -1.0, 2e3):
        with pytest.raises(UsageError, match="calibration temperature"):
            Calibration("question", temperatures={"q": bad})


def test_score_refuses_such_a_file_before_anything_is_written(tmp_path):
    (tmp_path / "cal.json").write_text('{"version": 1, "method": "global", "default": 1e-310}')
    (tmp_path / "r.jsonl").write_text('{"id": "a", "state": "s", "questions": {"q": {"type": "noul"}}}\n')
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(
        app, ["score", str(tmp_path / "r.jsonl"), "-o", str(out), "--calibration", str(tmp_path / "cal.json"),
              "--model", "tests/fixtures/tiny-clef-omni"],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "temperature default must be a number from 0.001 to 1000, not 1e-310" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()
