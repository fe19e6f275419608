"""Training time per epoch of `clef train-head` on the tiny fixture model.

    python benchmarks/quality/bench_train_head.py                      # 200 and 1000 records, 3 epochs
    python benchmarks/quality/bench_train_head.py --records 500 --epochs 5 --device cuda

Scores N text records once (hidden states kept, as `clef score` does by default), labels them
with random gold, then times `fit` (streaming stored states from the checkpoint shards, the
length-sorted token-budget batches, forward, loss, backward, AdamW) epoch by epoch. The first
epoch includes one-off costs (imports, allocator warm-up) and is reported apart.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.score.bench_score import QUESTIONS, text_records  # noqa: E402

MODEL = ROOT / "tests" / "fixtures" / "tiny-clef-omni"


def measure(records: int, epochs: int, batch_tokens: int, device: str, folder: Path) -> dict:
    from clef_cli.engines.local.pipeline import ScoreJob, ScoreSettings
    from clef_cli.families import family_of
    from clef_cli.model.backbone import resolve_device
    from clef_cli.model.head import load_joint_head
    from clef_cli.quality.train.fit import FitSettings, fit
    from clef_cli.quality.train.job import gold_examples
    from clef_cli.release import resolve_release
    from clef_cli.store.checkpoint import Checkpoint

    rows = text_records(records)
    inputs = folder / f"in-{records}.jsonl"
    inputs.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    rng = random.Random(1)
    gold = folder / f"gold-{records}.jsonl"
    labels = [
        {"id": row["id"], "urgent": rng.random() < 0.5, "team": rng.choice(sorted(QUESTIONS["team"]["criteria"])),
         "severity": rng.randrange(4)}
        for row in rows
    ]  # fmt: skip
    gold.write_text("".join(json.dumps(label) + "\n" for label in labels), encoding="utf-8")
    output = folder / f"out-{records}.parquet"
    ScoreJob(ScoreSettings([inputs], output, model=str(MODEL), device=device, workers=0)).run()
    reader = Checkpoint.open_existing(Path(str(output) + ".ckpt")).hidden_reader()
    examples, _ = gold_examples(reader, gold)
    release = resolve_release(str(MODEL))
    torch_device = resolve_device(device)
    lexical = family_of(release).lexical_rows(release).to(torch_device)
    head = load_joint_head(release.path)
    stamps = [time.perf_counter()]
    fit(
        head, lexical, examples, FitSettings(epochs=epochs, lr=1e-3, batch_tokens=batch_tokens), 0, torch_device,
        lambda epoch, loss: stamps.append(time.perf_counter()),
    )  # fmt: skip
    times = [b - a for a, b in itertools.pairwise(stamps)]
    tokens = sum(example.stored.length for example in examples)
    steady = sum(times[1:]) / max(1, len(times) - 1)
    return {
        "records": len(examples),
        "tokens": tokens,
        "first_epoch_s": round(times[0], 3),
        "epoch_s": round(steady, 3),
        "records_per_s": round(len(examples) / steady, 1),
        "tokens_per_s": round(tokens / steady),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", default="200,1000", help="comma-separated record counts")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per count (the first is reported apart)")
    parser.add_argument("--batch-tokens", type=int, default=16384, help="as clef train-head --batch-tokens")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for count in (int(value) for value in arguments.records.split(",")):
            result = measure(count, arguments.epochs, arguments.batch_tokens, arguments.device, Path(folder))
            print(json.dumps({"device": arguments.device, "batch_tokens": arguments.batch_tokens, **result}))


if __name__ == "__main__":
    main()
