"""A run is resolved once (job/plan.py, issue 58): `ScoreSettings.validate()` checks values alone
(no file looked at, nothing changed), a run validates and plans once, and the plan holds what the
settings resolve to: the output target (a remote `-o` staged in the store), the store's
location, the inputs listed once, the questions read once; picklable, as a Ray actor gets it."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path

import pytest

from clef_cli.errors import UsageError
from clef_cli.job.plan import JobPlan, plan_job
from clef_cli.job.settings import ScoreSettings

from .support.helpers import SAMPLE_DATA, TINY_MODEL, settings_for, write_jsonl


def test_validate_reads_nothing_and_changes_nothing(tmp_path):
    """Inputs that do not exist, an output in a folder that does not exist, a store whose cache
    folder cannot be made: none of it is validate's business, and the settings are as given."""
    settings = ScoreSettings(
        inputs=[tmp_path / "nowhere" / "in.jsonl", "s3://no-such-bucket/in/"],
        output="s3://no-such-bucket/out/x.parquet",
        checkpoint="s3://no-such-bucket/store/",
        cache_dir=Path("/proc/no/cache"),
        questions=tmp_path / "missing.json",
        calibration="s3://no-such-bucket/cal.json",
    )
    before = copy.deepcopy(settings)
    settings.validate()
    assert settings == before
    assert not (tmp_path / "nowhere").exists()


def test_validate_still_refuses_values(tmp_path):
    for changed, words in [
        ({"output": "s3://b/out/x.parquet"}, "needs --checkpoint"),
        ({"checkpoint": "s3://b/store/", "sync_every": 0}, "--sync-every must be above 0"),
        ({"checkpoint": "s3://b/store/", "restart": True}, "--confirm-restart"),
        ({"checkpoint": "  "}, "names no folder"),
        ({"keep_sample": 2.0}, "--keep-sample must be between 0 and 1"),
    ]:
        settings = settings_for(tmp_path, **changed)
        with pytest.raises(UsageError, match=words):
            settings.validate()
    with pytest.raises(UsageError, match="--struct-nulls must be refuse, absent or null, not 'maybe'"):
        settings_for(tmp_path, struct_nulls="maybe")
    with pytest.raises(UsageError, match="--engine must be hf or vllm, not 'tgi'"):
        settings_for(tmp_path, engine="tgi")
    assert settings_for(tmp_path, struct_nulls="absent").struct_nulls.value == "absent"  # enums stay enums


def test_a_run_validates_once_and_reads_its_questions_once(tmp_path, monkeypatch):
    from clef_cli.engines.local.pipeline import ScoreJob
    from clef_cli.inputs import readers

    questions = tmp_path / "questions.json"
    questions.write_text((SAMPLE_DATA / "questions.json").read_text())
    records = [{"id": f"r{n}", "state": f"ticket {n}"} for n in range(3)]
    settings = settings_for(tmp_path, inputs=[write_jsonl(tmp_path / "in.jsonl", records)], questions=questions)
    calls = {"validate": 0, "questions": 0}
    validate, load = ScoreSettings.validate, readers.load_questions_file

    def counted_validate(self):
        calls["validate"] += 1
        validate(self)

    def counted_load(path):
        calls["questions"] += 1
        return load(path)

    monkeypatch.setattr(ScoreSettings, "validate", counted_validate)
    monkeypatch.setattr("clef_cli.job.plan.load_questions_file", counted_load)
    summary = ScoreJob(settings).run()
    assert summary.scored == 3
    assert calls == {"validate": 1, "questions": 1}


def test_the_plan_stages_a_remote_output_in_the_store_and_pickles(tmp_path, monkeypatch):
    """-o s3://… with a local --checkpoint: written at CHECKPOINT/upload/NAME, then uploaded; the
    bucket's writability is probed while planning (stubbed here: no bucket in this test)."""
    from clef_cli.job import plan as planning

    probed = []
    monkeypatch.setattr(planning, "ensure_writable", lambda target, option: probed.append((str(target), option)))
    records = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "state": "x", "questions": json.loads(
        (SAMPLE_DATA / "questions.json").read_text())}])  # fmt: skip
    settings = ScoreSettings(
        inputs=[records], output="s3://b/out/x.parquet", checkpoint=tmp_path / "store", model=str(TINY_MODEL)
    )
    plan = plan_job(settings)
    assert probed == [("s3://b/out/x.parquet", "-o")]
    assert plan.output.path == tmp_path / "store" / "upload" / "x.parquet"
    assert plan.output.upload == "s3://b/out/x.parquet" and plan.output.shown == "s3://b/out/x.parquet"
    assert plan.store.folder == tmp_path / "store" and not plan.store.remote
    assert [source.location for source in plan.sources] == [str(records)]
    assert plan.settings.max_length is not None  # the family's default filled in
    assert settings.max_length is None  # the settings stay as given
    again = pickle.loads(pickle.dumps(plan))
    assert isinstance(again, JobPlan) and again.output == plan.output and again.sources == plan.sources


def test_options_reach_the_settings_by_name_and_choices_read_as_their_values(tmp_path):
    from clef_cli.choices import Engine, Layout
    from clef_cli.cli.score_options import folded
    from clef_cli.job.settings import VllmOptions

    options = {"max_model_len": 512, "enforce_eager": True, "ray_actors": 3, "inputs": ["x"]}
    assert folded(VllmOptions, options) == VllmOptions(max_model_len=512, enforce_eager=True)
    assert folded(VllmOptions, options, max_model_len=7).max_model_len == 7  # a converted value wins
    settings = settings_for(tmp_path, layout="flat", engine=Engine.vllm)
    assert settings.layout is Layout.flat and settings.engine is Engine.vllm
    assert (str(settings.layout), f"{settings.engine}", f"{settings.layout:>5}") == ("flat", "vllm", " flat")
