"""The reports and estimates say what is true (issue 36.8), each tested against what the next run
or the store then shows: the dry run's hidden-state sizes per policy on a selective store,
`checkpoint info`'s keys with states, and the rehead summary's time and thinker count."""

from __future__ import annotations

import re
from pathlib import Path

from clef_cli.store.checkpoint import Checkpoint
from tests.support.helpers import write_jsonl
from tests.test_checkpoint import records, second_head_release
from tests.test_keep_policy import score, stored_states

SIZES = re.compile(r"--hidden-states (\w+)(?: \(this run\))?: about ([\d.]+ \w?i?B)(?: to ([\d.]+ \w?i?B))?")
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def planned_sizes(stdout: str) -> dict[str, tuple[float, float]]:
    """policy -> (low, high) bytes from the dry run's lines."""
    found = {}
    for policy, low, high in SIZES.findall(" ".join(stdout.split())):  # the console wraps long lines
        to_bytes = lambda text: float(text.split()[0]) * UNITS[text.split()[1]]  # noqa: E731
        found[policy] = (to_bytes(low), to_bytes(high or low))
    return found


def hidden_bytes(checkpoint: Path) -> int:
    return sum(path.stat().st_size for path in (checkpoint / "shards").glob("*.hidden.safetensors"))


def test_a_selective_stores_dry_run_says_what_keep_and_selective_then_write(tmp_path):
    inputs = write_jsonl(tmp_path / "in.jsonl", records(8))
    out, store = tmp_path / "out.parquet", tmp_path / "out.parquet.ckpt"
    first = score(inputs, out, "--hidden-states", "selective", "--keep-below", "0", "--keep-sample", "0")
    assert first.exit_code == 0, first.output
    assert hidden_bytes(store) == 0  # nothing kept: every state is missing
    for policy in ("selective", "keep"):
        narrow = ("--keep-below", "0", "--keep-sample", "0") if policy == "selective" else ()
        plan = score(inputs, out, "--dry-run", "--hidden-states", policy, *narrow)
        assert plan.exit_code == 0, plan.output
        sizes = planned_sizes(plan.stdout)
        assert sizes["selective"] == (0, 0), plan.stdout  # every prompt is stored: a selective run adds nothing
        assert sizes["keep"][0] > 0, plan.stdout
    again = score(inputs, out, "--hidden-states", "selective", "--keep-below", "0", "--keep-sample", "0")
    assert again.exit_code == 0 and hidden_bytes(store) == 0
    kept = score(inputs, out, "--hidden-states", "keep")
    assert kept.exit_code == 0, kept.output
    written = hidden_bytes(store)
    assert 0.8 * written <= sizes["keep"][0] <= 1.2 * written  # the estimate is the states' bytes, not the file's


def test_checkpoint_info_counts_the_keys_with_states(tmp_path):
    inputs = write_jsonl(tmp_path / "in.jsonl", records(8))
    out, store = tmp_path / "out.parquet", tmp_path / "out.parquet.ckpt"
    half = ("--keep-below", "0", "--keep-sample", "0.5")
    assert score(inputs, out, "--hidden-states", "selective", *half).exit_code == 0
    checkpoint = Checkpoint.open_existing(store)
    try:
        info = checkpoint.info()
    finally:
        checkpoint.close()
    assert info["keys_with_hidden_states"] == len(stored_states(store)) < info["keys"]


def test_the_rehead_summary_counts_the_states_computed_and_their_time(tmp_path):
    inputs = write_jsonl(tmp_path / "in.jsonl", records(6))
    out = tmp_path / "out.parquet"
    assert score(inputs, out, "--hidden-states", "drop").exit_code == 0
    head = second_head_release(tmp_path)
    result = score(inputs, tmp_path / "re.parquet", "--checkpoint", str(tmp_path / "out.parquet.ckpt"),
                   "--rehead", str(head))  # fmt: skip
    assert result.exit_code == 0, result.output
    line = result.stderr.splitlines()[0]
    assert "re-scored by the head" in line and "the thinker ran first on 6 whose states were not stored" in line
    total = float(re.search(r"tokens in ([\d.]+) s", line).group(1))
    computed = float(re.search(r"through the thinker in ([\d.]+) s", result.stderr).group(1))
    assert total >= computed  # the whole command's time holds the states' computation
    assert "run through the model" not in line
