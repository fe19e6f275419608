"""Does `clef train-head` learn what the stored states hold? The planted tasks of
tests/support/planted.py, scored once with the tiny fixture model (hidden states kept in float32); the
first `--train` records are the gold file, the next `--held-out` records are never seen.

    python benchmarks/quality/bench_planted.py                          # all four tasks, seed 0
    python benchmarks/quality/bench_planted.py --tasks keyword --seeds 0,1,2

Per task and seed: held-out accuracy of the release head, of the trained head (`train_head` with
default settings, gate forced so the head is kept either way), and of the linear probe
(quality/probe.py) fitted on the same training records; the trained/probe ratio; the gate's
cross-fitted numbers; epochs run (all folds and the final head) and the median seconds per
epoch (training plus the inner-validation pass).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MODEL = ROOT / "tests" / "fixtures" / "tiny-clef-omni"


def score_task(task: str, count: int, folder: Path) -> tuple[Path, list[dict]]:
    from clef_cli.engines.local.pipeline import ScoreJob, ScoreSettings
    from tests.support.planted import planted_task

    inputs, gold = planted_task(task, count, folder)
    output = folder / "out.parquet"
    ScoreJob(ScoreSettings([inputs], output, model=str(MODEL), device="cpu", hidden_dtype="float32", workers=0)).run()
    return Path(str(output) + ".ckpt"), gold


def accuracy(head, lexical, examples) -> float:
    import torch

    from clef_cli.quality.train.fit import predict

    probabilities = predict(head, lexical, examples, 16384, torch.device("cpu"))
    hits = [int(torch.argmax(p[0])) == e.targets[0] for p, e in zip(probabilities, examples, strict=True)]
    return sum(hits) / len(hits)


def probe_accuracy(train, held) -> float:
    import numpy as np

    from clef_cli.quality.train.cross_fit import pooled_example_features
    from clef_cli.quality.train.probe import fit_probe

    classes = len(train[0].stored.encoded.record.questions[0].option_ids)
    probe = fit_probe(pooled_example_features(train), np.array([e.targets[0] for e in train]), classes)
    predicted = probe.log_probabilities(pooled_example_features(held)).argmax(axis=1)
    return float(np.mean(predicted == np.array([e.targets[0] for e in held])))


def run(task: str, seed: int, checkpoint: Path, gold: list[dict], train: int, folder: Path) -> dict:
    import numpy as np

    from clef_cli.families import family_of
    from clef_cli.model.head import load_joint_head
    from clef_cli.quality.train.job import TrainHeadSettings, gold_examples, train_head
    from clef_cli.release import resolve_release
    from clef_cli.store.checkpoint import Checkpoint
    from tests.support.planted import write_jsonl

    all_gold = write_jsonl(folder / "all-gold.jsonl", gold)
    examples, _ = gold_examples(Checkpoint.open_existing(checkpoint).hidden_reader(), all_gold)
    order = {row["id"]: number for number, row in enumerate(gold)}
    examples.sort(key=lambda example: order[example.stored.id])
    train_examples, held = examples[:train], examples[train:]
    gold_file = write_jsonl(folder / f"gold-{seed}.jsonl", gold[:train])
    epochs: list[float] = []

    class Timer:
        def stage(self, message: str) -> None:
            pass

        def epoch(self, run: str, epoch: int, total: int, loss: float) -> None:
            epochs.append(time.perf_counter())

    start = time.perf_counter()
    settings = TrainHeadSettings(checkpoint, gold_file, folder / f"head-{seed}", seed=seed, device="cpu", force=True)
    result = train_head(settings, Timer())
    release = resolve_release(str(MODEL))
    lexical = family_of(release).lexical_rows(release)
    report = result.report
    question = next(iter(report["by_question"]))
    trained, probe = accuracy(result.head, lexical, held), probe_accuracy(train_examples, held)
    return {
        "task": task,
        "seed": seed,
        "base": round(accuracy(load_joint_head(MODEL), lexical, held), 3),
        "trained": round(trained, 3),
        "probe": round(probe, 3),
        "trained_over_probe": round(trained / probe, 3),
        "gate": report["gate"]["passed"],
        "difference": report["held_out"]["log_loss_difference"],
        "cross_fitted": {
            k: v["accuracy"]
            for k, v in report["by_question"][question].items()
            if isinstance(v, dict) and "accuracy" in v
        },
        "epochs": len(epochs),
        "seconds_per_epoch": round(float(np.median(np.diff(epochs))), 2),
        "seconds_total": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="keyword,long,image,count")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--train", type=int, default=240)
    parser.add_argument("--held-out", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    with tempfile.TemporaryDirectory() as temporary:
        for task in arguments.tasks.split(","):
            folder = Path(temporary) / task
            folder.mkdir()
            checkpoint, gold = score_task(task, arguments.train + arguments.held_out, folder)
            for seed in (int(s) for s in arguments.seeds.split(",")):
                print(json.dumps(run(task, seed, checkpoint, gold, arguments.train, folder)), flush=True)


if __name__ == "__main__":
    main()
