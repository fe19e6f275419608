"""`clef score --engine vllm`: the local engine's one job lifecycle (store, keys, resume,
per-record errors, output, stats) with vLLM as the backbone (scorer.py) instead of transformers."""

from __future__ import annotations

from pathlib import Path

from clef_cli.engines.local.pipeline import ScoreJob, compute_dtype
from clef_cli.engines.local.plan_report import DryRunReport
from clef_cli.engines.vllm.client import VllmWorker
from clef_cli.engines.vllm.limits import engine_refusal, prompt_limit
from clef_cli.job.lifecycle import Job
from clef_cli.job.settings import ScoreSettings
from clef_cli.job.summary import JobSummary
from clef_cli.model.scoring import Scorer
from clef_cli.release import Release

VLLM_LOG = "vllm.log"
"""vLLM's own output, in the checkpoint folder (a Ray actor's, appended with its pid in a header)."""


class VllmScoreJob(ScoreJob):
    """A ScoreJob whose scorer is the vLLM worker, started when the first batch needs it (a job
    whose records are all in the store never starts it); vLLM's Python and the family are
    checked before anything is written, by the run and the dry run alike."""

    version: str = ""
    planned_limit: int | None = None
    """What vLLM's prompt limit will be before it is loaded (--max-model-len, or the release's),
    from the release the preflight was given: every run, dry run and on-demand job calls it."""

    def preflight(self, settings: ScoreSettings, release: Release) -> None:
        from clef_cli.engines.vllm.client import vllm_python
        from clef_cli.engines.vllm.scorer import check_family

        check_family(release)
        vllm_python()
        self.planned_limit = prompt_limit(settings, release)

    def engine_refusal(self, length: int) -> tuple[str, str] | None:
        return engine_refusal(length, self.limit())

    @property
    def worker(self) -> VllmWorker | None:
        """The started worker (None until the first batch needs it)."""
        return getattr(getattr(self.scorer, "backbone", None), "worker", None)

    def limit(self) -> int | None:
        """vLLM's prompt limit: the loaded engine's own, else what it will derive (limits.py)."""
        loaded = self.worker.max_model_len if self.worker is not None else None
        return loaded or self.planned_limit

    def dry_run(self) -> DryRunReport:
        """The local dry run, with the prompts over vLLM's limit counted as the run refuses them."""
        report = super().dry_run()
        limit = report.engine_limit = self.planned_limit
        over = report.over_engine_limit = sum(1 for length in report.lengths if limit is not None and length > limit)
        if over:
            report.failed_by_kind["overflow"] = report.failed_by_kind.get("overflow", 0) + over
            report.valid -= over
        return report

    def run(self) -> JobSummary:
        try:
            return super().run()
        finally:
            self.close()

    def score_marked(self, job: Job) -> None:
        try:
            super().score_marked(job)
        finally:
            self.close()

    def start_scorer(self, release: Release, settings: ScoreSettings, folder: Path) -> Scorer:
        """The vLLM worker started and loaded, its output in `folder`/vllm.log."""
        from clef_cli.engines.vllm.scorer import load_vllm_scorer

        dtype = compute_dtype(settings)
        self.scorer = load_vllm_scorer(release, settings, dtype, folder / VLLM_LOG, self.stop)
        assert self.worker is not None
        self.version = self.worker.version
        return self.scorer

    def _load_scorer(self, job: Job) -> Scorer:
        if self.scorer is None:
            self.progress.phase("starting vLLM")
            try:
                with job.summary.stats.stage("load"):
                    self.start_scorer(job.release, job.settings, job.checkpoint.path)
            finally:
                self.progress.phase(None)
        assert self.scorer is not None
        return self.scorer

    def actor_env(self) -> dict[str, str]:
        """vLLM's Python, for the Ray actors (each starts a worker of its own with it)."""
        from clef_cli.engines.vllm.client import PYTHON_ENV, vllm_python

        return {PYTHON_ENV: vllm_python()}

    def engine_metadata(self) -> dict[str, str]:
        """`clef.vllm_version`: the vLLM that computed this run's records ("" when none ran)."""
        return {"clef.vllm_version": self.version}

    def close(self) -> None:
        """The worker stopped and its shared-memory files removed; then those of any clef on this
        machine that was killed before it could remove its own (a local run, a Ray actor)."""
        from clef_cli.engines.vllm.transport import remove_orphans, shared_folder

        super().close()
        remove_orphans(shared_folder())
