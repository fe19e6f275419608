"""The job behind tests/test_output_identity.py: a small store made once (night 1) and the outputs
the code of commit f9a19f9 wrote from it, kept under tests/fixtures/output_golden/.

Night 2 over the stored store runs nothing through the model, so the outputs depend on the
output path alone (ordering, pass-through columns, calibration, both layouts, row groups), not on
the torch build. Made with the old code (never needed again; kept to say how):

    git archive f9a19f9 clef_cli | tar -x -C /tmp/clef-old
    cd /tmp && PYTHONPATH=/tmp/clef-old python -c \
        "import sys; sys.path.append('/work/main'); from tests.support.output_golden import make; make()"
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FOLDER = Path(__file__).parents[1] / "fixtures" / "output_golden"
STORE = "store"
CREATED = (2026, 12, 2, 6, 0, 0, 2, 336, 0)
"""The fixed `clef.created` of every golden output."""
QUESTIONS = {
    "spam": {"type": "noul", "instructions": "Is this spam?"},
    "tone": {"type": "choice", "instructions": "Tone?", "criteria": {"calm": None, "angry": None, "sad": "Low."}},
    "rating": {"type": "score", "instructions": "Rate it", "criteria": ["bad", "ok", "good"]},
}
CALIBRATION = {"version": 1, "method": "type", "temperatures": {"spam": 0.7}, "type_temperatures": {"score": 2.5},
               "default": 1.3}  # fmt: skip
CASES = {
    "wide": {"layout": "wide"},
    "long": {"layout": "long"},
    "wide-kept-calibrated": {"layout": "wide", "keep_columns": ("meta", "n"), "calibration": True},
    "long-kept-calibrated": {"layout": "long", "keep_columns": ("meta", "n"), "calibration": True},
}
ROW_GROUP = 4
"""Rows per row group: the 15 records span several, so the groups' boundaries are compared too."""


def records() -> list[dict]:
    """15 records: scored ones of varied length, a duplicate under another id, three invalid ones
    (one reusing an earlier id), one too long for `max_length`, pass-through values of mixed types."""
    rows: list[dict] = []
    metas = [1, "two", None, {"k": [1, 2]}, 2.5, True, 7, "x", None, [3], 9, "late", 11, None, 0]
    for number, meta in enumerate(metas):
        words = " ".join(f"w{(number * 7 + i) % 13}" for i in range(3 + number * 5))
        rows.append({"id": f"r{number:02d}", "state": f"Message {number}: {words}", "meta": meta, "n": number})
    rows[5]["state"] = rows[2]["state"]  # a duplicate: one prompt, two ids
    rows[8] = {"id": "r08", "meta": None, "n": 8}  # invalid: no state
    rows[11]["questions"] = {"q": {"type": "nonsense", "instructions": "?"}}  # invalid: bad question type
    rows[12]["id"] = "r03"  # invalid: an id an earlier record used
    rows[13]["state"] = "long " * 1200  # over max_length: a failed row with its prompt length
    return rows


def settings(folder: Path, case: str, store: Path):
    """The ScoreSettings of one case (paths relative to `folder`, the working directory)."""
    from clef_cli.choices import OverflowPolicy
    from clef_cli.job.settings import ScoreSettings

    options = dict(CASES[case])
    calibration = Path("calibration.json") if options.pop("calibration", False) else None
    return ScoreSettings(
        inputs=[Path("records.jsonl")],
        output=Path(f"{case}.parquet"),
        model="model",
        questions=Path("questions.json"),
        max_length=1024,
        overflow=OverflowPolicy.error,
        device="cpu",
        dtype="float32",
        workers=0,
        checkpoint=store,
        hidden_states="drop",
        row_group_size=ROW_GROUP,
        max_batch_size=3,
        calibration=calibration,
        **options,
    )


def prepare(folder: Path, model: Path) -> None:
    """The inputs of the job in `folder` (the working directory of every run)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "records.jsonl").write_text("".join(json.dumps(row) + "\n" for row in records()), encoding="utf-8")
    (folder / "questions.json").write_text(json.dumps(QUESTIONS), encoding="utf-8")
    (folder / "calibration.json").write_text(json.dumps(CALIBRATION), encoding="utf-8")
    if not (folder / "model").exists():
        (folder / "model").symlink_to(model)


@contextmanager
def fixed_clock() -> Iterator[None]:
    """`clef.created` at CREATED, so two runs of the same job write the same bytes."""
    real = time.gmtime
    time.gmtime = lambda *args: time.struct_time(CREATED) if not args else real(*args)
    try:
        yield
    finally:
        time.gmtime = real


def run_case(folder: Path, case: str, store: Path) -> Path:
    """One `clef score` of `case` in `folder` on the store at `store`; returns the output."""
    import os

    from clef_cli.engines.local.pipeline import ScoreJob
    from clef_cli.progress import Progress

    here = Path.cwd()
    os.chdir(folder)
    try:
        with fixed_clock():
            ScoreJob(settings(folder, case, store), progress=Progress()).run()
    finally:
        os.chdir(here)
    return folder / f"{case}.parquet"


def make(work: Path = Path("/tmp/clef-golden")) -> None:
    """Night 1 (the store), then each case's output over it, copied into FOLDER."""
    from tests.support.helpers import TINY_MODEL

    shutil.rmtree(work, ignore_errors=True)
    prepare(work, TINY_MODEL)
    run_case(work, "wide", Path(STORE))  # night 1: fills the store
    (work / "wide.parquet").unlink()
    shutil.rmtree(FOLDER, ignore_errors=True)
    shutil.copytree(work / STORE, FOLDER / STORE, ignore=shutil.ignore_patterns("keys.sqlite*", "*.lock", "spool"))
    for case in CASES:
        shutil.copy(run_case(work, case, Path(STORE)), FOLDER / f"{case}.parquet")
    import pyarrow

    (FOLDER / "meta.json").write_text(json.dumps({"commit": "f9a19f9", "pyarrow": pyarrow.__version__}) + "\n")
