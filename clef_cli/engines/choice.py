"""The scoring engine a job's settings name (`--engine`), for every command that runs one: score,
its dry run, and the states computed on demand for `--rehead` and train-head."""

from __future__ import annotations

import threading

from clef_cli.engines.local.pipeline import ScoreJob
from clef_cli.job.settings import ScoreSettings
from clef_cli.model.scoring import Scorer
from clef_cli.progress import Progress


def local_engine(
    settings: ScoreSettings,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    scorer: Scorer | None = None,
) -> ScoreJob:
    """The HF engine, or vLLM as its backbone (the same lifecycle, engines/vllm/job.py)."""
    if settings.engine == "vllm":
        from clef_cli.engines.vllm.job import VllmScoreJob

        return VllmScoreJob(settings, progress, stop=stop, scorer=scorer)
    return ScoreJob(settings, progress, stop=stop, scorer=scorer)
