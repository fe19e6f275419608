"""`--hidden-states selective` and hidden states computed on demand (issue 30): the records whose
states are kept are exactly those under the threshold plus the key-hash sample; `--rehead` and
train-head `--records` compute what is missing, and what they compute equals what a `keep` run
stores, bit for bit, down to a trained head's bytes. Every run here batches one record at a time
(`--max-batch-size 1`): another batch shape may sum in another order (1e-6 in fp32 states on the
tiny model, within tests/test_batch_invariance.py's 1e-5), and bit-for-bit equality is what is
tested."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.store.checkpoint import Checkpoint
from clef_cli.store.keep_policy import in_sample, sample_flags, sample_point
from tests.support.helpers import TINY_MODEL, assert_same_rows, write_jsonl
from tests.test_checkpoint import records, rows, second_head_release

runner = CliRunner()
BELOW_SAMPLE = 0.25


def score(inputs: Path, output: Path, *extra: str):
    return runner.invoke(
        app,
        ["score", str(inputs), "-o", str(output), "--model", str(TINY_MODEL), "--workers", "0", "--max-batch-size",
         "1", "--quiet", *extra],
    )  # fmt: skip


def confidences(path: Path) -> dict[str, tuple[float, str]]:
    """id -> (review's confidence from the written probabilities, record_key): an oracle written
    from the README's definition, not from keep_policy."""
    found = {}
    for row in pq.read_table(path).to_pylist():
        tops = [max(label["probability"] for label in answer["labels"]) for answer in row["answers"]]
        found[row["id"]] = (min(tops), row["record_key"])
    return found


def stored_states(checkpoint: Path) -> dict[str, torch.Tensor]:
    """id -> stored hidden states, through the store's one reader (the latest shard wins)."""
    store = Checkpoint.open_existing(checkpoint)
    try:
        return {record.id: record.hidden for record in store.hidden_reader().records()}
    finally:
        store.close()


def test_the_sample_is_a_salted_hash_of_the_key_and_about_the_fraction():
    keys = [hashlib.sha256(str(number).encode()).hexdigest() for number in range(20000)]
    oracle = [int(hashlib.sha256(b"clef.keep-sample.v1:" + key.encode()).hexdigest()[:16], 16) / 2**64 for key in keys]
    assert [sample_point(key) for key in keys] == oracle
    chosen = sum(in_sample(key, 0.02) for key in keys)
    assert 300 <= chosen <= 500  # 400 expected; 5 standard deviations either side
    flags = sample_flags(enumerate(keys), len(keys), 0.02)
    assert list(flags) == [int(point < 0.02) for point in oracle]
    assert not in_sample(None, 1.0) and not any(sample_flags(enumerate(keys), len(keys), 0.0))


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The same 24 records scored with every state kept and with `selective` (threshold: the
    median confidence, a 25% sample), states in float32."""
    folder = tmp_path_factory.mktemp("keep-policy")
    inputs = write_jsonl(folder / "in.jsonl", records())
    keep = folder / "keep.parquet"
    assert score(inputs, keep, "--hidden-dtype", "float32").exit_code == 0
    known = confidences(keep)
    below = sorted(confidence for confidence, _ in known.values())[len(known) // 2]
    selective = folder / "selective.parquet"
    chosen = ("--hidden-states", "selective", "--keep-below", str(below), "--keep-sample", str(BELOW_SAMPLE))
    done = score(inputs, selective, "--hidden-dtype", "float32", *chosen)
    assert done.exit_code == 0, done.output
    expected = {rid for rid, (confidence, key) in known.items() if confidence < below or in_sample(key, BELOW_SAMPLE)}
    return {"folder": folder, "inputs": inputs, "keep": keep, "selective": selective, "expected": expected}


@pytest.mark.slow  # three scoring runs of 24 records, one at a time
def test_selective_stores_the_states_of_exactly_the_uncertain_and_the_sampled(stores):
    stored = stored_states(Path(str(stores["selective"]) + ".ckpt"))
    assert set(stored) == stores["expected"]
    assert 0 < len(stored) < 24
    assert_same_rows(rows(stores["selective"]), rows(stores["keep"]))  # results do not depend on the policy
    metadata = pq.read_schema(stores["selective"]).metadata
    assert metadata[b"clef.hidden_states"] == b"selective" and metadata[b"clef.keep_sample"] == b"0.25"


@pytest.mark.slow  # three scoring runs of 24 records, one at a time
def test_rehead_computes_the_missing_states_which_equal_the_kept_ones(stores, tmp_path):
    """`--rehead` on a selective store runs the thinker on the records without states only,
    stores them (equal bit for bit to a keep run's) and re-scores as on the keep store."""
    second_head_release(tmp_path)
    head = str(tmp_path / "head-b")
    from_keep, from_selective = tmp_path / "keep-b.parquet", tmp_path / "selective-b.parquet"
    keep_ckpt, selective_ckpt = str(stores["keep"]) + ".ckpt", str(stores["selective"]) + ".ckpt"
    assert score(stores["inputs"], from_keep, "--checkpoint", keep_ckpt, "--rehead", head).exit_code == 0
    done = score(stores["inputs"], from_selective, "--checkpoint", selective_ckpt, "--rehead", head)
    assert done.exit_code == 0, done.output
    missing = 24 - len(stores["expected"])
    assert f"computed the hidden states of {missing} stored records without them" in done.stderr
    assert pq.read_schema(from_selective).metadata[b"clef.rehead_states_computed"] == str(missing).encode()
    assert_same_rows(rows(from_selective), rows(from_keep))
    kept, computed = stored_states(Path(keep_ckpt)), stored_states(Path(selective_ckpt))
    assert set(computed) == set(kept)
    assert all(torch.equal(computed[rid], kept[rid]) and computed[rid].dtype == torch.float32 for rid in kept)
    again = score(stores["inputs"], tmp_path / "again.parquet", "--checkpoint", selective_ckpt, "--rehead", head)
    assert again.exit_code == 0 and "computed the hidden states" not in again.stderr
    assert pq.read_schema(tmp_path / "again.parquet").metadata[b"clef.rehead_states_computed"] == b"0"


def gold_rows(count: int) -> list[dict]:
    """Labels for the first `count` records of tests/test_checkpoint.records (seeded, arbitrary)."""
    rng = random.Random(3)
    options = {"urgent": ["true", "false"], "team": ["billing", "tech", "other"], "level": ["low", "mid", "high"]}
    gold = []
    for record in records()[:count]:
        question = next(iter(record["questions"]))
        gold.append({"id": record["id"], "labels": {question: rng.choice(options[question])}})
    return gold


@pytest.mark.slow
def test_a_head_trained_from_states_computed_on_demand_is_the_same_bytes(stores, tmp_path):
    """States computed on demand for the gold records of a `drop` store (`gold_states`, what
    train-head `--records` runs) train the same head (same seed, same bytes) as a store that kept
    them at scoring time; and `--records` through the CLI computes them and says so."""
    from clef_cli.engines.on_demand import gold_states

    gold = write_jsonl(tmp_path / "gold.jsonl", gold_rows(18))
    dropped, kept, cli = tmp_path / "drop.parquet", tmp_path / "kept.parquet", tmp_path / "cli.parquet"
    for output in (dropped, cli):
        assert score(stores["inputs"], output, "--hidden-states", "drop").exit_code == 0
    assert score(stores["inputs"], kept).exit_code == 0  # bfloat16, the default, as on demand without a dtype
    cost = gold_states(Path(f"{dropped}.ckpt"), [stores["inputs"]], gold, device="cpu", max_batch_size=1)
    assert (cost.records, cost.wanted) == (18, 18) and cost.tokens > 0
    assert set(stored_states(Path(f"{dropped}.ckpt"))) == {row["id"] for row in gold_rows(18)}
    common = ["--gold", str(gold), "--folds", "2", "--epochs", "2", "--device", "cpu", "--force", "--quiet"]
    heads = {}
    for name, output in (("kept", kept), ("computed", dropped)):
        done = runner.invoke(app, ["train-head", f"{output}.ckpt", "-o", str(tmp_path / name), *common])
        assert done.exit_code == 0, done.output
        heads[name] = (tmp_path / name / "joint_head.safetensors").read_bytes()
    assert heads["computed"] == heads["kept"]
    done = runner.invoke(
        app, ["train-head", f"{cli}.ckpt", "-o", str(tmp_path / "cli"), *common, "--records", str(stores["inputs"])]
    )
    assert done.exit_code == 0, done.output
    assert "computed the hidden states of 18 stored records without them" in done.stderr
    reports = [json.loads((tmp_path / name / "training_report.json").read_text()) for name in ("cli", "kept")]
    assert reports[0]["gold"] == reports[1]["gold"] and reports[0]["gold"]["records"] > 0


def test_the_disk_guard_counts_only_what_selective_will_surely_store(tmp_path, monkeypatch):
    """A disk too small for every state refuses `keep`; `selective` over an empty store is
    counted at its sample (here none), so it starts, and the dry run shows both sizes."""
    inputs = write_jsonl(tmp_path / "in.jsonl", records(6))
    output = tmp_path / "out.parquet"
    plan = score(inputs, output, "--dry-run", "--hidden-states", "selective", "--keep-sample", "0")
    assert "hidden states on disk with --hidden-states selective (this run): about 0 B to " in plan.stdout
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    refused = score(inputs, output)
    assert refused.exit_code == 1 and "--hidden-states selective" in refused.stderr
    done = score(inputs, output, "--hidden-states", "selective", "--keep-sample", "0", "--keep-below", "0")
    assert done.exit_code == 0, done.output
    assert stored_states(Path(f"{output}.ckpt")) == {}


@pytest.mark.parametrize("policy", [pytest.param("drop", marks=pytest.mark.slow), "selective"])
def test_every_policy_counts_the_tokens_it_ran(tmp_path, policy):
    """A run that keeps fewer states forwards the same prompts: its token count (summary, stats,
    output) is a keep run's, not only the kept records'."""
    inputs = write_jsonl(tmp_path / "r.jsonl", records(6))
    counted = {}
    for name in ("keep", policy):
        stats = tmp_path / f"{name}.json"
        keeps_none = ("--keep-below", "0.0", "--keep-sample", "0.0") if name == "selective" else ()
        result = score(inputs, tmp_path / f"{name}.parquet", "--hidden-states", name, "--stats-json", str(stats),
                       *keeps_none)  # fmt: skip
        assert result.exit_code == 0, result.output
        counted[name] = json.loads(stats.read_text())["tokens"]
    want = sum(row["prompt_tokens"] for row in pq.read_table(tmp_path / "keep.parquet").to_pylist())
    assert counted == {"keep": want, policy: want} and want > 0
