"""Storage of `--hidden-states selective` as a fraction of `keep`, measured on the planted tasks
of tests/support/planted.py with the tiny fixture model: each task is scored twice (keep, then selective
into its own checkpoint), and the hidden-state bytes of the two stores are compared
(`checkpoint info`'s hidden_bytes), with the share of records under the threshold.

    python benchmarks/store/bench_selective.py                            # threshold 0.6, 2% sample
    python benchmarks/store/bench_selective.py --tasks keyword --count 200 --keep-below 0.5 --json out.json

The tiny model's release head is untrained: on a three-way question its top probability is
near 1/3, so most records fall under 0.6; the share under the threshold is what drives the
fraction, and it is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MODEL = ROOT / "tests" / "fixtures" / "tiny-clef-omni"


def measure(task: str, count: int, below: float, sample: float, folder: Path) -> dict:
    import pyarrow.parquet as pq

    from clef_cli.engines.local.pipeline import ScoreJob, ScoreSettings
    from clef_cli.store.checkpoint import Checkpoint
    from tests.support.planted import planted_task

    inputs, _ = planted_task(task, count, folder)
    sizes = {}
    for policy in ("keep", "selective"):
        output = folder / f"{policy}.parquet"
        settings = ScoreSettings(
            [inputs], output, model=str(MODEL), device="cpu", workers=0, hidden_states=policy, keep_below=below,
            keep_sample=sample,
        )  # fmt: skip
        ScoreJob(settings).run()
        store = Checkpoint.open_existing(Path(f"{output}.ckpt"))
        try:
            stored = sum(1 for _ in store.hidden_reader().records(states=False, verify=False))
            sizes[policy] = (store.info()["hidden_bytes"], stored)
        finally:
            store.close()
    table = pq.read_table(folder / "keep.parquet").to_pylist()
    tops = [min(max(label["probability"] for label in a["labels"]) for a in row["answers"]) for row in table]
    under = sum(top < below for top in tops)
    return {
        "task": task,
        "records": count,
        "under_threshold": under / count,
        "records_with_states": sizes["selective"][1],
        "bytes_keep": sizes["keep"][0],
        "bytes_selective": sizes["selective"][0],
        "fraction_of_keep": sizes["selective"][0] / sizes["keep"][0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="keyword,long,image,count")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--keep-below", type=float, default=0.6)
    parser.add_argument("--keep-sample", type=float, default=0.02)
    parser.add_argument("--json")
    args = parser.parse_args()
    results = []
    for task in args.tasks.split(","):
        with tempfile.TemporaryDirectory() as folder:
            result = measure(task, args.count, args.keep_below, args.keep_sample, Path(folder))
        results.append(result)
        print(
            f"{task}: {result['under_threshold']:.0%} of {result['records']} records under {args.keep_below}; "
            f"selective stores {result['records_with_states']} records' states, {result['bytes_selective']:,} of "
            f"{result['bytes_keep']:,} bytes = {result['fraction_of_keep']:.1%} of keep",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
