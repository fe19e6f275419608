"""clef train-head: planted tasks learned up to the probe's yardstick and gated, shuffled labels
refused from the release head, round trip through --rehead, refusals, and the loss, probe,
recalibration, gate rule, bootstrap and folds against independent oracles."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from clef_cli.cli import app
from tests.support import background
from tests.support.helpers import TINY_MODEL
from tests.support.planted import planted_task, write_jsonl

runner = CliRunner()
QUICK = ["--folds", "3", "--device", "cpu"]
TRAIN = 45  # labelled records of the quick planted task; the rest of `planted` is never seen


def score_planted(task: str, count: int, folder: Path) -> dict:
    from clef_cli.engines.local.pipeline import ScoreJob, ScoreSettings

    inputs, gold = planted_task(task, count, folder)
    output = folder / "out.parquet"
    settings = ScoreSettings(
        inputs=[inputs], output=output, model=str(TINY_MODEL), device="cpu", hidden_dtype="float32", workers=0
    )
    ScoreJob(settings).run()
    return {"inputs": inputs, "output": output, "checkpoint": folder / "out.parquet.ckpt", "answers": gold}


@pytest.fixture(scope="module")
def planted():
    """The image task (the colour of a square is the answer), 70 records scored once with hidden
    states kept; gold for the first 45. The keyword task needs more records than the quick loop
    can afford (90 labelled: trained 0.52, probe 0.68 cross-fitted); it runs at full size below.
    Scored, with `trained_small`'s run, in a subprocess started with the session
    (tests/support/background_jobs.py: planted), beside the other tests."""
    task = dict(background.run("planted").result()["planted"])
    for key in ("inputs", "output", "checkpoint", "gold"):
        task[key] = Path(task[key])
    return task


def train(checkpoint: Path, gold: Path, output: Path, *extra: str):
    arguments = ["train-head", str(checkpoint), "--gold", str(gold), "-o", str(output), "--quiet", *extra]
    return runner.invoke(app, arguments)


def rehead(task: dict, head: Path, output: Path):
    return runner.invoke(
        app,
        ["score", str(task["inputs"]), "-o", str(output), "--model", str(TINY_MODEL), "--checkpoint",
         str(task["checkpoint"]), "--rehead", str(head), "--device", "cpu", "--quiet"],
    )  # fmt: skip


def unseen_accuracy(path: Path, answers: list[dict], first_unseen: int) -> float:
    """Top answer of the planted question against the planted answer, on records never labelled."""
    rows = {row["id"]: row for row in pq.read_table(path).to_pylist()}
    hits = []
    for gold in answers[first_unseen:]:
        ((question, expected),) = ((k, v) for k, v in gold.items() if k != "id")
        answer = next(a for a in rows[gold["id"]]["answers"] if a["question_id"] == question)
        hits.append(answer["answer"] == (str(expected) if answer["type"] == "score" else expected))
    return sum(hits) / len(hits)


def sklearn_probe_accuracy(checkpoint: Path, train_answers: list[dict], held_answers: list[dict]) -> float:
    """scikit-learn's StandardScaler + LogisticRegression(C=1) on mean, last and max pooled states."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    from clef_cli.store.checkpoint import Checkpoint

    stored = {r.id: r for r in Checkpoint.open_existing(checkpoint).hidden_reader().records()}

    def pooled(rows):
        states = [stored[row["id"]].hidden.double().numpy() for row in rows]
        return np.stack([np.concatenate([s.mean(axis=0), s[-1], s.max(axis=0)]) for s in states])

    label = lambda rows: [str(next(v for k, v in row.items() if k != "id")) for row in rows]  # noqa: E731
    scaler = StandardScaler().fit(pooled(train_answers))
    model = LogisticRegression(C=1.0, max_iter=10000).fit(scaler.transform(pooled(train_answers)), label(train_answers))
    return float(model.score(scaler.transform(pooled(held_answers)), label(held_answers)))


# ----------------------------------------------------------------------------- the whole loop


@pytest.fixture(scope="module")
def trained_small(planted):
    """The quick loop's planted task: default recipe, 45 labelled records, 3 folds (`train` with
    QUICK, run by the planted job; its CliRunner result's exit code and streams come back)."""
    trained = background.run("planted").result()["trained"]
    result = SimpleNamespace(**{key: trained[key] for key in ("exit_code", "stdout", "stderr", "output")})
    return {"result": result, "head": Path(trained["head"])}


def test_planted_image_cue_is_learned_up_to_the_probe_and_the_gate_passes(planted, trained_small, tmp_path):
    result, head = trained_small["result"], trained_small["head"]
    assert result.exit_code == 0, result.output
    report = json.loads((head / "training_report.json").read_text())
    assert report["gate"]["passed"] and not report["gate"]["forced"]
    assert report["gate"]["few_labels"] == ["colour"] and "fewer than 50 labels" in result.stderr
    colour = report["by_question"]["colour"]
    print({name: colour[name] for name in ("base", "calibrated_base", "trained", "probe")})
    assert colour["trained"]["accuracy"] >= 0.8 * colour["probe"]["accuracy"]
    assert rehead(planted, head, tmp_path / "re.parquet").exit_code == 0
    before = unseen_accuracy(planted["output"], planted["answers"], TRAIN)
    after = unseen_accuracy(tmp_path / "re.parquet", planted["answers"], TRAIN)
    probe = sklearn_probe_accuracy(planted["checkpoint"], planted["answers"][:TRAIN], planted["answers"][TRAIN:])
    print(f"unseen records: release head {before:.3f}, trained {after:.3f}, scikit-learn probe {probe:.3f}")
    assert before < 0.6 and probe >= 0.8 and after >= 0.8 * probe


def test_report_probe_matches_scikit_learn_on_the_same_folds(planted, trained_small):
    """The report's probe column, recomputed by scikit-learn from the stored states, pooled here
    by numpy, on the folds `assign_folds` deals (an independent fit of each fold)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss
    from sklearn.preprocessing import StandardScaler

    from clef_cli.quality.train.folds import assign_folds
    from clef_cli.quality.train.job import gold_examples
    from clef_cli.store.checkpoint import Checkpoint

    report = json.loads((trained_small["head"] / "training_report.json").read_text())
    examples, _ = gold_examples(Checkpoint.open_existing(planted["checkpoint"]).hidden_reader(), planted["gold"])
    folds = np.array(assign_folds(examples, report["settings"]["folds"], report["settings"]["seed"]))
    states = {
        r.id: r.hidden.double().numpy()
        for r in Checkpoint.open_existing(planted["checkpoint"]).hidden_reader().records()
    }
    x = np.stack(
        [np.concatenate([s.mean(axis=0), s[-1], s.max(axis=0)]) for s in (states[e.stored.id] for e in examples)]
    )
    y = np.array([e.targets[0] for e in examples])
    probabilities = np.zeros((len(y), 3))
    for fold in np.unique(folds):
        train, held = folds != fold, folds == fold
        scaler = StandardScaler().fit(x[train])
        model = LogisticRegression(C=1.0, max_iter=10000, tol=1e-10).fit(scaler.transform(x[train]), y[train])
        probabilities[held] = model.predict_proba(scaler.transform(x[held]))
    probe = report["by_question"]["colour"]["probe"]
    assert probe["labels"] == len(y)
    assert probe["accuracy"] == pytest.approx(np.mean(probabilities.argmax(axis=1) == y), abs=1.5 / len(y))
    assert probe["log_loss"] == pytest.approx(log_loss(y, probabilities, labels=[0, 1, 2]), rel=1e-3)


PLANTED_SIZES = {"keyword": 0.9, "long": 0.9, "image": 0.9, "count": 0.9}


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(PLANTED_SIZES))
def test_planted_tasks_reach_the_probe_at_full_size(task):
    """240 labelled records, 200 unseen, default settings: the trained head's accuracy on the
    unseen records reaches 0.9x a scikit-learn probe fitted on the same 240 records. Run in a
    subprocess started with the session (tests/support/background_jobs.py: planted_at_full_size)."""
    outcome = background.run(f"planted-{task}").result()
    assert outcome["train"]["exit_code"] == 0, outcome["train"]["output"]
    assert outcome["rehead"]["exit_code"] == 0, outcome["rehead"]["output"]
    print(f"{task}: release head {outcome['before']:.3f}, trained {outcome['after']:.3f}, probe {outcome['probe']:.3f}")
    assert outcome["after"] >= PLANTED_SIZES[task] * outcome["probe"]


@pytest.mark.slow  # the quick loop's budget (issue 36.12): CI's whole run has it
def test_shuffled_labels_from_the_release_head_are_refused(planted, tmp_path):
    """Shuffled labels carry no signal about the record, only their frequencies (skewed here, 3/4
    red, so a head gains held-out log loss over the raw release head by learning them, and the
    old gate passed). The recalibrated release head fits the same frequencies and confidence on
    the training folds, so nothing is left to gain and the gate refuses."""
    answers = planted["answers"][:TRAIN]
    colours = ["red"] * 34 + ["green"] * 6 + ["blue"] * 5
    random.Random(3).shuffle(colours)
    rows = [{"id": r["id"], "colour": c} for r, c in zip(answers, colours, strict=True)]
    gold = write_jsonl(tmp_path / "shuffled.jsonl", rows)
    head = tmp_path / "head"
    result = train(planted["checkpoint"], gold, head, *QUICK)
    print(result.stderr.strip().splitlines()[-1])
    assert result.exit_code == 4, result.output
    assert "nothing written" in result.stderr and not head.exists()


def test_round_trip_rehead_equals_in_memory_scoring_and_bytes_repeat(planted, tmp_path):
    from clef_cli.families import family_of
    from clef_cli.model.head import load_joint_head
    from clef_cli.model.scoring import head_logits
    from clef_cli.quality.train.fit import FitSettings
    from clef_cli.quality.train.job import TrainHeadSettings, train_head
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
        stored = stored[:16]
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
    inputs, _ = planted_task("keyword", 4, tmp_path)
    settings = ScoreSettings([inputs], dropped, model=str(TINY_MODEL), device="cpu", hidden_states="drop", workers=0)
    ScoreJob(settings).run()
    result = train(Path(str(dropped) + ".ckpt"), planted["gold"], tmp_path / "h1")
    assert result.exit_code == 2 and "pass --records with the records it scored" in result.stderr
    # --records whose records carry no questions (their job read --questions) without --questions
    # named no flag ("holds no hidden states ... pass --records"); now it is refused before the thinker runs
    bare = [{k: v for k, v in json.loads(line).items() if k != "questions"} for line in inputs.read_text().splitlines()]
    store = Path(f"{dropped}.ckpt")
    before = {str(path): path.stat().st_mtime_ns for path in store.rglob("*")}
    result = train(store, planted["gold"], tmp_path / "h4", "--records", str(write_jsonl(tmp_path / "b.jsonl", bare)))
    assert result.exit_code == 2 and result.stderr == (
        "error: --records: record 'r0' carries no questions; add --questions with the file its job was scored with\n"
    )
    assert {str(path): path.stat().st_mtime_ns for path in store.rglob("*")} == before

    stranger = write_jsonl(tmp_path / "stranger.jsonl", [{"id": "nobody", "colour": "red"}])
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
    for refused in ("h1", "h2", "h3", "h4"):
        assert not (tmp_path / refused).exists()
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1


def edited_store(folder: Path) -> dict:
    """A store used by two runs of 30 text records; the second edits r0, r1 and r2 (the same ids,
    other text), so the store holds 33 prompts, three of them under an id used twice."""
    from clef_cli.engines.local.pipeline import ScoreJob, ScoreSettings

    questions = folder / "questions.json"
    questions.write_text(json.dumps({"urgent": {"type": "noul", "instructions": "Is it urgent?"}}))
    checkpoint = folder / "store"
    outputs = []
    for run, edited in enumerate(((), ("r0", "r1", "r2"))):
        rows = [{"id": f"r{i}", "state": f"post {i}" + (" (edited)" if f"r{i}" in edited else "")} for i in range(30)]
        inputs = write_jsonl(folder / f"in{run}.jsonl", rows)
        output = folder / f"out{run}.parquet"
        ScoreJob(ScoreSettings([inputs], output, model=str(TINY_MODEL), device="cpu", hidden_dtype="float32",
                               workers=0, questions=questions, checkpoint=checkpoint)).run()  # fmt: skip
        outputs.append(output)
    gold = write_jsonl(folder / "gold.jsonl", [{"id": f"r{i}", "urgent": i % 2 == 0} for i in range(30)])
    return {"checkpoint": checkpoint, "outputs": outputs, "gold": gold, "questions": questions}


def test_a_gold_id_names_the_prompt_of_the_latest_run_not_every_stored_one(tmp_path):
    """Defect: 30 gold rows trained 33 records (r0..r2 old and edited). Now the latest run's
    prompt is taken (30 records, r0's the edited one); `--scored` of the first run maps to the
    old ones; once a later run used neither, train-head refuses naming the ids and the fix."""
    from clef_cli.engines.local.pipeline import ScoreJob, ScoreSettings
    from clef_cli.quality.labels.stored import stored_keys
    from clef_cli.quality.train.job import gold_examples
    from clef_cli.store.checkpoint import Checkpoint

    store = edited_store(tmp_path)
    tables = [pq.read_table(out, columns=["id", "record_key"]).to_pydict() for out in store["outputs"]]
    keys = [dict(zip(table["id"], table["record_key"], strict=True)) for table in tables]
    assert all(keys[0][f"r{i}"] != keys[1][f"r{i}"] for i in range(3)) and keys[0]["r3"] == keys[1]["r3"]

    def examples(scored: Path | None = None) -> tuple[dict[str, str], list[str]]:
        """Gold id -> the record_key of the stored prompt it trains, and the notes."""
        checkpoint = Checkpoint.open_existing(store["checkpoint"])
        key_of = {(r.shard, r.index): key for key, r in stored_keys(checkpoint, checkpoint.hidden_reader())}
        notes: list[str] = []
        found, _ = gold_examples(checkpoint.hidden_reader(), store["gold"], checkpoint=checkpoint, scored=scored,
                                 notes=notes)  # fmt: skip
        checkpoint.close()
        trained = [(e.stored.id, key_of[(e.stored.shard, e.stored.index)]) for e in found]
        assert len(trained) == len(dict(trained))  # one stored prompt per gold id
        return dict(trained), notes

    latest, notes = examples()
    assert latest == keys[1] and len(latest) == 30  # not 33
    assert len(notes) == 1 and notes[0].startswith("3 gold ids with several stored prompts")
    assert examples(store["outputs"][0]) == (keys[0], [])
    assert examples(store["outputs"][1]) == (keys[1], [])

    other = write_jsonl(tmp_path / "other.jsonl", [{"id": "x", "state": "another table"}])
    ScoreJob(ScoreSettings([other], tmp_path / "other.parquet", model=str(TINY_MODEL), device="cpu",
                           hidden_dtype="float32", workers=0, questions=store["questions"],
                           checkpoint=store["checkpoint"])).run()  # fmt: skip
    result = train(store["checkpoint"], store["gold"], tmp_path / "head", *QUICK)
    assert result.exit_code == 2, result.output
    assert "3 ids with several stored prompts" in result.stderr and "'r0', 'r1', 'r2'" in result.stderr
    assert "--scored OUT.parquet" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "head").exists()
    assert examples(store["outputs"][1]) == (keys[1], [])


# ----------------------------------------------------------------------------- oracles


def test_loss_terms_against_direct_loops():
    from sklearn.metrics import log_loss

    from clef_cli.quality.train.fit import question_losses

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

    from clef_cli.quality.train.gate import paired_bootstrap

    values = np.random.default_rng(1).normal(-0.05, 0.3, size=150)
    low, high = paired_bootstrap(values, 20000, seed=0)
    oracle = bootstrap((values,), np.mean, n_resamples=20000, method="percentile", rng=np.random.default_rng(5))
    width = high - low
    assert low == pytest.approx(oracle.confidence_interval.low, abs=0.05 * width)
    assert high == pytest.approx(oracle.confidence_interval.high, abs=0.05 * width)


def test_folds_keep_duplicate_prompts_together():
    from types import SimpleNamespace

    from clef_cli.quality.train.folds import assign_folds

    ids = [[1, 2, 3]] * 7 + [[4, 5]] * 3 + [[n, n + 1] for n in range(10, 40)]
    examples = [SimpleNamespace(stored=SimpleNamespace(input_ids=i), targets=(0,)) for i in ids]
    folds = assign_folds(examples, 4, seed=0)
    assert len(set(folds[:7])) == 1 and len(set(folds[7:10])) == 1
    assert sorted(np.bincount(folds, minlength=4).tolist()) == [10, 10, 10, 10]
    assert folds == assign_folds(examples, 4, seed=0) != assign_folds(examples, 4, seed=1)
