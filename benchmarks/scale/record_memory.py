"""Does one huge record cost a bounded amount? Peak RSS of `clef score` over a few short records,
alone and beside one hostile record (issue 50, Deliver 4 and 5):

    python benchmarks/scale/record_memory.py                # every case, 40 MiB states, a 1 GiB bomb
    python benchmarks/scale/record_memory.py --cases state,bomb --records 50

Cases: `plain` (the short records alone), `state` (plus one record whose state is 40 MiB of
words: cut before it is tokenized, scored), `run` (40 MiB of one letter: no place to cut, the
record's overflow error), `bomb` (a `.jsonl.gz` of about 1 MiB whose one line inflates to a
1 GiB state: over --max-record-bytes, read past), `cell` (a Parquet file of a few KiB holding a
600 MiB image cell: over --max-file-bytes, never decompressed). Each job runs in a fresh process
under its own parent (`getrusage(RUSAGE_CHILDREN)` of that parent is the job's peak RSS) on the
tiny fixture model on the CPU, `--hidden-states drop`, no encoding workers. The goal: each case
adds at most 512 MiB to the plain job's peak, and every short record is scored.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "tests" / "fixtures" / "tiny-clef-omni"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Is this urgent?"}}
CASES = ("plain", "state", "run", "bomb", "cell")
GOAL_MIB = 512
WORDS = ("printer", "broken", "again", "refund", "late", "order", "please", "help", "today", "thanks")


def short_records(count: int) -> list[dict]:
    """The plain job's records (ids `r0`, `r1`...; the hostile record's id is another)."""
    return [{"id": f"r{n}", "state": f"ticket {n}: " + " ".join(WORDS[: 3 + n % 7])} for n in range(count)]


def write_case(case: str, folder: Path, count: int, state_mib: int = 40, bomb_gib: float = 1.0) -> Path:
    """The input of one case; the hostile record sits in the middle of the short ones."""
    records = short_records(count)
    middle = count // 2
    if case == "cell":
        return _parquet_cell(folder / "cell.parquet", records, middle)
    lines = [json.dumps(record) + "\n" for record in records]
    if case == "bomb":  # three gzip members, read as one stream; the GiB is never held here
        path = folder / "bomb.jsonl.gz"
        with gzip.open(path, "wt") as handle:
            handle.writelines(lines[:middle])
        _append_bomb(path, int(bomb_gib * (1 << 30)))
        with gzip.open(path, "at") as handle:
            handle.writelines(lines[middle:])
        return path
    path = folder / f"{case}.jsonl"
    with path.open("w") as handle:
        handle.writelines(lines[:middle])
        if case == "state":
            words = " ".join(WORDS) + "\n"
            handle.write(json.dumps({"id": "huge", "state": words * (state_mib * (1 << 20) // len(words))}) + "\n")
        elif case == "run":
            handle.write(json.dumps({"id": "huge", "state": "x" * (state_mib << 20)}) + "\n")
        handle.writelines(lines[middle:])
    return path


def _append_bomb(path: Path, size: int) -> None:
    """A gzip member holding one JSONL line of `size` bytes of state (a concatenated member is
    read as the same stream)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    piece = b"a" * (1 << 24)
    with path.open("ab") as handle:
        handle.write(compressor.compress(b'{"id": "bomb", "state": "'))
        for _ in range(size // len(piece)):
            handle.write(compressor.compress(piece))
        handle.write(compressor.compress(b'"}\n'))
        handle.write(compressor.flush())


def _parquet_cell(path: Path, records: list[dict], middle: int, cell_mib: int = 600) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    png = (ROOT / "tests" / "fixtures" / "media" / "image_a.png").read_bytes()
    rows = [{**record, "images": [png]} for record in records]
    rows.insert(middle, {"id": "huge", "state": "a huge image", "images": [bytes(cell_mib << 20)]})
    schema = pa.schema([("id", pa.string()), ("state", pa.string()), ("images", pa.list_(pa.binary()))])
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for start in range(0, len(rows), 8):  # row groups of 8: the huge one refuses its own group only
            writer.write_table(pa.Table.from_pylist(rows[start : start + 8], schema=schema))
    return path


def run_case(path: Path, folder: Path) -> dict:
    """One `clef score` in a fresh process under its own parent: (peak RSS MiB, exit, rows)."""
    import pyarrow.parquet as pq

    (folder / "questions.json").write_text(json.dumps(QUESTIONS))
    output = folder / f"{path.name}.parquet"
    command = [sys.executable, "-m", "clef_cli", "score", str(path), "-o", str(output), "--model", str(MODEL),
               "--questions", str(folder / "questions.json"), "--workers", "0", "--hidden-states", "drop",
               "--device", "cpu", "--quiet", "--checkpoint", str(folder / f"{path.name}.ckpt")]  # fmt: skip
    parent = (
        "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
        "sys.stderr.write(done.stderr[-2000:])"
    )
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", parent, *command], capture_output=True, text=True, check=True)
    code, peak = (int(value) for value in done.stdout.split())
    rows = pq.read_table(output).to_pylist() if output.exists() else []
    return {
        "peak_mib": peak / 1024,
        "exit": code,
        "scored": sum(row["error"] is None and row["id"].startswith("r") for row in rows),
        "errors": {row["id"]: row["error"] for row in rows if row["error"] is not None},
        "wall_s": time.perf_counter() - started,
        "stderr": done.stderr.strip()[-300:],
    }


def measure(cases: list[str], count: int, folder: Path, state_mib: int = 40, bomb_gib: float = 1.0) -> dict:
    results = {}
    for case in ["plain", *[case for case in cases if case != "plain"]]:
        case_folder = folder / case
        case_folder.mkdir(parents=True, exist_ok=True)
        results[case] = run_case(write_case(case, case_folder, count, state_mib, bomb_gib), case_folder)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"which cases (default all: {', '.join(CASES)})")
    parser.add_argument("--records", type=int, default=40, help="short records beside the hostile one")
    parser.add_argument("--state-mib", type=int, default=40, help="the huge state's size (state, run)")
    parser.add_argument("--bomb-gib", type=float, default=1.0, help="what the bomb's line inflates to")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="clef-record-memory-") as tmp:
        cases = [case.strip() for case in args.cases.split(",") if case.strip()]
        results = measure(cases, args.records, Path(tmp), args.state_mib, args.bomb_gib)
    plain = results["plain"]["peak_mib"]
    for case, result in results.items():
        added = result["peak_mib"] - plain
        met = "met" if added <= GOAL_MIB else "MISSED"
        verdict = "" if case == "plain" else f", adds {added:,.0f} MiB (goal <= {GOAL_MIB}: {met})"
        print(f"{case:>6}: peak RSS {result['peak_mib']:,.0f} MiB{verdict}; exit {result['exit']}, "
              f"{result['scored']} of {args.records} short records scored, {result['wall_s']:.0f} s")  # fmt: skip
        for record_id, error in result["errors"].items():
            print(f"{'':>8}{record_id}: {error[:160]}")


if __name__ == "__main__":
    main()
