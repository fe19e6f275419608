"""Golden parity on any device: both model families, each dtype, against the reference's fixtures.

    python benchmarks/gpu/gpu_parity.py --device cuda --dtypes float32,bfloat16 --json parity.json
    python benchmarks/gpu/gpu_parity.py --device cpu --dtypes float32 --limit 3   # a smoke run

For the tiny Clef-Omni and Clef dense fixtures it scores every golden record that the reference
scored, alone (one record per forward) and in padded batches (length-sorted, up to 8 records),
and reports per family and dtype the worst absolute difference of logits and of probabilities
against the reference (`expected_*.jsonl`, made in float32 on a CPU), and between batched and
alone. It reports and never fails: the bounds to read them against are the README's (float32 on
the CPU: logits 1e-5, probabilities 1e-6; half precision: test_precision.py's bounds).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
FAMILIES = {
    "omni": (
        FIXTURES / "tiny-clef-omni",
        FIXTURES / "golden" / "records_A.jsonl",
        FIXTURES / "golden" / "expected_A.jsonl",
    ),
    "dense": (
        FIXTURES / "tiny-clef-dense",
        FIXTURES / "golden_dense" / "records_D.jsonl",
        FIXTURES / "golden_dense" / "expected_D.jsonl",
    ),
}


def worst(got: list, want: list) -> tuple[float, float]:
    """(largest logit difference, largest probability difference) over all records and questions."""
    logit = probability = 0.0
    for result, reference in zip(got, want, strict=True):
        for question, golden in zip(result.questions, reference["questions"], strict=True):
            logit = max(logit, *(abs(a - b) for a, b in zip(question.logits, golden["logits"], strict=True)))
            probability = max(
                probability, *(abs(a - b) for a, b in zip(question.probabilities, golden["probabilities"], strict=True))
            )
    return logit, probability


def as_reference(results: list) -> list[dict]:
    """Scored records in the fixtures' layout, to compare batched with alone by the same function."""
    return [
        {"questions": [{"logits": list(q.logits), "probabilities": list(q.probabilities)} for q in r.questions]}
        for r in results
    ]


def family_parity(name: str, device: str, dtype: str, limit: int | None) -> dict:
    import torch

    from clef_cli.encoding.prompt import PromptEncoder
    from clef_cli.families import family_of
    from clef_cli.inputs.readers import read_records
    from clef_cli.inputs.records import Record
    from clef_cli.model.scoring import load_scorer
    from clef_cli.release import load_processor, resolve_release

    model, records_file, expected_file = FAMILIES[name]
    release = resolve_release(str(model))
    meta = json.loads((records_file.parent / "meta.json").read_text())
    encoder = PromptEncoder(load_processor(release), meta["max_length"], family=family_of(release))
    expected = {row["id"]: row for row in map(json.loads, expected_file.read_text().splitlines()) if row}
    records = [r for r in read_records([records_file]) if isinstance(r, Record) and "error" not in expected[r.id]]
    encoded = [encoder.encode(record) for record in records[:limit]]
    want = [expected[item.record.id] for item in encoded]
    scorer = load_scorer(release, device=device, dtype=dtype)
    started = time.perf_counter()
    alone = [scorer.score_batch([item])[0] for item in encoded]
    batched = scorer.score(encoded, max_batch_tokens=16384, max_batch_size=8)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    alone_logit, alone_probability = worst(alone, want)
    batched_logit, batched_probability = worst(batched, want)
    between_logit, between_probability = worst(batched, as_reference(alone))
    return {
        "family": name,
        "dtype": dtype,
        "device": device,
        "records": len(encoded),
        "alone_vs_reference": {"logit": alone_logit, "probability": alone_probability},
        "batched_vs_reference": {"logit": batched_logit, "probability": batched_probability},
        "batched_vs_alone": {"logit": between_logit, "probability": between_probability},
        "seconds": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--families", default="omni,dense")
    parser.add_argument("--limit", type=int, help="only the first N records of each family (a smoke run)")
    parser.add_argument("--json", type=Path, help="also write the report to this file")
    args = parser.parse_args()
    results = []
    for name in args.families.split(","):
        for dtype in args.dtypes.split(","):
            try:
                result = family_parity(name, args.device, dtype, args.limit)
            except Exception as error:  # one failed family or dtype must not hide the others
                result = {"family": name, "dtype": dtype, "error": f"{type(error).__name__}: {error}"}
            results.append(result)
            print(json.dumps(result), flush=True)
    report = {"device": args.device, "results": results}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
