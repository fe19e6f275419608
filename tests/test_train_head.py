"""clef train-head: planted signal learned and gated, shuffled labels refused, round trip through
--rehead, refusals, and the loss / bootstrap / folds against independent oracles."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from clef_cli.cli import app
from tests.helpers import TINY_MODEL

runner = CliRunner()
KEYWORDS = {"apple": "fruit", "river": "water", "violet": "color"}
FILLER = "the a report about some thing that happened today in town with people and more news".split()
# The tiny random head needs a large step to find the keyword in a few epochs.
FAST = ["--epochs", "8", "--lr", "1e-2", "--batch-tokens", "4096", "--device", "cpu"]


def planted_records(count: int, seed: int = 7) -> list[dict]:
    """Filler text with one of three keywords (four times: once among ~450 prompt tokens is too
    faint for the tiny random thinker); `topic` (choice) and `is_fruit` (noul) follow it."""
    rng = random.Random(seed)
    records = []
    for number in range(count):
        keyword = rng.choice(sorted(KEYWORDS))
        words = rng.choices(FILLER, k=rng.randint(6, 14))
        for _ in range(4):
            words.insert(rng.randint(0, len(words)), keyword)
        questions = {
            "topic": {
                "type": "choice",
                "instructions": "What is it about?",
                "criteria": dict.fromkeys(KEYWORDS.values()),
            },
            "is_fruit": {"type": "noul", "instructions": "Is it about fruit?"},
        }
        records.append({"id": f"r{number}", "state": " ".join(words), "questions": questions, "keyword": keyword})
    return records


def gold_row(record: dict) -> dict:
    return {"id": record["id"], "topic": KEYWORDS[record["keyword"]], "is_fruit": record["keyword"] == "apple"}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """400 records scored once with hidden states kept; gold for the first 200 (training)."""
    from clef_cli.engines.local.pipeline import ScoreJob, ScoreSettings

    root = tmp_path_factory.mktemp("planted")
    records = planted_records(400)
    inputs = write_jsonl(root / "in.jsonl", [{k: v for k, v in r.items() if k != "keyword"} for r in records])
    output = root / "out.parquet"
    settings = ScoreSettings(
        inputs=[inputs], output=output, model=str(TINY_MODEL), device="cpu", hidden_dtype="float32", workers=0
    )
    ScoreJob(settings).run()
    gold = write_jsonl(root / "gold.jsonl", [gold_row(r) for r in records[:200]])
    checkpoint = root / "out.parquet.ckpt"
    return {"records": records, "inputs": inputs, "output": output, "checkpoint": checkpoint, "gold": gold}


def train(checkpoint: Path, gold: Path, output: Path, *extra: str):
    arguments = ["train-head", str(checkpoint), "--gold", str(gold), "-o", str(output), "--quiet", *extra]
    return runner.invoke(app, arguments)


def rehead(planted: dict, head: Path, output: Path):
    return runner.invoke(
        app,
        ["score", str(planted["inputs"]), "-o", str(output), "--model", str(TINY_MODEL), "--checkpoint",
         str(planted["checkpoint"]), "--rehead", str(head), "--device", "cpu", "--quiet"],
    )  # fmt: skip


def choice_accuracy(path: Path, records: list[dict]) -> float:
    """Top option of `topic` against the keyword, on the records not used for training."""
    rows = {row["id"]: row for row in pq.read_table(path).to_pylist()}
    hits = [
        next(a["answer"] for a in rows[r["id"]]["answers"] if a["question_id"] == "topic") == KEYWORDS[r["keyword"]]
        for r in records[200:]
    ]
    return sum(hits) / len(hits)


# ----------------------------------------------------------------------------- the whole loop


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_planted_signal_is_learned_and_the_gate_passes(planted, tmp_path, seed):
    head = tmp_path / "head"
    result = train(planted["checkpoint"], planted["gold"], head, *FAST, "--seed", str(seed))
    assert result.exit_code == 0, result.output
    report = json.loads((head / "training_report.json").read_text())
    assert report["gate"] == {**report["gate"], "passed": True, "forced": False}
    difference = report["held_out"]["log_loss_difference"]
    assert difference["mean"] < 0 and difference["ci95"][1] < 0
    assert rehead(planted, head, tmp_path / "re.parquet").exit_code == 0
    before = choice_accuracy(planted["output"], planted["records"])
    after = choice_accuracy(tmp_path / "re.parquet", planted["records"])
    print(f"seed {seed}: held-out choice accuracy {before:.3f} -> {after:.3f}; gate {difference}")
    assert before < 0.5 and after >= 0.8


def uniform_head(folder: Path) -> Path:
    """The fixture head with its output path zeroed: every question starts at exactly uniform
    probabilities, yet the residual scorer still gets gradients and can learn."""
    from safetensors.torch import load_file, save_file

    folder.mkdir()
    state = load_file(str(TINY_MODEL / "joint_head.safetensors"))
    state["residual_scorer.3.weight"].zero_()
    state["residual_scorer.3.bias"].zero_()
    state["prior_logit_scale"].fill_(-30.0)
    state["joint_logit_scale"].fill_(-30.0)
    save_file(state, str(folder / "joint_head.safetensors"))
    (folder / "joint_head_config.json").write_bytes((TINY_MODEL / "joint_head_config.json").read_bytes())
    return folder


@pytest.mark.slow
def test_shuffled_labels_are_refused_and_nothing_is_written(planted, tmp_path):
    """Shuffled labels carry no signal. A head that is miscalibrated still gains held-out log loss
    by learning the label frequencies alone (a real gain the gate rightly accepts), so this test
    starts from a head that is already optimal without the signal: uniform probabilities, on the
    balanced `topic` question. The same start with the true labels passes, so the refusal comes
    from the labels, not from a head that cannot learn."""
    base = uniform_head(tmp_path / "uniform")
    records = planted["records"][:200]
    topics = [KEYWORDS[r["keyword"]] for r in records]
    assert max(topics.count(t) for t in set(topics)) < 0.4 * len(topics)  # balanced: uniform is the best guess
    shuffled = topics[:]
    random.Random(3).shuffle(shuffled)
    for name, labels, code in (("true", topics, 0), ("shuffled", shuffled, 4)):
        rows = [{"id": r["id"], "topic": t} for r, t in zip(records, labels, strict=True)]
        gold = write_jsonl(tmp_path / f"{name}.jsonl", rows)
        head = tmp_path / f"head-{name}"
        result = train(planted["checkpoint"], gold, head, *FAST, "--base-head", str(base))
        print(name, result.stderr.strip().splitlines()[-1])
        assert result.exit_code == code, result.output
    assert "nothing written" in result.stderr and not head.exists()


def test_round_trip_rehead_equals_in_memory_scoring_and_bytes_repeat(planted, tmp_path):
    from clef_cli.families import family_of
    from clef_cli.model.head import load_joint_head
    from clef_cli.model.scoring import head_logits
    from clef_cli.quality.head_training import FitSettings
    from clef_cli.quality.train_head import TrainHeadSettings, train_head
    from clef_cli.release import resolve_release
    from clef_cli.store.checkpoint import Checkpoint
    from clef_cli.store.hidden_store import pad_states

    def run(output: Path):
        fit = FitSettings(epochs=1, lr=1e-3, batch_tokens=8192)
        checkpoint, gold = planted["checkpoint"], planted["gold"]
        return train_head(TrainHeadSettings(checkpoint, gold, output, fit=fit, folds=2, device="cpu", force=True))

    first, second = run(tmp_path / "a"), run(tmp_path / "b")
    weights = (tmp_path / "a" / "joint_head.safetensors").read_bytes()
    assert weights == (tmp_path / "b" / "joint_head.safetensors").read_bytes()
    assert first.report["new_head"]["sha256"] == second.report["new_head"]["sha256"]
    reloaded = load_joint_head(tmp_path / "a")  # strict
    pairs = zip(reloaded.state_dict().values(), first.head.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert rehead(planted, tmp_path / "a", tmp_path / "re.parquet").exit_code == 0
    rows = {row["id"]: row for row in pq.read_table(tmp_path / "re.parquet").to_pylist()}
    originals = {row["id"]: row for row in pq.read_table(planted["output"]).to_pylist()}
    moved = max(
        abs(a["probability"] - b["probability"])
        for key, row in rows.items()
        for x, y in zip(row["answers"], originals[key]["answers"], strict=True)
        for a, b in zip(x["labels"], y["labels"], strict=True)
    )
    assert moved > 1e-3  # the new head, not the release's, scored the rehead output
    release = resolve_release(str(TINY_MODEL))
    lexical = family_of(release).lexical_rows(release)
    compared = 0
    for _, stored in Checkpoint.open_existing(planted["checkpoint"]).hidden_reader().by_shard():
        stored = stored[:8]
        padded = pad_states([s.hidden for s in stored], max(s.length for s in stored))
        logits = head_logits(first.head, padded, lexical, [s.encoded for s in stored])
        for record, per_question in zip(stored, logits, strict=True):
            for answer, question_logits in zip(rows[record.id]["answers"], per_question, strict=True):
                expected = torch.softmax(question_logits.double(), dim=-1).tolist()
                got = [label["probability"] for label in answer["labels"]]
                assert np.allclose(got, expected, atol=1e-6, rtol=0)
                compared += 1
    assert compared >= 16


# ----------------------------------------------------------------------------- refusals


def test_refusals_are_one_line(planted, tmp_path):
    from clef_cli.engines.local.pipeline import ScoreJob, ScoreSettings
    from clef_cli.model.head import HeadConfig, JointSchemaHead

    dropped = tmp_path / "dropped.parquet"
    few = [{k: v for k, v in r.items() if k != "keyword"} for r in planted["records"][:4]]
    inputs = write_jsonl(tmp_path / "few.jsonl", few)
    settings = ScoreSettings([inputs], dropped, model=str(TINY_MODEL), device="cpu", hidden_states="drop", workers=0)
    ScoreJob(settings).run()
    result = train(Path(str(dropped) + ".ckpt"), planted["gold"], tmp_path / "h1")
    assert result.exit_code == 1 and "--hidden-states keep" in result.stderr

    stranger = write_jsonl(tmp_path / "stranger.jsonl", [{"id": "nobody", "topic": "fruit"}])
    result = train(planted["checkpoint"], stranger, tmp_path / "h2")
    assert result.exit_code == 2 and "matches no stored record" in result.stderr

    wide = tmp_path / "wide-head"
    wide.mkdir()
    config = {"hidden_size": 32, "width": 16, "routing_layers": 1, "layers": 1, "heads": 2, "feedforward": 24}
    (wide / "joint_head_config.json").write_text(json.dumps(config))
    from safetensors.torch import save_file

    save_file(JointSchemaHead(HeadConfig(**config)).state_dict(), str(wide / "joint_head.safetensors"))
    result = train(planted["checkpoint"], planted["gold"], tmp_path / "h3", "--base-head", str(wide))
    assert result.exit_code == 1 and "expects hidden size 32" in result.stderr
    for refused in ("h1", "h2", "h3"):
        assert not (tmp_path / refused).exists()
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- oracles


def test_loss_terms_against_direct_loops():
    from sklearn.metrics import log_loss

    from clef_cli.quality.head_training import question_losses

    rng = np.random.default_rng(0)
    sizes, types, targets = [2, 3, 4, 5], [0, 1, 2, 2], [1, 2, 0, 3]
    logits = [rng.normal(size=k) * 2 for k in sizes]
    grid = torch.full((4, 5), float("-inf"), dtype=torch.float64)
    for row, values in enumerate(logits):
        grid[row, : len(values)] = torch.tensor(values)
    present = torch.isfinite(grid)
    eps, weight = 0.1, 0.7
    got = question_losses(grid.log_softmax(-1), present, torch.tensor(targets), torch.tensor(types), eps, weight)
    for row, (values, kind, target) in enumerate(zip(logits, types, targets, strict=True)):
        p = np.exp(values - values.max())
        p /= p.sum()
        k = len(p)
        y = np.eye(k)[target]
        smoothed = (1 - eps) * y + eps / k
        ce = -sum(smoothed[i] * np.log(p[i]) for i in range(k))
        assert ce == pytest.approx((1 - eps) * log_loss([target], [p], labels=range(k)) - eps / k * np.log(p).sum())
        brier = sum((p[i] - y[i]) ** 2 for i in range(k))
        rps = sum((p[: j + 1].sum() - y[: j + 1].sum()) ** 2 for j in range(k - 1)) / (k - 1) if kind == 2 else 0.0
        assert float(got[row]) == pytest.approx(ce + weight * brier + rps, rel=1e-9)


def test_paired_bootstrap_matches_scipy():
    from scipy.stats import bootstrap

    from clef_cli.quality.train_head import paired_bootstrap

    values = np.random.default_rng(1).normal(-0.05, 0.3, size=150)
    low, high = paired_bootstrap(values, 20000, seed=0)
    oracle = bootstrap((values,), np.mean, n_resamples=20000, method="percentile", rng=np.random.default_rng(5))
    width = high - low
    assert low == pytest.approx(oracle.confidence_interval.low, abs=0.05 * width)
    assert high == pytest.approx(oracle.confidence_interval.high, abs=0.05 * width)


def test_folds_keep_duplicate_prompts_together():
    from types import SimpleNamespace

    from clef_cli.quality.train_head import assign_folds

    ids = [[1, 2, 3]] * 7 + [[4, 5]] * 3 + [[n, n + 1] for n in range(10, 40)]
    examples = [SimpleNamespace(stored=SimpleNamespace(input_ids=i), targets=(0,)) for i in ids]
    folds = assign_folds(examples, 4, seed=0)
    assert len(set(folds[:7])) == 1 and len(set(folds[7:10])) == 1
    assert sorted(np.bincount(folds, minlength=4).tolist()) == [10, 10, 10, 10]
    assert folds == assign_folds(examples, 4, seed=0) != assign_folds(examples, 4, seed=1)
