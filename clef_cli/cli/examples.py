"""The examples every command's `--help` ends with (its epilog), written once here.

Each command has a story told from a source checkout's root (the sample records in
`sample_data/`), every line of it a command that runs: tests/test_help_examples.py runs them in
order with `--model tests/fixtures/tiny-clef-omni` added where a line loads a model, as the
help tells a reader to. Lines that need what a laptop lacks (the real model on GPUs, vLLM, a
Ray cluster, a bucket) come after, under their own heading, and are not run.
"""

from __future__ import annotations

TINY = "tests/fixtures/tiny-clef-omni"
LOADS_A_MODEL = ("clef score", "clef inspect-spans")
"""The lines the tiny model is added to (the others read what a score wrote, or its store)."""
POSTS = "clef score sample_data/posts.jsonl --questions sample_data/questions.json -o posts.parquet"
"""The first step of most stories: five posts and three questions, with gold labels beside them."""

RUNNABLE: dict[str, tuple[str, ...]] = {
    "score": (
        POSTS,
        "clef score sample_data/records.jsonl -o out.parquet --media-root sample_data/media --layout flat",
        "clef score sample_data/records.parquet -o kept.parquet --hidden-states selective --keep-below 0.7",
    ),
    "inspect-spans": (
        "clef inspect-spans sample_data/records.jsonl --index 0",
        "clef inspect-spans sample_data/records.jsonl --id ticket-002 --json",
        "clef inspect-spans sample_data/posts.jsonl --questions sample_data/questions.json --max-length 1024",
    ),
    "eval": (
        POSTS,
        "clef eval posts.parquet --gold sample_data/posts_gold.jsonl",
        "clef eval posts.parquet --gold sample_data/posts_gold.jsonl --json metrics.json --report report.html "
        "--target-accuracy 0.9",
    ),
    "calibrate": (
        POSTS,
        "clef calibrate posts.parquet --gold sample_data/posts_gold.jsonl -o cal.json",
        f"{POSTS.replace('posts.parquet', 'calibrated.parquet')} --checkpoint posts.parquet.ckpt "
        "--calibration cal.json",
    ),
    "train-head": (
        POSTS,
        "clef train-head posts.parquet.ckpt --gold sample_data/posts_gold.jsonl -o my-head --scored posts.parquet "
        "--folds 2 --epochs 5 --force",
        f"{POSTS.replace('posts.parquet', 'reheaded.parquet')} --checkpoint posts.parquet.ckpt --rehead my-head",
    ),
    "review": (
        POSTS,
        "clef review posts.parquet -o tasks.json --records sample_data/posts.jsonl --config-out label_config.xml",
        "clef review posts.parquet -o review.json --format argilla --questions category --order margin "
        "--records sample_data/posts.jsonl",
        "clef review posts.parquet -o review.csv --limit 2 --records sample_data/posts.jsonl",
    ),
    "compare": (
        POSTS,
        f"{POSTS.replace('posts.parquet', 'today.parquet')} --checkpoint posts.parquet.ckpt",
        "clef compare posts.parquet today.parquet --json drift.json --report drift.html",
        "clef compare posts.parquet today.parquet --fail-above-psi 0.2",
    ),
    "checkpoint info": (
        POSTS,
        "clef checkpoint info posts.parquet.ckpt",
        "clef checkpoint info posts.parquet.ckpt --json",
    ),
    "checkpoint repair": (
        POSTS,
        "clef checkpoint repair posts.parquet.ckpt --dry-run",
        "clef checkpoint repair posts.parquet.ckpt",
    ),
    "checkpoint prune": (
        POSTS,
        "clef checkpoint prune posts.parquet.ckpt --keep-runs 7 --dry-run",
        "clef checkpoint prune posts.parquet.ckpt --keep-runs 7 --older-than 30",
    ),
    "checkpoint unclaim": (POSTS, "clef checkpoint unclaim posts.parquet.ckpt"),
}
AT_SCALE: dict[str, tuple[str, ...]] = {
    "score": (
        "clef score records.jsonl -o out.parquet --engine vllm --max-model-len 32768",
        "clef score s3://bucket/records/ -o s3://bucket/out/today.parquet --checkpoint store --ray --ray-actors 16",
    ),
    "compare": ('clef compare yesterday.parquet today.parquet --fail-above-psi 0.2 || echo "labels drifted"',),
    "checkpoint info": ("clef checkpoint info s3://bucket/clef-store/",),
    "checkpoint prune": ("clef checkpoint prune s3://bucket/clef-store/ --keep-runs 14",),
    "checkpoint unclaim": ("clef checkpoint unclaim s3://bucket/clef-store/ --confirm",),
    "checkpoint repair": (
        "clef checkpoint info s3://bucket/clef-store/ --verify || clef checkpoint repair s3://bucket/clef-store/",
    ),
}


def epilog(command: str) -> str:
    """The end of `clef COMMAND --help`: the story, then the lines that need more than a laptop."""
    heading = "Examples, from a source checkout's root"
    if any(line.startswith(LOADS_A_MODEL) for line in RUNNABLE[command]):
        heading += (
            f" (`clef score` and `inspect-spans` load the default model, whose weights need a large GPU: add "
            f"--model {TINY} to run them on a CPU with the tiny test model)"
        )
    lines = [f"{heading}:", "", "\b", *(f"  {line}" for line in RUNNABLE[command])]
    if command in AT_SCALE:
        lines += ["", "At scale (the real model on GPUs, a Ray cluster, a bucket):", "", "\b"]
        lines += [f"  {line}" for line in AT_SCALE[command]]
    return "\n".join(lines)
