"""Every crash state the POSIX/ext4 model allows (tests/support/crash_model.py), for four workloads: night
1, night 2 over a grown input, a `checkpoint prune`, and a `--rehead` that writes a new output.
Each state is opened and the same job rerun to its end; then its output equals the uncrashed
run's, every record journaled as committed before the crash is reused, nothing is reported as
damaged (the model never tears a journaled file), no exception escapes, and after a prune the
store holds exactly the keys the uncrashed prune kept, each pointing at its row."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from clef_cli.engines.local.pipeline import ScoreJob
from clef_cli.engines.rehead import rehead
from clef_cli.store import durable
from clef_cli.store.prune import prune

from .support import crash_model
from .support.helpers import TINY_MODEL, assert_same_rows, settings_for, write_jsonl
from .test_prune_index import assert_points_at_its_rows

RECORDS = [
    {"id": f"r{i}", "state": f"ticket {i} " + "word " * (2 + (i * 5) % 7), "questions": {"ok": {"type": "noul"}}}
    for i in range(10)
]
STORE = "out.parquet.ckpt"
JOURNAL = f"{STORE}/journal.jsonl"
CAP = 140
"""States checked per workload at most (a fixed-seed sample beyond)."""


def night(root: Path, scorer, inputs: str):
    settings = settings_for(root, [root / inputs], "out.parquet", max_batch_size=2, hidden_states="keep")
    return ScoreJob(settings, scorer=scorer).run()


def reheaded(root: Path, scorer=None):
    settings = settings_for(
        root, [root / "in2.jsonl"], "re.parquet", checkpoint=root / STORE, rehead=TINY_MODEL, model=None
    )
    return rehead(settings)


def pruned(root: Path, scorer=None):
    return prune(root / STORE, keep_runs=1)


def store_keys(root: Path) -> dict[str, tuple[int, int]]:
    """key -> (final, last run) in the key index."""
    with sqlite3.connect(root / STORE / "keys.sqlite") as db:
        return {key: (final, last) for key, final, last in db.execute("SELECT key, final, last_run FROM keys")}


def shard_keys(root: Path) -> set[str]:
    """The record keys of every results shard of the store as it is on disk."""
    keys: set[str] = set()
    for path in (root / STORE / "shards").glob("*.results.arrow"):
        keys.update(k for k in ipc.open_file(path.read_bytes()).read_all().column("record_key").to_pylist() if k)
    return keys


def journaled(root: Path) -> tuple[set[str], set[str]]:
    """(files the journal names, files in shards/)."""
    lines = (root / JOURNAL).read_text().splitlines() if (root / JOURNAL).exists() else []
    named = {d["name"] for line in lines for d in json.loads(line)["files"].values()}
    return named, {path.name for path in (root / STORE / "shards").iterdir()}


@dataclass
class Workload:
    name: str
    run: Callable
    output: str | None
    """The output file compared with the uncrashed run's (None: the store is compared)."""
    inputs: str | None = None


WORKLOADS = [
    Workload("night 1", lambda root, scorer: night(root, scorer, "in1.jsonl"), "out.parquet", "in1.jsonl"),
    Workload("night 2", lambda root, scorer: night(root, scorer, "in2.jsonl"), "out.parquet", "in2.jsonl"),
    Workload("prune", pruned, None),
    Workload("rehead", reheaded, "re.parquet"),
]


def record(workload: Workload, pre: Path, folder: Path, scorer) -> tuple[crash_model.Recorder, Path]:
    """Run `workload` on a copy of `pre` with every durable operation recorded."""
    shutil.copytree(pre, folder)
    recorder = crash_model.Recorder(folder)
    with durable.observe(recorder):
        workload.run(folder, scorer)
    recorder.finish()
    return recorder, folder


def check_state(workload, recorder, base, state, pre_keys, done: Path, folder: Path, scorer) -> None:
    """Rerun `workload` on `state` (built at `folder`) and check the invariants against `done`."""
    crash_model.build(base, recorder, state, folder)
    summary = workload.run(folder, scorer)  # no exception may escape
    if workload.output is None:  # prune: exactly the uncrashed prune's keys, each in its shard
        if state.index_lost:  # so was the run history: a rebuilt index keeps more, never less
            assert set(store_keys(folder)) >= set(store_keys(done))
        else:
            assert store_keys(folder) == store_keys(done)
        assert shard_keys(folder) == set(store_keys(folder))
        assert_points_at_its_rows(folder / STORE)
        named, present = journaled(folder)
        assert named == present
        return
    assert summary.damaged == 0  # the model never tears a file a journal line names
    want = pq.read_table(done / workload.output).to_pylist()
    assert_same_rows(pq.read_table(folder / workload.output).to_pylist(), want)
    if workload.inputs:
        wanted = {row["record_key"] for row in want}
        shards = crash_model.committed_shards(recorder.ops, state.prefix, JOURNAL)
        committed = pre_keys | {k for name in shards for k in recorder.keys_of.get(f"{name}.results.arrow", [])}
        assert summary.run_counts()["reused"] >= len(committed & wanted)


def enumerate_workloads(
    tmp_path: Path, scorer, cap: int, only: int | None = None, skip: tuple[str, ...] = ()
) -> list[tuple[str, int, int]]:
    """Record each workload (the first `only`) over the previous one's uncrashed end state, then
    check its crash states (none for those in `skip`); returns (workload, produced, checked)."""
    pre = tmp_path / "pre-0"
    pre.mkdir()
    write_jsonl(pre / "in1.jsonl", RECORDS[:6])
    write_jsonl(pre / "in2.jsonl", RECORDS[2:])  # two records gone, four new
    counts = []
    for number, workload in enumerate(WORKLOADS[: only or len(WORKLOADS)]):
        started = time.monotonic()
        recorder, done = record(workload, pre, tmp_path / f"done-{number}", scorer)
        base = crash_model.Tree.read(pre)
        produced, states = crash_model.crash_states(base, recorder, cap)
        pre_keys = shard_keys(pre) if (pre / STORE).exists() else set()
        for state in states if workload.name not in skip else []:
            try:
                check_state(workload, recorder, base, state, pre_keys, done, tmp_path / "state", scorer)
            except BaseException as error:
                raise AssertionError(f"{workload.name}: {state.describe(recorder.ops)}: {error!r}") from error
        checked = 0 if workload.name in skip else len(states)
        counts.append((workload.name, produced, checked))
        print(
            f"crash states {workload.name}: {produced} produced, {checked} checked ({len(recorder.ops)} ops, "
            f"{time.monotonic() - started:.0f} s)"
        )
        pre = done
    return counts


@pytest.mark.slow
def test_every_crash_state_of_four_workloads_resumes_to_the_uncrashed_result(tmp_path, scorer, capsys):
    counts = enumerate_workloads(tmp_path, scorer, CAP)
    with capsys.disabled():
        for name, produced, checked in counts:
            print(f"\ncrash states {name}: {produced} produced, {checked} checked")
    assert [name for name, _, _ in counts] == [w.name for w in WORKLOADS]
    assert all(checked >= min(produced, CAP) for _, produced, checked in counts)


@pytest.mark.slow  # the quick loop's budget (issue 36.12): CI's whole run has it
def test_a_few_crash_states_of_night_1_resume(tmp_path, scorer):
    """The quick loop's sample of the enumeration: night 1 only, a handful of states."""
    counts = enumerate_workloads(tmp_path, scorer, cap=4, only=1)
    assert counts[0][2] == 4 and counts[0][1] > 4


def test_a_power_loss_after_night_1_loses_no_committed_record(tmp_path, scorer):
    """Crash state found by the enumeration: night 1 ended, then the power failed and every name
    no folder fsync covered was lost. The journal was created by its first append and its folder
    never fsynced (nor were the new checkpoint folder and shards/): the journal, or the whole
    store, vanished and night 1 ran again."""
    pre = tmp_path / "pre"
    pre.mkdir()
    write_jsonl(pre / "in1.jsonl", RECORDS[:6])
    workload = WORKLOADS[0]
    recorder, done = record(workload, pre, tmp_path / "done", scorer)
    ops = recorder.ops
    state = crash_model.CrashState(len(ops), frozenset(crash_model.uncovered(ops, len(ops))))
    assert {ops[i].kind for i in state.dropped} <= {"unlink", "create"}  # only the lock file's name
    crash_model.build(crash_model.Tree.read(pre), recorder, state, tmp_path / "state")
    summary = workload.run(tmp_path / "state", scorer)
    assert summary.run_counts()["reused"] == 6 and summary.damaged == 0
    got, want = (pq.read_table(folder / "out.parquet").to_pylist() for folder in (tmp_path / "state", done))
    assert_same_rows(got, want)
