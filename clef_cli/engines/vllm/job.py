"""`clef score --engine vllm`: the local engine's one job lifecycle (store, keys, resume,
per-record errors, output, stats) with vLLM as the backbone (scorer.py) instead of transformers."""

from __future__ import annotations

from clef_cli.engines.local.pipeline import ScoreJob, compute_dtype
from clef_cli.job import Job
from clef_cli.model.scoring import Scorer


class VllmScoreJob(ScoreJob):
    """A ScoreJob whose scorer is the vLLM worker, started when the first batch needs it (a job
    whose records are all in the store never starts it); the family is checked before any work."""

    version: str = ""

    def run(self):  # type: ignore[no-untyped-def]
        from clef_cli.engines.vllm.scorer import check_family
        from clef_cli.release import resolve_release

        check_family(resolve_release(self.settings.model, revision=self.settings.revision))
        try:
            return super().run()
        finally:
            self.close()

    def _load_scorer(self, job: Job) -> Scorer:
        if self.scorer is None:
            from clef_cli.engines.vllm.scorer import load_vllm_scorer

            self.progress.note("starting the vLLM worker")
            with job.summary.stats.stage("load"):
                log = job.checkpoint.path / "vllm.log"
                self.scorer = load_vllm_scorer(job.release, job.settings, compute_dtype(job.settings), log)
            self.version = self.scorer.backbone.worker.version  # type: ignore[attr-defined]
        return self.scorer

    def engine_metadata(self) -> dict[str, str]:
        """`clef.vllm_version`: the vLLM that computed this run's records ("" when none ran)."""
        return {"clef.vllm_version": self.version}

    def close(self) -> None:
        worker = getattr(getattr(self.scorer, "backbone", None), "worker", None)
        if worker is not None:
            worker.close()
