"""The Python jobs of tests/support/background.py, each run as `python -m tests.support.background_jobs NAME FOLDER`
from the repository root: it does what its tests did in the test process, and leaves what they
assert on in FOLDER/result.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def crash(folder: Path) -> dict:
    """A pool worker dies on ticket-004 (workers=1, window 4), then a rerun without the fault; the
    model is the session `scorer` fixture's (float32, seeded), passed in as the test did."""
    import pyarrow.parquet as pq
    import torch

    from clef_cli import faults
    from clef_cli.engines.local.pipeline import ScoreJob
    from clef_cli.model.scoring import load_scorer
    from clef_cli.release import resolve_release
    from tests.support.helpers import TINY_MODEL, settings_for

    torch.manual_seed(0)
    scorer = load_scorer(resolve_release(str(TINY_MODEL)), device="cpu", dtype="float32")
    os.environ[faults.CRASH_ON] = "ticket-004"
    summary = ScoreJob(settings_for(folder, workers=1, window=4, limit=None), scorer=scorer).run()
    rows = pq.read_table(folder / "out.parquet").to_pylist()
    del os.environ[faults.CRASH_ON]
    again = ScoreJob(settings_for(folder, workers=0, window=4, limit=None), scorer=scorer).run()
    return {
        "rows": [{key: row[key] for key in ("id", "error", "error_kind")} for row in rows],
        "scored": summary.scored,
        "again": [again.run, again.retried, again.reused, again.failed],
    }


def planted(folder: Path) -> dict:
    """test_train_head's `planted` task scored once, and `trained_small`'s train-head run on it."""
    from tests.support.planted import write_jsonl
    from tests.test_train_head import QUICK, TRAIN, score_planted, train

    root, head = folder / "planted", folder / "small" / "head"
    root.mkdir()
    head.parent.mkdir()
    task = score_planted("image", 70, root)
    task["gold"] = write_jsonl(root / "gold.jsonl", task["answers"][:TRAIN])
    result = train(task["checkpoint"], task["gold"], head, *QUICK)
    return {
        "planted": {key: str(value) if isinstance(value, Path) else value for key, value in task.items()},
        "trained": {
            "head": str(head),
            "exit_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "output": result.output,
        },
    }


def planted_at_full_size(folder: Path, task: str) -> dict:
    """test_train_head's full-size case of one planted task: 440 records scored, a head trained
    with default settings on the first 240, the rest reheaded; the accuracies its test compares.
    One thread, as the queue promises the tests the other core."""
    import torch

    from tests.support.planted import write_jsonl
    from tests.test_train_head import rehead, score_planted, sklearn_probe_accuracy, train, unseen_accuracy

    torch.set_num_threads(1)
    records = score_planted(task, 440, folder)
    gold = write_jsonl(folder / "gold.jsonl", records["answers"][:240])
    trained = train(records["checkpoint"], gold, folder / "head", "--device", "cpu")
    reheaded = rehead(records, folder / "head", folder / "re.parquet") if trained.exit_code == 0 else None
    return {
        "train": {"exit_code": trained.exit_code, "output": trained.output},
        "rehead": {"exit_code": reheaded.exit_code, "output": reheaded.output} if reheaded else None,
        "before": unseen_accuracy(records["output"], records["answers"], 240),
        "after": unseen_accuracy(folder / "re.parquet", records["answers"], 240) if reheaded else None,
        "probe": sklearn_probe_accuracy(records["checkpoint"], records["answers"][:240], records["answers"][240:]),
    }


if __name__ == "__main__":
    name, where = sys.argv[1], Path(sys.argv[2])
    if name.startswith("planted-"):
        outcome = planted_at_full_size(where, name.removeprefix("planted-"))
    else:
        outcome = {"crash": crash, "planted": planted}[name](where)
    (where / "result.json").write_text(json.dumps(outcome))
