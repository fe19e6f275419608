"""Temperature scaling: recovery of a known T, an independent NLL minimiser, `auto`, and applying
a calibration to written results exactly as the scorer would have computed them."""

from __future__ import annotations

import json
import math
import re
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from scipy.optimize import brentq

from clef_cli.errors import UsageError
from clef_cli.inputs.records import Question
from clef_cli.model.answers import question_result
from clef_cli.quality import metrics
from clef_cli.quality.calibrate.temperature import (
    Calibration,
    calibrate,
    calibrate_results,
    fit,
    fit_temperature,
    load_calibration,
    scalar_softmax,
)
from clef_cli.quality.labels.scored import QuestionData, softmax
from clef_cli.results import RESULT_SCHEMA


def drawn(t_star: float, n: int = 5000, k: int = 4, seed: int = 0, qid: str = "q", qtype: str = "choice"):
    """Logits, and labels drawn from softmax(logit / T*)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, k)) * 2.0
    p = softmax(logits / t_star)
    gold = np.array([rng.choice(k, p=row) for row in p])
    ids = [f"{qid}-{i}" for i in range(n)]
    return QuestionData(qid, qtype, tuple(str(i) for i in range(k)), ids, softmax(logits), logits, gold)


def independent_minimiser(logits: np.ndarray, gold: np.ndarray) -> float:
    """The NLL's stationary point in beta = 1/T: sum over records of E_p[logit] - logit[gold] = 0."""

    def gradient(beta: float) -> float:
        p = softmax(logits * beta)
        return float(np.sum((p * logits).sum(axis=1) - logits[np.arange(len(gold)), gold]))

    return 1.0 / brentq(gradient, 1e-3, 1e3, xtol=1e-14, rtol=1e-14)


@pytest.mark.parametrize("t_star", [0.5, 2.0])
def test_global_temperature_is_recovered(t_star):
    data = drawn(t_star)
    fitted = fit("global", {"q": data}).default
    assert abs(fitted - t_star) / t_star < 0.10
    assert abs(fitted - independent_minimiser(data.logits, data.gold)) < 1e-4
    calibrated = softmax(data.logits / fitted)
    assert metrics.accuracy(calibrated, data.gold) == metrics.accuracy(data.probabilities, data.gold)
    assert np.array_equal(np.argmax(calibrated, axis=1), np.argmax(data.logits, axis=1))


def test_type_and_question_methods():
    hot, cold = drawn(0.5, n=3000, seed=1, qid="a", qtype="noul", k=2), drawn(2.0, n=3000, seed=2, qid="b")
    small = drawn(2.0, n=20, seed=3, qid="c", qtype="noul", k=2)
    questions = {"a": hot, "b": cold, "c": small}
    by_type = fit("type", questions)
    assert abs(by_type.type_temperatures["choice"] - 2.0) < 0.2
    by_question = fit("question", questions)
    noul_t = by_question.type_temperatures["noul"]
    own_c = fit_temperature([(small.logits, small.gold)])
    # c has 20 records, so its T sits between its own fit and its type's, closer to the type's
    low, high = sorted([own_c, noul_t])
    assert low <= by_question.temperatures["c"] <= high
    assert abs(np.log(by_question.temperatures["c"] / noul_t)) < abs(np.log(own_c / noul_t))
    assert abs(by_question.temperatures["a"] - 0.5) < 0.1  # 3000 records: barely shrunk


def test_auto_picks_a_temperature_when_it_helps_and_none_when_it_does_not():
    run = calibrate({"q": drawn(2.0, n=2000)}, "auto")
    assert run.calibration.method != "none" and run.improved
    assert run.calibration.cross_fitted["after"]["log_loss"] < run.calibration.cross_fitted["before"]["log_loss"]
    assert set(run.candidates) == {"none", "global", "type", "question"}
    already = drawn(1.0, n=2000, seed=7)
    run = calibrate({"q": already}, "auto")
    assert run.calibration.method == "none" and not run.improved
    assert run.calibration.as_json()["temperatures"] == {} and run.calibration.default == 1.0


def test_cross_fitting_keeps_a_records_questions_in_one_fold():
    from clef_cli.quality.calibrate.temperature import folds_of

    a, b = drawn(1.0, n=30, qid="a"), drawn(1.0, n=30, qid="b")
    b.record_ids = list(a.record_ids)
    folds = folds_of({"a": a, "b": b})
    assert len(folds) == 30 and set(folds.values()) == set(range(5))
    with pytest.raises(UsageError, match="at least 2"):
        folds_of({"a": drawn(1.0, n=1)})


def test_calibrated_results_equal_the_scorer_at_scaled_logits():
    """Written rows recalibrated with T equal question_result() run on logit / T (torch softmax)."""
    questions = [
        Question("spam", "noul", "?", (("true", None), ("false", None)), ("true", "false")),
        Question(
            "team", "choice", "?", (("billing", "b"), ("sales", "s"), ("tech", "t")), ("tech", "sales", "billing")
        ),
        Question("level", "score", "?", (("0", "a"), ("1", "b"), ("2", "c")), ("0", "1", "2")),
    ]
    logits = [torch.tensor([0.3, -1.2]), torch.tensor([1.0, 1.0, -2.0]), torch.tensor([0.5, 2.5, 1.5])]
    raw = [question_result(q, row) for q, row in zip(questions, logits, strict=True)]
    table = pa.Table.from_pylist(
        [
            {
                "id": "r1",
                "record_index": 0,
                "answers": [
                    {
                        "question_id": r.question_id,
                        "type": r.type,
                        "answer": r.answer,
                        "confidence": r.confidence,
                        "noul": r.noul,
                        "score": r.score,
                        "labels": [
                            {"label": o, "probability": p, "logit": lg}
                            for o, p, lg in zip(r.option_ids, r.probabilities, r.logits, strict=True)
                        ],
                    }
                    for r in raw
                ],
            },
            {"id": "r2", "record_index": 1, "error": "broken", "answers": None},
        ],
        schema=RESULT_SCHEMA,
    )
    calibration = Calibration("question", temperatures={"spam": 0.5}, type_temperatures={"choice": 3.0}, default=2.0)
    rows = calibrate_results(table, calibration).to_pylist()
    assert rows[1]["answers"] is None and rows[1]["error"] == "broken"
    for q, row, answer in zip(questions, logits, rows[0]["answers"], strict=True):
        expected = question_result(q, row / calibration.temperature(q.id, q.type))
        assert answer["answer"] == expected.answer  # the billing/sales tie stays "sales" (the record's criteria order)
        assert [label["logit"] for label in answer["labels"]] == pytest.approx(list(row.tolist()), abs=0)
        assert [label["probability"] for label in answer["labels"]] == pytest.approx(expected.probabilities, abs=1e-6)
        assert answer["confidence"] == pytest.approx(expected.confidence, abs=1e-6)
        for name in ("noul", "score"):
            assert (answer[name] is None) == (getattr(expected, name) is None)
            if answer[name] is not None:
                assert answer[name] == pytest.approx(getattr(expected, name), abs=1e-6)
    assert rows[0]["answers"][1]["answer"] == "sales"


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{", "could not be read"),
        ('{"version": 2, "method": "global", "default": 1}', "not a version 1 file"),
        ('{"version": 1, "method": "global", "default": 0}', "must be a number from 0.001 to 1000"),
        ('{"version": 1, "method": "type", "type_temperatures": {"noul": "x"}, "default": 1}', "'noul'"),
    ],
)
def test_bad_calibration_files_are_usage_errors(tmp_path, content, needle):
    path = tmp_path / "cal.json"
    path.write_text(content)
    with pytest.raises(UsageError, match=needle):
        load_calibration(path)


def test_calibration_round_trips_through_json(tmp_path):
    run = calibrate({"q": drawn(2.0, n=500)}, "global", fitted_on={"n": 500})
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(run.calibration.as_json()))
    loaded = load_calibration(path)
    assert loaded.default == run.calibration.default and loaded.method == "global"
    assert set(json.loads(path.read_text())) == {
        "version", "method", "temperatures", "type_temperatures", "default", "fitted_on", "cross_fitted",
        "at_search_bound",
    }  # fmt: skip
    assert loaded.at_search_bound == run.calibration.at_search_bound == []


def test_question_temperatures_follow_the_shrinkage_formula_exactly():
    """log T_q = (n_q log T̂_q + 50 log T_type) / (n_q + 50), with T̂ from an independent minimiser."""
    small = drawn(0.5, n=40, seed=11, qid="s", k=2, qtype="noul")
    large = drawn(2.0, n=400, seed=12, qid="l", k=2, qtype="noul")
    fitted = fit("question", {"s": small, "l": large})
    pooled_logits = np.concatenate([small.logits, large.logits])
    type_t = independent_minimiser(pooled_logits, np.concatenate([small.gold, large.gold]))
    assert fitted.type_temperatures["noul"] == pytest.approx(type_t, rel=1e-6)
    for data in (small, large):
        own = independent_minimiser(data.logits, data.gold)
        want = np.exp((data.n * np.log(own) + 50 * np.log(type_t)) / (data.n + 50))
        assert fitted.temperatures[data.question_id] == pytest.approx(want, rel=1e-6), data.question_id


# ----------------------------------------------------------------------------- the command's printed numbers


def scored_and_gold(folder):
    """A scored Parquet (wide layout) and its gold file: a noul question on 240 records (labels drawn
    at T = 2), a choice question on 80 (T = 0.6) and a second noul on 40 (T = 1.5)."""
    rng = np.random.default_rng(5)
    plan = [("spam", "noul", ("true", "false"), 240, 2.0), ("team", "choice", ("a", "b", "c"), 80, 0.6),
            ("rare", "noul", ("true", "false"), 40, 1.5)]  # fmt: skip
    rows, gold = [], []
    for index in range(240):
        answers, labels = [], {}
        for qid, qtype, options, n, t_star in plan:
            if index >= n:
                continue
            logits = rng.normal(size=len(options)) * 2.5
            label = options[rng.choice(len(options), p=softmax(logits[None] / t_star)[0])]
            labels[qid] = (label == "true") if qtype == "noul" else label
            probabilities = softmax(logits[None])[0]
            answers.append({"question_id": qid, "type": qtype, "answer": options[int(np.argmax(logits))],
                            "confidence": float(probabilities.max()), "noul": None, "score": None,
                            "labels": [{"label": o, "probability": float(p), "logit": float(lg)}
                                       for o, p, lg in zip(options, probabilities, logits, strict=True)]})  # fmt: skip
        rows.append({"id": f"r{index:03d}", "record_index": index, "answers": answers})
        gold.append({"id": f"r{index:03d}", "labels": labels})
    scored = folder / "scored.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=RESULT_SCHEMA), scored)
    (folder / "gold.jsonl").write_text("".join(json.dumps(row) + "\n" for row in gold))
    return scored, folder / "gold.jsonl"


def oracle_temperature(blocks) -> float:
    logits = np.concatenate([block[0] for block in blocks])
    return independent_minimiser(logits, np.concatenate([block[1] for block in blocks]))


def oracle_question_method(train: dict[str, tuple[str, np.ndarray, np.ndarray]]) -> dict[str, float]:
    """Each question's temperature by docs/quality.md's `question` rule, from independent fits."""
    types = {}
    for qtype in {qtype for qtype, _, _ in train.values()}:
        types[qtype] = oracle_temperature([(lg, y) for t, lg, y in train.values() if t == qtype])
    temperatures = {}
    for qid, (qtype, logits, gold) in train.items():
        own, n = independent_minimiser(logits, gold), len(gold)
        temperatures[qid] = float(np.exp((n * np.log(own) + 50 * np.log(types[qtype])) / (n + 50)))
    return temperatures


def oracle_metrics(pairs: list[tuple[np.ndarray, int]], bins: int = 15) -> tuple[float, float, float]:
    """Log loss, Brier and top-label ECE over (probabilities, gold) pairs, one at a time."""
    loss = brier = 0.0
    counts, correct, confidence = [0] * bins, [0.0] * bins, [0.0] * bins
    for p, y in pairs:
        loss += -np.log(max(p[y], 1e-15))
        brier += sum((p[k] - (1.0 if k == y else 0.0)) ** 2 for k in range(len(p)))
        best = max(range(len(p)), key=lambda k: (p[k], -k))
        b = min(int(p[best] * bins), bins - 1)
        counts[b] += 1
        correct[b] += best == y
        confidence[b] += p[best]
    n = len(pairs)
    ece = sum(counts[b] / n * abs(correct[b] / counts[b] - confidence[b] / counts[b]) for b in range(bins) if counts[b])
    return loss / n, brier / n, ece


def test_calibrate_prints_cross_fitted_metrics_a_direct_loop_reproduces(tmp_path):
    from typer.testing import CliRunner

    from clef_cli.cli import app
    from clef_cli.quality.calibrate.temperature import folds_of

    scored, gold = scored_and_gold(tmp_path)
    out = tmp_path / "cal.json"
    result = CliRunner().invoke(app, ["calibrate", str(scored), "--gold", str(gold), "-o", str(out),
                                      "--method", "question"], env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 0, result.output
    printed = {}
    for line in result.stdout.splitlines():
        for name in ("none (uncalibrated)", "question"):
            if name in line and "temperatures" not in line:
                printed[name] = [float(v) for v in re.findall(r"\d+\.\d{4}", line)][:3]
    # the data: straight from the rows written above (the split into folds is the command's own)
    table = pq.read_table(scored).to_pylist()
    labels = {row["id"]: row["labels"] for row in map(json.loads, gold.read_text().splitlines())}
    items = []  # (record, question, type, logits, gold index)
    for row in table:
        for answer in row["answers"]:
            options = [label["label"] for label in answer["labels"]]
            truth = labels[row["id"]][answer["question_id"]]
            truth = str(truth).lower() if isinstance(truth, bool) else truth
            logits = np.array([label["logit"] for label in answer["labels"]])
            items.append((row["id"], answer["question_id"], answer["type"], logits, options.index(truth)))
    fold = folds_of({"every record": SimpleNamespace(record_ids=list(labels))})  # the labelled record ids
    assert len(fold) == 240 and set(fold.values()) == set(range(5))
    held = []
    for current in range(5):
        train: dict[str, tuple[str, list, list]] = {}
        for record, qid, qtype, logits, y in items:
            if fold[record] != current:
                entry = train.setdefault(qid, (qtype, [], []))
                entry[1].append(logits)
                entry[2].append(y)
        temperatures = oracle_question_method({q: (t, np.array(lg), np.array(y)) for q, (t, lg, y) in train.items()})
        held += [(softmax(logits[None] / temperatures[qid])[0], y)
                 for record, qid, _, logits, y in items if fold[record] == current]  # fmt: skip
    assert printed["none (uncalibrated)"] == pytest.approx(
        oracle_metrics([(softmax(logits[None])[0], y) for *_, logits, y in items]), abs=1e-4
    )
    assert printed["question"] == pytest.approx(oracle_metrics(held), abs=1e-4)
    assert printed["question"][0] < printed["none (uncalibrated)"][0] - 0.01  # these labels need calibrating
    # the file's temperatures, fitted on every label: the shrinkage rule, exactly
    everything = {}
    for _, qid, qtype, logits, y in items:
        everything.setdefault(qid, (qtype, [], []))[1].append(logits)
        everything[qid][2].append(y)
    want = oracle_question_method({q: (t, np.array(lg), np.array(y)) for q, (t, lg, y) in everything.items()})
    assert json.loads(out.read_text())["temperatures"] == pytest.approx(want, rel=1e-6)


def test_the_written_softmax_is_libm_exp_summed_in_order_and_agrees_with_scipy():
    """The calibrated probabilities an output holds come from libm's exp (math.exp), so their bytes
    do not follow numpy's SIMD width; scipy is the independent oracle for the values."""
    from scipy.special import softmax as scipy_softmax

    rng = np.random.default_rng(7)
    for size in (2, 3, 5, 9, 17):
        logits = (rng.normal(size=size) * 8).tolist()
        written = scalar_softmax(logits)
        np.testing.assert_allclose(written, scipy_softmax(np.array(logits)), rtol=1e-14, atol=0)
        top = max(logits)
        exps = [math.exp(x - top) for x in logits]
        total = 0.0
        for value in exps:
            total += value
        assert written == [value / total for value in exps]
