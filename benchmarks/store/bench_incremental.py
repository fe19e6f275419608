"""A nightly job over a growing table: how much of night 2 the store saves, and what the key
index costs in memory.

    python benchmarks/store/bench_incremental.py                      # N = 2000 text records
    python benchmarks/store/bench_incremental.py --records 20000 --index-keys 1000000 --json inc.json

Night 1 scores N records into a checkpoint. Night 2 scores the same table with 5% of the records
edited, 5% appended, 10% exact copies of other records under new ids, and the order shuffled, on
the same checkpoint. A fresh run over night 2's table (its own checkpoint) is the baseline: it
computes every distinct prompt. Night 3 scores night 2's table again: nothing runs, so its wall
time is the fixed cost of a run (start-up, keying, writing the output; the model is not loaded).
Printed: the records each run put through the model, its wall time, and the ratios. Each run
is a `clef score` process on the tiny fixture model on the CPU.

`--index-keys K` then measures the key index alone: peak RSS of a fresh process that indexes K
keys into keys.sqlite and keys a K-record ledger against it (the part of a run whose memory grows
with the input), against the same process's RSS before.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: `benchmarks.` and clef_cli
from benchmarks.score.bench_score import MODEL, iter_text_records, write_jsonl

COUNTS = re.compile(
    r"(\d+) run through the model, (\d+) from the checkpoint, (\d+) duplicates collapsed, (\d+) retried"
)


def night_two(records: list[dict], seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    count = len(records)
    night = [dict(record) for record in records]
    for position in rng.sample(range(count), count // 20):  # 5% edited
        night[position]["state"] = night[position]["state"] + " (edited)"
    appended = list(iter_text_records(count // 20, seed=99))
    for number, record in enumerate(appended):
        record["id"] = f"new-{number}"
    night += appended  # 5% appended
    night += [{**night[rng.randrange(count)], "id": f"copy-{n}"} for n in range(count // 10)]  # 10% copies
    rng.shuffle(night)
    return night


def score(inputs: Path, output: Path, checkpoint: Path) -> dict:
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "clef_cli",
            "score",
            str(inputs),
            "-o",
            str(output),
            "--model",
            str(MODEL),
            "--device",
            "cpu",
            "--hidden-states",
            "drop",
            "--checkpoint",
            str(checkpoint),
            "--quiet",
        ],
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 3):
        raise SystemExit(done.stderr)
    run, reused, duplicates, retried = (int(x) for x in COUNTS.search(done.stderr).groups())
    return {"forwarded": run, "reused": reused, "duplicates": duplicates, "retried": retried, "wall_s": seconds}


INDEX_CHILD = """
import resource, sys, time, hashlib
from pathlib import Path
import pyarrow as pa
from clef_cli.store.key_index import KeyIndex
from clef_cli.store.ledger import Ledger
from clef_cli.inputs.records import Record, Question

count, folder = int(sys.argv[1]), Path(sys.argv[2])
pa.table({"x": ["warm"]}).to_pylist()  # the lazy imports a run makes anyway
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
index = KeyIndex(folder / "keys.sqlite")
seq = index.begin_run("bench")
chunk = 100_000
started = time.perf_counter()
for start in range(0, count, chunk):
    keys = [hashlib.sha256(str(n).encode()).hexdigest() for n in range(start, min(count, start + chunk))]
    table = pa.table({"record_key": keys, "error_kind": [None] * len(keys), "error": [None] * len(keys)})
    index.add_shard(f"{start // chunk + 1:08d}", table, False, seq)
indexed = time.perf_counter() - started
question = (Question("q", "noul", None, (("true", None), ("false", None)), ("true", "false")),)
import clef_cli.store.ledger as ledger_module
ledger_module.record_key = lambda record, prompt, media: hashlib.sha256(record.id.encode()).hexdigest()
records = (Record(id=str(n), index=n, state="s", questions=question) for n in range(count))
started = time.perf_counter()
ledger = Ledger(index, seq).build(records, "", None, needs_hidden=False)
keyed = time.perf_counter() - started
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(f"{before} {after} {indexed:.2f} {keyed:.2f} {ledger.counts.reused}")
"""


def index_memory(count: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [sys.executable, "-c", INDEX_CHILD, str(count), folder], capture_output=True, text=True, check=True
        )
        size = sum(path.stat().st_size for path in Path(folder).iterdir())
    before, after, indexed, keyed, reused = done.stdout.split()
    assert int(reused) == count
    return {
        "keys": count,
        "rss_before_mib": round(int(before) / 1024, 1),
        "peak_rss_mib": round(int(after) / 1024, 1),
        "index_seconds": float(indexed),
        "ledger_seconds": float(keyed),
        "index_file_mib": round(size / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--index-keys", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report: dict = {"records": args.records}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        night1 = list(iter_text_records(args.records))
        first = write_jsonl(root / "night1.jsonl", night1)
        second = write_jsonl(root / "night2.jsonl", night_two(night1))
        report["night1"] = score(first, root / "n1.parquet", root / "store.ckpt")
        report["night2"] = score(second, root / "n2.parquet", root / "store.ckpt")
        report["fresh_night2"] = score(second, root / "fresh.parquet", root / "fresh.ckpt")
        report["night3"] = score(second, root / "n3.parquet", root / "store.ckpt")  # unchanged: the fixed cost
    report["night2_vs_fresh_wall"] = round(report["night2"]["wall_s"] / report["fresh_night2"]["wall_s"], 3)
    report["night2_vs_night1_wall"] = round(report["night2"]["wall_s"] / report["night1"]["wall_s"], 3)
    report["night2_vs_fresh_forwarded"] = round(
        report["night2"]["forwarded"] / max(1, report["fresh_night2"]["forwarded"]), 3
    )
    if args.index_keys:
        report["index"] = index_memory(args.index_keys)
    for name in ("night1", "night2", "fresh_night2", "night3"):
        run = report[name]
        print(
            f"{name:13s} {run['forwarded']:6d} run through the model, {run['reused']:6d} reused, "
            f"{run['duplicates']:5d} duplicates, {run['wall_s']:7.1f} s"
        )
    print(
        f"night 2 / fresh run: wall {report['night2_vs_fresh_wall']:.2f}, records run "
        f"{report['night2_vs_fresh_forwarded']:.2f}; night 2 / night 1 wall {report['night2_vs_night1_wall']:.2f}"
    )
    if "index" in report:
        index = report["index"]
        print(
            f"key index: {index['keys']} keys, peak RSS {index['peak_rss_mib']} MiB (before "
            f"{index['rss_before_mib']} MiB), index {index['index_seconds']} s, ledger {index['ledger_seconds']} s, "
            f"file {index['index_file_mib']} MiB"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
