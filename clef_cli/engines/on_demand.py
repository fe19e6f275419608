"""Hidden states computed on demand: the thinker runs again on stored records whose states were
not kept (`--hidden-states selective` or `drop`), and only on those, so `--rehead` and
train-head work on a store made under any policy.

This is the local scoring engine with the ledger asking for states (`needs_hidden`): a stored
record without states is marked to run, every other one is reused, and each batch is committed
with its states as a new shard whose rows win over the stored ones. A forward gives a record
nearly the same numbers whatever its batch (tests/test_batch_invariance.py: logits within 1e-5
in fp32), so the recomputed result equals the stored one within that and the states equal those a
`keep` run would have stored; bit for bit when both runs batch alike (--max-batch-size 1 in both,
tests/test_keep_policy.py), as a BLAS kernel may sum in another order for another batch shape.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from clef_cli.choices import DEFAULT_MAX_BATCH_SIZE
from clef_cli.errors import ClefError, UsageError
from clef_cli.job.lifecycle import open_job
from clef_cli.job.plan import plan_job, store_of
from clef_cli.job.settings import ScoreSettings
from clef_cli.model.scoring import Scorer
from clef_cli.progress import Progress
from clef_cli.release import DEFAULT_MODEL
from clef_cli.sizes import plural
from clef_cli.store.keep_policy import KEEP
from clef_cli.store.location import store_location
from clef_cli.store.manifest import scored_model, stored_engine
from clef_cli.store.opening import stored_hidden_dtype, stored_manifest

PLACEHOLDER_OUTPUT = "on-demand.parquet"
"""The output a train-head computation names for its locks (never written), beside the store's
folder: inside it, the store would hold an output (refused, `locations/overlap`)."""


@dataclass(frozen=True)
class OnDemandCost:
    """What computing the missing states took."""

    records: int
    """Records run through the thinker (their states are stored now)."""
    tokens: int
    seconds: float
    wanted: int = 0
    """Records asked for that had no stored states (a record that fails to encode is not run)."""

    def describe(self) -> str:
        if not self.records:
            return "every hidden state needed was stored"
        rate = f", {self.tokens / self.seconds:,.0f} tokens/s" if self.seconds > 0 else ""
        return (
            f"computed the hidden states of {plural(self.records, 'stored record')} without them "
            f"({self.tokens:,} prompt tokens through the thinker in {self.seconds:.1f} s{rate})"
        )


def states_settings(settings: ScoreSettings) -> ScoreSettings:
    """The settings of the run that fills the states in: the store's model, engine and dtype (so
    its manifest matches: a vLLM store gets its states from vLLM), states kept, nothing else of
    the caller's run (head, calibration)."""
    store = store_of(settings)
    manifest = stored_manifest(store)
    if manifest is None:
        raise UsageError(f"no checkpoint at {store} to compute hidden states for")
    dtype = (manifest.get("settings") or {}).get("dtype")
    return replace(
        settings,
        model=scored_model(manifest, settings.model) or DEFAULT_MODEL,
        engine=stored_engine(manifest),
        dtype=dtype,
        hidden_states=KEEP,
        hidden_dtype=stored_hidden_dtype(store) or settings.hidden_dtype,
        rehead=None,
        restart=False,
        calibration=None,
    )


def compute_missing_states(
    settings: ScoreSettings,
    progress: Progress | None = None,
    ids: Collection[str] | None = None,
    scorer: Scorer | None = None,
    stop: threading.Event | None = None,
) -> OnDemandCost:
    """Run the thinker on the job's records whose results are stored without states (only
    those whose id is in `ids`, when given: train-head's gold) and store their states. A record
    without a stored result is refused unless `ids` names it (the job is not finished)."""
    from clef_cli.engines.choice import local_engine
    from clef_cli.engines.local.pipeline import compute_dtype

    progress = progress or Progress()
    settings = states_settings(settings)
    started = time.monotonic()
    engine = local_engine(settings, progress, stop=stop, scorer=scorer)
    plan = plan_job(settings, engine.preflight, progress=progress)
    with open_job(plan, progress, compute_dtype(settings), stop=stop) as job:
        counts = job.ledger.counts
        if ids is None:
            missing = counts.run - counts.unhidden - counts.retried  # a retried key has its stored row
            if missing:
                raise ClefError(
                    f"checkpoint {job.checkpoint.where} holds {counts.records - counts.invalid - missing} of "
                    f"{counts.records - counts.invalid} records of this job; finish the job before --rehead"
                )
        else:
            job.ledger.restrict(set(ids))
        wanted = job.ledger.counts.run
        if wanted:
            progress.note(f"computing the hidden states of {plural(wanted, 'stored record')} without them")
            progress.start(wanted, 0)
            engine.score_marked(job)
        assert job.checkpoint.index is not None
        job.checkpoint.index.finish_run(job.checkpoint.run_id, job.summary.run_counts())
        summary = job.summary
    seconds = time.monotonic() - started if wanted else 0.0
    return OnDemandCost(summary.forwarded, summary.tokens, seconds, wanted)


def _beside(folder: Path) -> Path:
    return folder.with_name(f"{folder.name}.{PLACEHOLDER_OUTPUT}")


def gold_states(
    checkpoint: Path | str,
    records: Sequence[str | Path],
    gold: Path,
    gold_format: str = "auto",
    model: str | None = None,
    device: str = "auto",
    questions: Path | None = None,
    progress: Progress | None = None,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
) -> OnDemandCost:
    """train-head `--records`: the states of the gold records (ids in the gold file) that the
    store holds without them, computed from the records `clef score` took and stored, before the
    head is trained. The records are keyed with the default prompt settings and `questions`."""
    from clef_cli.quality.labels.gold import read_gold_rows

    rows, _ = read_gold_rows(gold, gold_format)
    settings = ScoreSettings(
        inputs=list(records),
        output=_beside(store_location(checkpoint).folder),
        model=model,
        questions=questions,
        device=device,
        checkpoint=checkpoint,
        max_batch_size=max_batch_size,
    )
    return compute_missing_states(settings, progress, ids={record_id for record_id, _ in rows})
