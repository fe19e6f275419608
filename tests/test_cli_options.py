"""The CLI's contract with the framework: every command and option documented, fixed choices and
sizes checked by Typer (exit 2, choices listed), options that cannot apply refused before any work,
and one error boundary that maps failures to exit codes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.errors import ClefError

from .support.helpers import SAMPLE_DATA, TINY_MODEL, require_ray

runner = CliRunner()
RECORDS = str(SAMPLE_DATA / "records.jsonl")


def commands(group, path=()):
    """Every leaf command of the `clef` registry, with its path (`("checkpoint", "info")`)."""
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


def test_every_command_and_option_has_help_and_every_command_ends_with_examples():
    from clef_cli.cli.examples import AT_SCALE, RUNNABLE

    root = typer.main.get_command(app)
    found = dict(commands(root))
    assert {" ".join(path) for path in found} >= {
        "score", "inspect-spans", "eval", "calibrate", "train-head", "checkpoint info"
    }  # fmt: skip
    for param in root.params:
        assert param.help, f"clef {param.opts}"
    for path, command in found.items():
        assert command.help and command.help.strip(), path
        for param in command.params:
            assert getattr(param, "help", None), f"clef {' '.join(path)} {param.name}"
        shown = runner.invoke(app, [*path, "--help"])
        assert shown.exit_code == 0, shown.output
        head, examples = shown.stdout.split("Examples, from a source checkout's root", 1)
        assert "Options:" in head and "--help" in head and "Options:" not in examples  # the examples end it
        listed = [line.strip() for line in examples.splitlines() if line.strip().startswith("clef ")]
        name = " ".join(path)
        assert listed == [*RUNNABLE[name], *AT_SCALE.get(name, ())], name  # tests/test_help_examples.py runs them
        assert len(RUNNABLE[name]) >= 2 and any(line.startswith(f"clef {name} ") for line in RUNNABLE[name])
        assert all(line.split()[1] in {p[0] for p in found} for line in listed)


@pytest.mark.parametrize(
    ("args", "choices"),
    [
        (["--dtype", "float8"], "'float8' is not one of auto, bfloat16, float16 or float32"),
        (["--hidden-dtype", "fp8"], "'fp8' is not one of bfloat16, float16 or float32"),
        (["--struct-nulls", "skip"], "'skip' is not one of refuse, absent or null"),
        (["--layout", "flatt"], "'flatt' is not one of wide, long or flat"),
        (["--device", "gpu"], "'gpu' is not a device (use auto, cpu, cuda or cuda:N)"),
        (["--max-file-bytes", "12Q"], "not a size: '12Q'"),
    ],
)
def test_a_bad_choice_or_size_exits_2_before_any_work_and_says_what_is_allowed(tmp_path, args, choices):
    result = runner.invoke(app, ["score", RECORDS, "-o", str(tmp_path / "o.parquet"), *args])
    assert result.exit_code == 2, result.output
    assert choices in result.stderr and args[0] in result.stderr
    assert not (tmp_path / "o.parquet.ckpt").exists()


def test_choices_are_listed_in_help():
    shown = runner.invoke(app, ["score", "--help"]).stdout
    for listed in ("<wide|long|flat>", "<keep|selective|drop>", "<truncate|error>", "<auto|bfloat16|float16|float32>"):
        assert listed in shown
    assert "<auto|global|type|question>" in runner.invoke(app, ["calibrate", "--help"]).stdout


def test_counts_read_in_their_number_with_thousands_separated():
    """Summaries say `1 completed run`, not `1 completed runs`, and `43,728 tokens`."""
    from clef_cli.sizes import plural

    assert [plural(1, "completed run"), plural(0, "shard"), plural(2, "hidden-state shard")] == [
        "1 completed run", "0 shards", "2 hidden-state shards"
    ]  # fmt: skip
    assert [plural(43728, "token"), plural(1, "copy", "copies"), plural(1200, "copy", "copies")] == [
        "43,728 tokens", "1 copy", "1,200 copies"
    ]  # fmt: skip


def test_sizes_are_parsed_as_bytes():
    """K, M, G are powers of 1024, with or without `B`/`iB`; decimals allowed."""
    from clef_cli.cli.options import size

    assert [size(text) for text in ("1024", "1.5K", "2M", "1GiB", "3kb")] == [1024, 1536, 2 * 2**20, 2**30, 3072]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-file-bytes", "1K"], "file is 6395 bytes, over the limit of 1024"),
        (["--max-image-pixels", "100"], "image is 240x180 = 43200 pixels, over the limit of 100"),
    ],
)
def test_the_media_limit_options_reach_the_encoder(args, message):
    """The five media-limit options are declared once (with_media_limits); their values arrive."""
    base = ["inspect-spans", RECORDS, "--id", "ticket-003", "-m", str(TINY_MODEL), "--json"]
    assert runner.invoke(app, base).exit_code == 0
    result = runner.invoke(app, [*base, *args])
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: record 'ticket-003', field 'images[0]': {message}" + (
        ": media/parcel.jpg" if "bytes" in message else ""  # the entry as the record wrote it
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--ray-address", "ray://head:10001"],
        ["--ray-actors", "2"],
        ["--gpus-per-worker", "1"],
        ["--cpus-per-worker", "0.5"],
        ["--block-records", "10"],
        ["--stall-timeout", "60"],
    ],
)
def test_ray_only_options_without_ray_exit_2_naming_the_option(tmp_path, args):
    result = runner.invoke(app, ["score", RECORDS, "-o", str(tmp_path / "o.parquet"), *args, "--dry-run"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"error: {args[0]} applies to Ray runs only: add --ray"


def test_rehead_with_ray_exits_2(tmp_path):
    result = runner.invoke(app, ["score", RECORDS, "-o", str(tmp_path / "o.parquet"), "--ray", "--rehead", "head"])
    assert result.exit_code == 2
    assert "--rehead" in result.stderr and "drop --ray" in result.stderr


class Captured(Exception):
    pass


def test_ray_address_comes_from_the_environment_and_is_ignored_without_ray(tmp_path, monkeypatch):
    require_ray()
    import clef_cli.engines.ray.job

    seen = {}

    class Capturing:
        def __init__(self, settings, cluster, progress, stop):
            seen["address"], seen["actors"] = cluster.address, cluster.num_workers

        def run(self):
            raise ClefError("captured")

    monkeypatch.setattr(clef_cli.engines.ray.job, "RayScoreJob", Capturing)
    base = ["score", RECORDS, "-o", str(tmp_path / "o.parquet"), "-m", str(TINY_MODEL), "--device", "cpu"]
    environment = {"RAY_ADDRESS": "ray://head-node:10001"}
    result = runner.invoke(app, [*base, "--ray", "--ray-actors", "3"], env=environment)
    assert result.exit_code == 1 and "error: captured" in result.stderr, result.output
    assert seen == {"address": "ray://head-node:10001", "actors": 3}
    result = runner.invoke(app, [*base, "--ray", "--ray-address", "local"], env=environment)
    assert seen["address"] is None  # the command line wins; `local` starts a local cluster
    # A Ray cluster sets RAY_ADDRESS for every process: a plain local run must not be refused.
    result = runner.invoke(app, [*base, "--limit", "2", "--dry-run"], env=environment)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("engine", "tensor_parallel", "device", "gpus"),
    [("vllm", 2, "auto", 2.0), ("vllm", None, "auto", 1.0), ("hf", 2, "auto", 1.0), ("vllm", 2, "cpu", 0.0)],
)
def test_a_ray_actor_asks_for_the_gpus_of_one_model(monkeypatch, engine, tensor_parallel, device, gpus):
    """Without --gpus-per-worker, an actor holds one model: vLLM's spans --tensor-parallel-size
    GPUs, the HF engine's one; on the CPU none (CUDA reported available in every case)."""
    require_ray()
    import torch

    from clef_cli.choices import Engine
    from clef_cli.cli.score_options import ray_settings

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    options = dict(gpus_per_worker=None, tensor_parallel_size=tensor_parallel, engine=Engine(engine))
    options |= dict(ray_address=None, ray_actors=None, cpus_per_worker=1.0, block_records=1000, stall_timeout=600)
    assert ray_settings(options, device, quiet=True).gpus_per_worker == gpus


def test_short_q_is_quiet_and_questions_is_long_only():
    root = typer.main.get_command(app)
    for path, command in commands(root):
        for param in command.params:
            if "-q" in getattr(param, "opts", ()):
                assert param.name == "quiet", (path, param.name)
            if param.name == "quiet":
                assert "-q" in param.opts, path
            if param.name == "questions":
                assert param.opts == ["--questions"], path


@pytest.mark.slow  # the quick loop's budget (issue 36.12): CI's whole run has it
def test_quiet_train_head_prints_no_stage_lines(tmp_path):
    """-q on train-head: the stage and epoch lines (shown without it, even off a terminal) go away;
    the gate's verdict still prints, and the exit code is the same."""
    output = tmp_path / "out.parquet"
    posts, questions = SAMPLE_DATA / "posts.jsonl", SAMPLE_DATA / "questions.json"
    scored = runner.invoke(
        app,
        ["score", str(posts), "--questions", str(questions), "-o", str(output), "-m", str(TINY_MODEL),
         "--device", "cpu", "--limit", "6", "-q"],
    )  # fmt: skip
    assert scored.exit_code == 0, scored.output
    command = ["train-head", str(tmp_path / "out.parquet.ckpt"), "--gold", str(SAMPLE_DATA / "posts_gold.jsonl"),
               "--folds", "2", "--epochs", "1", "--device", "cpu"]  # fmt: skip
    loud = runner.invoke(app, [*command, "-o", str(tmp_path / "loud")])
    quiet = runner.invoke(app, [*command, "-o", str(tmp_path / "quiet"), "-q"])
    assert loud.exit_code == quiet.exit_code and loud.exit_code in (0, 4), loud.output
    stages = ("verifying 1 hidden-state shard\n", "labels, 2 folds")  # one shard: no "1 ... shards"
    assert all(stage in loud.stderr for stage in stages)
    assert not any(stage in quiet.stderr for stage in stages) and "final training loss" not in quiet.stderr
    assert "gate" in quiet.stderr


def boom(*args, **kwargs):
    raise RuntimeError("boom")


def test_unexpected_errors_are_one_line_and_show_the_traceback_only_with_v(tmp_path, monkeypatch):
    from clef_cli.store.checkpoint import Checkpoint

    monkeypatch.setattr(Checkpoint, "open_existing", boom)
    plain = runner.invoke(app, ["checkpoint", "info", str(tmp_path)])
    assert plain.exit_code == 1
    assert plain.stderr.splitlines() == ["error: RuntimeError: boom (run `clef -v ...` for the traceback)"]
    verbose = runner.invoke(app, ["-v", "checkpoint", "info", str(tmp_path)])
    assert verbose.exit_code == 1
    assert "Traceback (most recent call last)" in verbose.stderr and "RuntimeError: boom" in verbose.stderr


def test_job_errors_exit_1_usage_errors_2_and_an_interrupt_130(tmp_path, monkeypatch):
    from clef_cli.store.checkpoint import Checkpoint

    missing = runner.invoke(app, ["checkpoint", "info", str(tmp_path)])  # not a checkpoint: the user's slip
    assert missing.exit_code == 2 and missing.stderr.startswith("error: ") and len(missing.stderr.splitlines()) == 1
    (tmp_path / "manifest.json").write_text('{"format_version": 2,')  # a damaged store: the job cannot go on
    old = runner.invoke(app, ["checkpoint", "info", str(tmp_path)])
    assert old.exit_code == 1 and old.stderr.startswith("error: ") and len(old.stderr.splitlines()) == 1

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Checkpoint, "open_existing", interrupted)
    result = runner.invoke(app, ["checkpoint", "info", str(tmp_path)])
    assert result.exit_code == 130 and result.stderr.strip() == "interrupted"


def test_help_and_the_torch_free_commands_do_not_import_torch():
    code = (
        "import sys\nfrom clef_cli.cli import main\n"
        "for args in (['--help'], ['score', '--help'], ['inspect-spans', '--help'], ['eval', '--help'],\n"
        "             ['calibrate', '--help'], ['train-head', '--help'], ['checkpoint', 'info', '--help'],\n"
        "             ['checkpoint', 'prune', '--help']):\n"
        "    sys.argv = ['clef', *args]\n"
        "    try:\n        main()\n    except SystemExit as done:\n        assert done.code == 0, args\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] in ('torch', 'ray', 'transformers')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_python_dash_m_and_the_version_option():
    done = subprocess.run([sys.executable, "-m", "clef_cli", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("clef ")


def test_checkpoint_info_reads_a_real_checkpoint_without_importing_torch(tmp_path):
    from .support.helpers import SAMPLE_DATA, TINY_MODEL

    out = tmp_path / "out.parquet"
    scored = runner.invoke(
        app,
        [
            "score",
            str(SAMPLE_DATA / "posts.jsonl"),
            "--questions",
            str(SAMPLE_DATA / "questions.json"),
            "-o",
            str(out),
            "--model",
            str(TINY_MODEL),
            "--workers",
            "0",
            "-q",
        ],
    )
    assert scored.exit_code == 0, scored.output
    code = (
        "import sys\nfrom clef_cli.cli import main\n"
        f"sys.argv = ['clef', 'checkpoint', 'info', {str(out) + '.ckpt'!r}]\n"
        "try:\n    main()\nexcept SystemExit as done:\n    assert done.code == 0\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] in ('torch', 'ray', 'transformers')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "keys: 5 in 1 shard (1 shard with hidden states, 5 keys with their states)" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"
