"""`clef checkpoint prune` cannot empty a store by accident: only completed runs that used keys
count toward --keep-runs, a prune that would drop every key is refused unless --force, limits
that keep nothing are usage errors, and --dry-run says what would go without touching a file."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.store.prune import kept_run_seqs

from .support.helpers import TINY_MODEL, one_ctrl_c, write_jsonl

runner = CliRunner()


def tickets(numbers) -> list[dict]:
    return [
        {"id": f"t{n:03d}", "state": f"ticket {n} " + "word " * (2 + n % 5), "questions": {"urgent": {"type": "noul"}}}
        for n in numbers
    ]


def score(inputs: Path, output: Path, store: Path, *extra: str):
    return runner.invoke(
        app,
        ["score", str(inputs), "-o", str(output), "--checkpoint", str(store), "--model", str(TINY_MODEL),
         "--workers", "0", "--quiet", *extra],
    )  # fmt: skip


def prune(store: Path, *args: str):
    return runner.invoke(app, ["checkpoint", "prune", str(store), *args])


def info(store: Path) -> dict:
    shown = runner.invoke(app, ["checkpoint", "info", str(store), "--json"])
    assert shown.exit_code == 0, shown.output
    return json.loads(shown.stdout)


def snapshot(store: Path) -> dict[str, bytes]:
    """Every file of the store and its bytes (the key index included)."""
    return {str(path.relative_to(store)): path.read_bytes() for path in sorted(store.rglob("*")) if path.is_file()}


def test_a_run_over_invalid_records_does_not_count_so_keep_runs_1_keeps_the_store(tmp_path):
    """The issue's scenario: 12 keys, then a night over a broken export (0 keys used), then
    `--keep-runs 1`. It dropped all 12 keys; the broken night is not a run that counts."""
    store = tmp_path / "st"
    good = write_jsonl(tmp_path / "good.jsonl", tickets(range(12)))
    assert score(good, tmp_path / "a.parquet", store, "--hidden-states", "drop").exit_code == 0
    # questions, so the job is no whole-job mistake (refused before it runs), but no state
    (tmp_path / "bad.jsonl").write_text('garbage\n{"id": "x", "questions": {"urgent": {"type": "noul"}}}\n')
    broken = score(tmp_path / "bad.jsonl", tmp_path / "b.parquet", store)
    assert broken.exit_code == 3, broken.output  # every record invalid

    pruned = prune(store, "--keep-runs", "1")
    assert pruned.exit_code == 0, pruned.output
    assert info(store)["keys"] == 12  # the old prune dropped all 12
    assert "dropped 0 of 12 keys" in pruned.stdout
    assert [run["counted"] for run in info(store)["runs"]] == [True, False]
    again = score(good, tmp_path / "c.parquet", store, "--hidden-states", "drop")
    assert "0 run through the model, 12 from the checkpoint" in again.stderr


def test_limits_that_keep_nothing_are_usage_errors_and_an_emptying_prune_needs_force(tmp_path):
    store = tmp_path / "st"
    assert score(write_jsonl(tmp_path / "in.jsonl", tickets(range(3))), tmp_path / "a.parquet", store,
                 "--hidden-states", "drop").exit_code == 0  # fmt: skip
    before = snapshot(store)
    for args, message in (
        (["--keep-runs", "0"], "--keep-runs must be at least 1"),
        (["--older-than", "0"], "--older-than must be above 0 days"),
        ([], "give --keep-runs N and/or --older-than DAYS"),
    ):
        refused = prune(store, *args)
        assert refused.exit_code == 2 and message in refused.stderr, refused.output
    # the only run started more than 1e-9 days (86 microseconds) ago: every key would go
    emptying = prune(store, "--older-than", "1e-9")
    assert emptying.exit_code == 2, emptying.output
    assert "would drop all 3 keys" in emptying.stderr and "--force" in emptying.stderr
    assert snapshot(store) == before
    planned = prune(store, "--older-than", "1e-9", "--dry-run")
    assert planned.exit_code == 0, planned.output
    assert planned.stdout == (
        "would drop 3 of 3 keys (3 rows) in 1 shard (1 removed whole, 0 rewritten); would free about "
        f"{planned.stdout.split('would free about ')[1].split(';')[0]}; would keep the keys of 0 completed runs\n"
        "that is every key: without --dry-run, this prune is refused unless --force\n"
    )
    forced_plan = prune(store, "--older-than", "1e-9", "--dry-run", "--force")
    assert forced_plan.exit_code == 0, forced_plan.output
    assert forced_plan.stdout.splitlines()[1] == "that is every key: without --dry-run, --force drops them all"
    assert snapshot(store) == before
    forced = prune(store, "--older-than", "1e-9", "--force")
    assert forced.exit_code == 0 and "dropped 3 of 3 keys" in forced.stdout, forced.output
    assert info(store)["keys"] == 0


def test_dry_run_says_what_the_prune_then_does_and_changes_nothing(tmp_path):
    store = tmp_path / "st"
    for name, numbers in (("a", range(0, 4)), ("b", range(2, 6)), ("c", range(6, 8))):
        done = score(write_jsonl(tmp_path / f"{name}.jsonl", tickets(numbers)), tmp_path / f"{name}.parquet", store)
        assert done.exit_code == 0, done.output
    assert info(store)["keys"] == 8
    # --keep-runs 2 keeps b and c: tickets 2-7; a's shard loses tickets 0 and 1 and is rewritten
    before = snapshot(store)
    planned = prune(store, "--keep-runs", "2", "--dry-run")
    assert planned.exit_code == 0, planned.output
    assert "would drop 2 of 8 keys (2 rows) in 1 shard (0 removed whole, 1 rewritten)" in planned.stdout
    assert snapshot(store) == before
    done = prune(store, "--keep-runs", "2")
    assert done.exit_code == 0, done.output
    assert "dropped 2 of 8 keys (2 rows) in 1 shard (0 removed whole, 1 rewritten)" in done.stdout
    assert done.stdout.rstrip().endswith("; kept the keys of 2 completed runs")
    assert info(store)["keys"] == 6
    # --keep-runs 1 keeps c only: b's shard and a's rewritten one go whole, so the estimate is exact
    planned = prune(store, "--keep-runs", "1", "--dry-run")
    done = prune(store, "--keep-runs", "1")
    assert "would drop 4 of 6 keys (4 rows) in 2 shards (2 removed whole, 0 rewritten)" in planned.stdout
    assert "dropped 4 of 6 keys (4 rows) in 2 shards (2 removed whole, 0 rewritten)" in done.stdout
    assert done.stdout.rstrip().endswith("; kept the keys of 1 completed run")
    assert planned.stdout.split("would free about ")[1].split(";")[0] == done.stdout.split("freed ")[1].split(";")[0]
    again = score(tmp_path / "c.jsonl", tmp_path / "c2.parquet", store)
    assert "0 run through the model, 2 from the checkpoint" in again.stderr


def run(seq: int, finished: bool = True, used: int = 1, started: float = 0.0) -> dict:
    counts = {"run": used, "forwarded": used, "reused": 0, "duplicates": 0, "retried": 0} if finished else None
    return {"seq": seq, "started": started or float(seq), "finished": 1.0 if finished else None, "counts": counts}


def test_which_runs_keep_their_keys():
    """Completed runs with keys count; a run stopped early or without keys does not, but what it
    touched after the earliest kept run stays (its keys were last used by it)."""
    history = [run(1), run(2), run(3, finished=False), run(4, used=0), run(5, finished=False)]
    assert kept_run_seqs(history, 1, None) == {2, 3, 4, 5}
    assert kept_run_seqs(history, 2, None) == {1, 2, 3, 4, 5}
    assert kept_run_seqs(history, 3, None) == {1, 2, 3, 4, 5}  # fewer than 3 count: everything stays
    assert kept_run_seqs([run(1, used=0), run(2, finished=False)], 1, None) == {1, 2}
    now = 10 * 86400.0
    dated = [run(1, started=now - 5 * 86400), run(2, started=now - 2 * 86400), run(3, started=now - 3600)]
    assert kept_run_seqs(dated, None, 3, now=now) == {2, 3}
    assert kept_run_seqs(dated, 1, 3, now=now) == {3}  # both must keep a run
    assert kept_run_seqs(dated, 3, 1, now=now) == {3}


def test_an_interrupted_first_run_does_not_count_so_keep_runs_1_keeps_the_last_run_only():
    """The history starts with a run that does not count: [interrupted run 1, run 2] with
    --keep-runs 1 keeps run 2's keys only (with `>` for `>=`, one counted run kept everything)."""
    history = [run(1, finished=False), run(2)]
    assert kept_run_seqs(history, 1, None) == {2}
    assert kept_run_seqs([run(1, used=0), run(2)], 1, None) == {2}
    assert kept_run_seqs(history, 2, None) == {1, 2}  # fewer than 2 count: everything stays


def test_keep_runs_1_after_an_interrupted_run_drops_its_keys(tmp_path, monkeypatch):
    """The same through the CLI: run 1 stopped after its first commit (as Ctrl-C stops it), run 2
    over other tickets; `--keep-runs 1` keeps exactly run 2's keys."""
    from clef_cli import faults

    monkeypatch.setattr(faults, "after_commit", one_ctrl_c())  # the first Ctrl-C, at the first commit
    store = tmp_path / "st"
    first = score(write_jsonl(tmp_path / "a.jsonl", tickets(range(6))), tmp_path / "a.parquet", store,
                  "--max-batch-size", "2", "--hidden-states", "drop")  # fmt: skip
    assert first.exit_code == 130, first.output
    monkeypatch.undo()
    interrupted_keys = info(store)["keys"]
    assert interrupted_keys > 0  # what it committed before it stopped, last used by run 1
    second = score(write_jsonl(tmp_path / "b.jsonl", tickets(range(10, 14))), tmp_path / "b.parquet", store,
                   "--hidden-states", "drop")  # fmt: skip
    assert second.exit_code == 0, second.output
    assert [run["counted"] for run in info(store)["runs"]] == [False, True]

    pruned = prune(store, "--keep-runs", "1")
    assert pruned.exit_code == 0, pruned.output
    assert f"dropped {interrupted_keys} of {interrupted_keys + 4} keys" in pruned.stdout
    assert info(store)["keys"] == 4
    again = score(tmp_path / "b.jsonl", tmp_path / "c.parquet", store, "--hidden-states", "drop")
    assert "0 run through the model, 4 from the checkpoint" in again.stderr


def test_the_journal_switch_comes_before_any_old_shard_is_unlinked(tmp_path, scorer):
    """A prune writes the new shards, switches the journal to them (a rename), and only then
    unlinks the old files: killed in between, the journal still names files that exist. The order
    of the store's own operations, recorded through its durable seam (store/durable.py)."""
    from clef_cli.engines.local.pipeline import ScoreJob
    from clef_cli.store import durable

    from .support.helpers import settings_for

    store = tmp_path / "st"
    for name, numbers in (("a", range(6)), ("b", [0, 1, 10, 11])):  # night 2 keeps 2 keys of night 1's shards
        inputs = [write_jsonl(tmp_path / f"{name}.jsonl", tickets(numbers))]
        settings = settings_for(tmp_path, inputs, f"{name}.parquet", checkpoint=store, hidden_states="drop",
                                max_batch_size=2)  # fmt: skip
        ScoreJob(settings, scorer=scorer).run()
    operations: list[tuple[str, Path, Path | None]] = []
    with durable.observe(lambda operation, path, details: operations.append((operation, path, details.get("target")))):
        pruned = prune(store, "--keep-runs", "1")
    assert pruned.exit_code == 0 and "dropped 4 of 8 keys" in pruned.stdout, pruned.output
    switches = [n for n, (operation, _, target) in enumerate(operations)
                if operation == "rename" and target == store / "journal.jsonl"]  # fmt: skip
    unlinks = [n for n, (operation, path, _) in enumerate(operations)
               if operation == "unlink" and path.parent == store / "shards"]  # fmt: skip
    assert len(switches) == 1 and unlinks, operations
    assert switches[0] < min(unlinks), operations
