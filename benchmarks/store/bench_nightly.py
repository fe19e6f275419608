"""The nightly arithmetic of hidden states, on paper: what each `--hidden-states` policy stores,
and what running the thinker again costs instead.

    python benchmarks/store/bench_nightly.py                               # 500k x 1,500 nightly, 1M table
    python benchmarks/store/bench_nightly.py --records 2000000 --tokens 800 --hidden 2048 --json out.json

Per record count: the prompt tokens (records x tokens), the bytes stored under keep (every
token's state, `hidden` values of `--bytes-per-value` bytes, plus its 4-byte int32 input id, as
clef stores them), under selective (the share under `--keep-below`, given as
`--uncertain-share`, plus the `--keep-sample` share of the rest) and under drop (none), and the
GPU-hours to compute every state again at `--tokens-per-second` (40k tokens/s: an assumption for
the real model on one GPU, to be measured, not a measurement). Defaults: Clef-Omni's hidden size
2048, states in bfloat16 (2 bytes). Nothing is run; it is arithmetic with its assumptions printed.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

ID_BYTES = 4
"""Each stored token also keeps its int32 input id (store/hidden_store.py)."""


@dataclass(frozen=True)
class Night:
    records: int
    tokens_per_record: int
    tokens: int
    bytes_keep: int
    bytes_selective: int
    bytes_drop: int
    selective_share: float
    recompute_gpu_hours: float
    """Every record's states computed again."""
    selective_recompute_gpu_hours: float
    """Only the records selective did not keep (what a full-table --rehead computes after it)."""


def night(
    records: int,
    tokens: int,
    hidden: int = 2048,
    bytes_per_value: int = 2,
    tokens_per_second: float = 40_000.0,
    uncertain_share: float = 0.1,
    sample: float = 0.02,
) -> Night:
    """The figures for one job of `records` records of `tokens` prompt tokens each."""
    total = records * tokens
    per_token = hidden * bytes_per_value + ID_BYTES
    share = uncertain_share + (1 - uncertain_share) * sample
    hours = total / tokens_per_second / 3600
    return Night(
        records=records,
        tokens_per_record=tokens,
        tokens=total,
        bytes_keep=total * per_token,
        bytes_selective=round(total * per_token * share),
        bytes_drop=0,
        selective_share=share,
        recompute_gpu_hours=hours,
        selective_recompute_gpu_hours=hours * (1 - share),
    )


def terabytes(count: float) -> str:
    return f"{count / 1e12:.2f} TB ({count / 2**40:.2f} TiB)"


def main(argv: list[str] | None = None) -> list[Night]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, nargs="+", default=[500_000, 1_000_000])
    parser.add_argument("--tokens", type=int, default=1500, help="prompt tokens per record")
    parser.add_argument("--hidden", type=int, default=2048, help="hidden size (Clef-Omni: 2048)")
    parser.add_argument("--bytes-per-value", type=int, default=2, help="2: bfloat16 or float16; 4: float32")
    parser.add_argument("--tokens-per-second", type=float, default=40_000.0, help="thinker throughput, one GPU")
    parser.add_argument("--uncertain-share", type=float, default=0.1, help="records under --keep-below (assumed)")
    parser.add_argument("--keep-sample", type=float, default=0.02)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    nights = [
        night(count, args.tokens, args.hidden, args.bytes_per_value, args.tokens_per_second, args.uncertain_share,
              args.keep_sample)
        for count in args.records
    ]  # fmt: skip
    print(
        f"assumptions: {args.tokens} prompt tokens a record; {args.hidden} x {args.bytes_per_value} bytes + a "
        f"{ID_BYTES}-byte id a token; {args.tokens_per_second:,.0f} tokens/s on one GPU; selective keeps "
        f"{args.uncertain_share:.0%} uncertain + {args.keep_sample:.0%} of the rest"
    )
    for item in nights:
        print(
            f"{item.records:,} records, {item.tokens:,} tokens: keep {terabytes(item.bytes_keep)}, selective "
            f"{terabytes(item.bytes_selective)} ({item.selective_share:.1%}), drop 0 B; recompute every state "
            f"{item.recompute_gpu_hours:.1f} GPU-hours, those selective did not keep "
            f"{item.selective_recompute_gpu_hours:.1f}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump([asdict(item) for item in nights], handle, indent=2)
    return nights


if __name__ == "__main__":
    main()
