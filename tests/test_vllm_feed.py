"""The vLLM engine's feed (issue 37): hidden states through shared memory in the compute dtype,
requests in flight with results and commits in the same order, eager mode only where needed, and
a worker that dies with requests outstanding loses nothing committed."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from clef_cli.engines.vllm.transport import StateSlots, padded_bytes
from tests.support.helpers import TINY_MODEL
from tests.test_vllm_engine import TEXT_IDS, rows, score, vllm_python, write_records

WORKER = Path(__file__).resolve().parent.parent / "clef_cli" / "engines" / "vllm" / "worker.py"


def worker_module():
    """The worker's own module, loaded as its process loads it (it imports no vLLM at the top)."""
    spec = importlib.util.spec_from_file_location("clef_vllm_worker_under_test", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- transport

WRITER = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("w", sys.argv[1])
worker = importlib.util.module_from_spec(spec); spec.loader.exec_module(worker)
dtype = getattr(torch, sys.argv[4])
states = torch.load(sys.argv[5])
view = worker.Slots().view(sys.argv[2], int(sys.argv[3]), dtype, tuple(states.shape))
view.copy_(states)
"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_states_cross_processes_through_shared_memory_bit_for_bit(tmp_path, dtype):
    """Another process writes states into a slot with the worker's own code; clef's view of the
    same pages holds them exactly, in the compute dtype (bf16 stays bf16: no float32 detour)."""
    states = torch.randn(3, 17, 2048, generator=torch.Generator().manual_seed(0)).to(dtype)
    torch.save(states, tmp_path / "states.pt")
    slots = StateSlots()
    try:
        slot = slots.take(padded_bytes(3, 17, 2048, dtype))
        command = [sys.executable, "-c", WRITER, str(WORKER), str(slot.path), str(slot.size)]
        subprocess.run([*command, str(dtype).removeprefix("torch."), str(tmp_path / "states.pt")], check=True)
        view = slot.view((3, 17, 2048), dtype)
        assert view.dtype == dtype and torch.equal(view, states)
        assert view.untyped_storage().nbytes() >= states.nbytes  # a view of the mapped file, not a copy
    finally:
        slots.close()
    assert not slot.path.exists()


def test_a_slot_is_reused_only_after_its_states_are_released():
    slots = StateSlots()
    try:
        first = slots.take(1024)
        slots.lend(first)
        second = slots.take(1024)
        assert second.path != first.path  # the head may still read the first
        slots.release_read()
        assert slots.take(4096).path == first.path  # grown, not remade
        assert first.size >= 4096
    finally:
        slots.close()


def test_released_slots_are_lent_once_over_many_rounds(tmp_path):
    """Twenty rounds of two batches in flight (their states read by the head) and one more take:
    the extra slot is never one still in flight, and no slot is counted twice (a release that
    kept its list of read slots put them back on the free list again every round)."""
    slots = StateSlots(folder=tmp_path)
    try:
        for _ in range(20):
            in_flight = [slots.take(1024), slots.take(1024)]
            for slot in in_flight:
                slots.lend(slot)
            extra = slots.take(1024)
            assert all(extra is not slot for slot in in_flight)
            slots.give_back(extra)
            assert len(slots.free) + len(slots.read) <= len(slots.every)
            slots.release_read()
            assert len(slots.free) + len(slots.read) <= len(slots.every) == 3
    finally:
        slots.close()


# ----------------------------------------------------------------------------- eager mode


def test_eager_mode_only_on_the_cpu_build_or_when_forced():
    engine_options = worker_module().engine_options
    assert engine_options({"dtype": "bfloat16"}, on_cpu=False)["enforce_eager"] is False
    assert engine_options({"dtype": "bfloat16", "enforce_eager": True}, on_cpu=False)["enforce_eager"] is True
    assert engine_options({"dtype": "float32"}, on_cpu=True)["enforce_eager"] is True


@pytest.mark.parametrize("on_cpu", [False, True], ids=["cuda", "cpu"])
@pytest.mark.parametrize("eager", [False, True], ids=["compiled", "eager"])
def test_prefix_caching_is_off_in_every_engine_the_worker_builds(on_cpu, eager):
    """With prefix caching on, vLLM hands the pooler only the uncached tokens' states (vllm#44485):
    a record sharing a prefix with an earlier one would get fewer states than tokens. Off however
    the engine runs, and no option of clef's turns it on."""
    engine_options = worker_module().engine_options
    options = {"dtype": "bfloat16", "enforce_eager": eager, "enable_prefix_caching": True, "max_model_len": 4096}
    built = engine_options(options, on_cpu=on_cpu)
    assert built["enable_prefix_caching"] is False
    assert built["mm_processor_cache_gb"] == 0


def test_enforce_eager_passes_from_the_command_line_to_the_worker(monkeypatch, tmp_path):
    """`--enforce-eager` reaches the options the worker is started with."""
    from clef_cli.cli import score as score_command
    from clef_cli.engines.vllm import scorer

    seen = {}
    real = score_command.score_settings

    def spy(options, limits):
        seen["settings"] = real(options, limits)
        raise SystemExit(0)

    monkeypatch.setattr(score_command, "score_settings", spy)
    records = write_records(tmp_path, TEXT_IDS[:1])
    code, _ = score(TINY_MODEL, records, tmp_path / "o.parquet", "--engine", "vllm", "--enforce-eager")
    assert code == 0
    assert scorer.worker_options(seen["settings"], "float32")["enforce_eager"] is True
    code, _ = score(TINY_MODEL, records, tmp_path / "o.parquet", "--engine", "vllm")
    assert scorer.worker_options(seen["settings"], "float32")["enforce_eager"] is False
    code, output = score(TINY_MODEL, records, tmp_path / "o.parquet", "--enforce-eager")
    assert code == 2 and "--engine vllm" in output


# ----------------------------------------------------------------------------- requests in flight


def _observed(backbone, depth: int, calls: list) -> tuple:
    """The backbone's own submit and forward, each call noted as (what, depth, first record id)."""
    submit, forward = backbone.submit, backbone.forward

    def noted_submit(records):
        calls.append(("submit", depth, records[0].record.id))
        return submit(records)

    def noted_forward(records, *rest):
        calls.append(("forward", depth, records[0].record.id))
        return forward(records, *rest)

    return noted_submit, noted_forward


def test_batches_in_flight_keep_results_and_commits_in_order(tmp_path):
    """A backbone that runs two batches ahead is asked for batch N+1 before batch N's states are
    scored; the journal's commits and the output are those of one batch at a time."""
    from clef_cli.engines.local.pipeline import ScoreJob
    from clef_cli.job.settings import ScoreSettings
    from clef_cli.model.scoring import load_scorer

    records = write_records(tmp_path, TEXT_IDS)
    journals, outputs, calls = [], [], []
    for depth in (1, 2):
        scorer = load_scorer(str(TINY_MODEL), device="cpu")
        backbone = scorer.backbone
        type(backbone).in_flight = depth
        backbone.submit, backbone.forward = _observed(backbone, depth, calls)
        out = tmp_path / f"out{depth}.parquet"
        settings = ScoreSettings(
            inputs=[records],
            output=out,
            model=str(TINY_MODEL),
            workers=0,
            max_batch_size=1,
            device="cpu",
            hidden_states="keep",
        )
        try:
            ScoreJob(settings, scorer=scorer).run()
        finally:
            type(backbone).in_flight = 1
        journal = (out.with_name(out.name + ".ckpt") / "journal.jsonl").read_text().splitlines()
        journals.append([json.loads(line).get("records") for line in journal])
        outputs.append(out.read_bytes() and rows(out))
    ahead = [call for call in calls if call[1] == 2]
    assert ahead[:3] == [("submit", 2, ahead[0][2]), ("submit", 2, ahead[1][2]), ("forward", 2, ahead[0][2])]
    assert journals[0] == journals[1]
    assert outputs[0] == outputs[1]


# ----------------------------------------------------------------------------- the worker dies


def _worker_pid(parent: int) -> int | None:
    found = subprocess.run(["pgrep", "-P", str(parent), "-f", "worker.py"], capture_output=True, text=True)
    pids = [int(pid) for pid in found.stdout.split()]
    return pids[0] if pids else None


@pytest.mark.slow
def test_a_worker_that_dies_with_requests_in_flight_loses_no_commit(tmp_path):
    """SIGKILL to the vLLM worker while clef has two requests outstanding: clef stops with one
    line naming the log (exit 1), every committed batch stays, and the rerun's output equals the
    HF engine's (which an uninterrupted vLLM run equals, tests/test_vllm_engine.py)."""
    from tests.support.vllm_release import cached_release
    from tests.test_vllm_engine import journal_records, rerun_finishes_as_hf, vllm_env

    vllm_python()
    release = cached_release()
    inputs = write_records(tmp_path, TEXT_IDS)
    output = tmp_path / "out.parquet"
    command = [sys.executable, "-m", "clef_cli", "score", str(inputs), "-o", str(output), "--model", str(release)]
    command += ["--device", "cpu", "--dtype", "float32", "--workers", "0", "--quiet", "--engine", "vllm"]
    command += ["--max-batch-size", "1", "--hidden-states", "keep", "--cpu-kv-cache-gib", "1"]
    env = {**vllm_env(), "CLEF_TEST_SLOW_VLLM": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checkpoint = output.with_name("out.parquet.ckpt")
    deadline = time.monotonic() + 300
    while journal_records(checkpoint) < 2:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    worker = _worker_pid(process.pid)
    assert worker is not None
    subprocess.run(["kill", f"-{signal.SIGKILL.value}", str(worker)], check=True)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr
    assert "vLLM worker stopped" in stderr and "vllm.log" in stderr
    assert "Traceback" not in stderr
    assert not list(Path("/dev/shm").glob(f"clef-vllm-{process.pid}-*"))  # its shared-memory files removed
    rerun_finishes_as_hf(command, output, release, inputs, tmp_path)
