"""Issue 52's "Done when", each in real `clef score` processes on machines that share nothing but a
bucket (moto's S3 server behind the counting proxy; each machine its own cache folder, its own
CLEF_CACHE_DIR), counting every request the store's prefix sees:

- a job SIGKILLed mid-run is resumed at once on a fresh machine, reusing what was committed, with
  an output equal to an uninterrupted run's;
- two jobs writing one store at the same time both keep their results;
- night 2 on a fresh machine runs only the new records, with requests that grow with segments,
  not with records;
- `--rehead` from a fresh machine reproduces the scores (the states it computes on demand in the
  dtype the bucket holds);
- `--ray` keeps hidden states without a shared disk.

All slow: every process loads the tiny model (about 25 s each on the 2-core machine). The stores
live under their own prefixes of one bucket, built once for the module where tests share them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from .support.helpers import TINY_MODEL, assert_same_rows, write_jsonl
from .support.s3_proxy import TEST_ENVIRONMENT, Answered, emptied

pytestmark = pytest.mark.slow

BUCKET = "clef-store-done"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
COMMON = ["--model", str(TINY_MODEL), "--device", "cpu", "--workers", "0", "--quiet", "--max-length", "4096"]
COMMON += ["--max-batch-size", "1"]  # a part per record
STATES = ["--hidden-dtype", "float32"]  # scoring runs' (a rehead takes the store's own)
ONE_SEGMENT = ["--sync-every", "3600"]  # a job's one sync is its last: one segment a job
RECORDS = 8


def records(count: int, start: int = 0) -> list[dict]:
    numbers = range(start, start + count)
    return [{"id": f"r{n}", "state": f"ticket {n}: the printer is on fire", "questions": QUESTIONS} for n in numbers]


def store(prefix: str) -> str:
    return f"s3://{BUCKET}/{prefix}/"


@pytest.fixture(scope="module")
def bucket(s3_server, proxy):
    import boto3

    keys = {"aws_access_key_id": TEST_ENVIRONMENT["AWS_ACCESS_KEY_ID"]}
    keys |= {"aws_secret_access_key": TEST_ENVIRONMENT["AWS_SECRET_ACCESS_KEY"], "region_name": "us-east-1"}
    client = boto3.client("s3", endpoint_url=s3_server, **keys)
    client.create_bucket(Bucket=BUCKET)
    yield client
    emptied(client, BUCKET)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("done")


def machine_env(proxy, folder: Path, name: str, **extra: str) -> dict[str, str]:
    """A machine's environment: the bucket's endpoint and keys, its own cache folder, nothing else."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "CLEF_"))}
    return env | TEST_ENVIRONMENT | {"AWS_ENDPOINT_URL": proxy.url, "CLEF_CACHE_DIR": str(folder / name)} | extra


def command(inputs: list[Path], output: Path, prefix: str | Path, *extra: str) -> list[str]:
    """`clef score` of `inputs` into the store under `prefix` (a Path: a folder store); a scoring
    run's states in float32."""
    given = [str(path) for path in inputs]
    states = [] if "--rehead" in extra else STATES
    checkpoint = str(prefix) if isinstance(prefix, Path) else store(prefix)
    return [sys.executable, "-m", "clef_cli", "score", *given, "-o", str(output), "--checkpoint", checkpoint,
            *COMMON, *states, *extra]  # fmt: skip


def run(env: dict[str, str], inputs: list[Path], output: Path, prefix: str | Path, *extra: str) -> str:
    """A finished `clef score` process; its stderr (the summary)."""
    done = subprocess.run(command(inputs, output, prefix, *extra), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def forget_clients() -> None:
    """This process reads the store next as a fresh process would (its clients and manifests anew)."""
    from clef_cli.locations import buckets
    from clef_cli.store.remote import manifests

    buckets.forget()
    manifests.forget()


def latest_manifest(client, prefix: str) -> dict | None:
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/manifests/").get("Contents", [])
    if not listed:
        return None
    latest = max(item["Key"] for item in listed)
    return json.loads(client.get_object(Bucket=BUCKET, Key=latest)["Body"].read())


def seen(proxy, prefix: str) -> list[Answered]:
    """What the store under `prefix` was asked (its objects' requests and its listings)."""
    return [a for a in proxy.answered if a.path.startswith(f"/{BUCKET}/{prefix}/") or f"prefix={prefix}/" in a.path]


def kind(answered: Answered) -> str:
    """What a request asks for, without naming the object: `GET .keys`, `PUT manifest`, `LIST`."""
    path = answered.path.split("?")[0]
    if "list-type=" in answered.path:
        return "LIST"
    name = path.rsplit("/", 1)[-1]
    if name.startswith(".clef-probe-"):  # the store's write probe: a new name each job
        return f"{answered.method} probe"
    what = "manifest" if "/manifests/" in path else name if name == "latest.json" else "." + name.rsplit(".", 1)[-1]
    return f"{answered.method} {what}"


def gets(answers: list[Answered], suffix: str) -> list[Answered]:
    return [a for a in answers if a.method == "GET" and a.path.split("?")[0].endswith(suffix)]


@pytest.fixture(scope="module")
def uninterrupted(bucket, proxy, folder):
    """RECORDS records scored once, uninterrupted, into the store `clean/` (one segment)."""
    inputs = [write_jsonl(folder / "records.jsonl", records(RECORDS))]
    output = folder / "clean.parquet"
    run(machine_env(proxy, folder, "reference"), inputs, output, "clean", *ONE_SEGMENT)
    return {"inputs": inputs, "output": output}


def test_a_job_sigkilled_mid_run_resumes_at_once_on_a_fresh_machine(bucket, proxy, folder, uninterrupted):
    inputs = uninterrupted["inputs"]
    slow = machine_env(proxy, folder, "killed", CLEF_TEST_SLOW_COMMIT="1.5")
    killed = subprocess.Popen(command(inputs, folder / "killed.parquet", "killed", "--sync-every", "1"), env=slow,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while len((latest_manifest(bucket, "killed") or {}).get("segments") or {}) < 2:  # two syncs committed
        if killed.poll() is not None or time.monotonic() > deadline:
            killed.kill()
            pytest.fail(killed.communicate()[1][-3000:])
        time.sleep(0.2)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    kept = latest_manifest(bucket, "killed")
    committed, segments = sum(s["records"] for s in kept["segments"].values()), len(kept["segments"])
    assert 2 <= committed < RECORDS
    kept_objects = {f"/{BUCKET}/killed/segments/{name}.keys" for name in kept["segments"]}
    kept_objects |= {f"/{BUCKET}/killed/{s['results']}" for s in kept["segments"].values()}
    proxy.clear()
    started = time.monotonic()
    summary = run(machine_env(proxy, folder, "resumed"), inputs, folder / "resumed.parquet", "killed")
    assert f"{RECORDS - committed} run through the model, {committed} from the checkpoint" in summary, summary
    assert time.monotonic() - started < 240  # no lock or lease of the dead machine waited out
    asked = seen(proxy, "killed")
    assert len(gets(asked, ".keys")) == segments  # the store's keys: one object per segment
    assert len(gets(asked, ".results")) <= segments and gets(asked, ".hidden") == []
    assert not {a.path for a in asked if a.method == "PUT"} & kept_objects  # nothing committed is sent again
    assert_same_rows(rows(folder / "resumed.parquet"), rows(uninterrupted["output"]), 1e-5)


def test_two_jobs_writing_one_store_at_once_both_keep_their_results(bucket, proxy, folder, monkeypatch):
    from clef_cli.store.location import remote_location
    from clef_cli.store.opening import open_existing_store

    from .support.s3_proxy import point_at

    proxy.clear()
    jobs = []
    for number, start in ((1, 0), (2, 20)):
        inputs = [write_jsonl(folder / f"job{number}.jsonl", records(3, start=start))]
        slow = machine_env(proxy, folder, f"writer-{number}", CLEF_TEST_SLOW_COMMIT="0.5")
        argv = command(inputs, folder / f"job{number}.parquet", "shared", "--sync-every", "1")
        jobs.append(subprocess.Popen(argv, env=slow, stderr=subprocess.PIPE, text=True))
    for job in jobs:
        _, err = job.communicate(timeout=600)
        assert job.returncode == 0, err
        assert "3 run through the model, 0 from the checkpoint" in err, err
    puts = [a for a in seen(proxy, "shared") if a.method == "PUT" and "/manifests/" in a.path]
    written = Counter(a.path for a in puts if a.status == 200)
    assert set(written.values()) == {1}  # no manifest written twice: a conflict is a 412, then the next number
    assert {a.status for a in puts} <= {200, 412}
    listed = bucket.list_objects_v2(Bucket=BUCKET, Prefix="shared/manifests/")["Contents"]
    assert len(listed) == len(written)
    point_at(monkeypatch, proxy.url)
    monkeypatch.setenv("CLEF_CACHE_DIR", str(folder / "reader"))
    forget_clients()
    proxy.clear()
    reader = open_existing_store(remote_location(store("shared")), locked=False)  # a third machine
    try:
        assert reader.index.count() == 6 and [run["counts"]["run"] for run in reader.index.runs()] == [3, 3]
        assert len(gets(seen(proxy, "shared"), ".keys")) == len(reader.chain.known.segments)
    finally:
        reader.close()
    for number in (1, 2):
        assert [row["error"] for row in rows(folder / f"job{number}.parquet")] == [None] * 3


@pytest.fixture(scope="module")
def night_two(bucket, proxy, folder, uninterrupted):
    """Night 2 on fresh machines over two stores of one segment each, `clean/` (RECORDS records)
    and `small/` (2), each with one new record (its states dropped: computed on demand later);
    what each store was asked during its night 2, and the summaries."""
    small = [write_jsonl(folder / "small.jsonl", records(2))]
    run(machine_env(proxy, folder, "small-night-1"), small, folder / "small-1.parquet", "small", *ONE_SEGMENT)
    grown = {
        "clean": write_jsonl(folder / "clean-2.jsonl", records(RECORDS) + records(1, start=100)),
        "small": write_jsonl(folder / "small-2.jsonl", records(2) + records(1, start=100)),
    }
    proxy.clear()
    jobs = {}
    for prefix, inputs in grown.items():  # both at once, each on its own fresh machine
        argv = command([inputs], folder / f"{prefix}-2.parquet", prefix, *ONE_SEGMENT, "--hidden-states", "drop")
        env = machine_env(proxy, folder, f"{prefix}-night-2")
        jobs[prefix] = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    summaries = {}
    for prefix, job in jobs.items():
        _, summaries[prefix] = job.communicate(timeout=600)
        assert job.returncode == 0, summaries[prefix]
    asked = {prefix: seen(proxy, prefix) for prefix in grown}
    return {"inputs": grown, "summaries": summaries, "asked": asked}


def test_night_two_on_a_fresh_machine_runs_the_new_records_in_requests_that_grow_with_segments(
    night_two, proxy, folder, monkeypatch
):
    from typer.testing import CliRunner

    from clef_cli.cli import app

    from .support.s3_proxy import point_at

    summaries, asked = night_two["summaries"], night_two["asked"]
    assert f"1 run through the model, {RECORDS} from the checkpoint" in summaries["clean"], summaries["clean"]
    assert "1 run through the model, 2 from the checkpoint" in summaries["small"], summaries["small"]
    shapes = {prefix: sorted(kind(answered) for answered in answers) for prefix, answers in asked.items()}
    assert shapes["clean"] == shapes["small"]  # 8 stored records or 2: the same requests, one by one
    assert len(gets(asked["clean"], ".keys")) == 1 and len(gets(asked["clean"], ".results")) == 1  # one segment
    assert gets(asked["clean"], ".hidden") == [] and len(asked["clean"]) <= 16, shapes["clean"]
    point_at(monkeypatch, proxy.url)
    monkeypatch.setenv("CLEF_CACHE_DIR", str(folder / "planner"))  # a dry run from yet another machine
    forget_clients()
    proxy.clear()
    argv = ["score", str(night_two["inputs"]["clean"]), "-o", str(folder / "planned.parquet")]
    argv += ["--checkpoint", store("clean"), *COMMON, "--hidden-states", "drop", "--dry-run"]  # as night 2 ran
    planned = CliRunner().invoke(app, argv)
    assert planned.exit_code == 0 and f"already in the checkpoint: {RECORDS + 1}" in planned.stdout, planned.output
    writes = [a for a in seen(proxy, "clean") if a.method != "GET"]
    # only the write probe (docs/scoring.md, Errors; its removal: tests/test_store_preflight.py)
    assert writes and all(kind(a) in ("PUT probe", "DELETE probe") for a in writes), "a dry run wrote to the store"


def test_a_rehead_from_a_fresh_machine_reproduces_the_scores(bucket, proxy, folder, night_two, monkeypatch):
    from typer.testing import CliRunner

    from clef_cli.cli import app
    from clef_cli.store.hidden_store import file_states_dtype
    from clef_cli.store.location import remote_location
    from clef_cli.store.opening import open_existing_store

    from .support.s3_proxy import point_at

    proxy.clear()
    output = folder / "rehead.parquet"
    summary = run(machine_env(proxy, folder, "rehead"), [night_two["inputs"]["clean"]], output, "clean",
                  "--rehead", str(TINY_MODEL))  # fmt: skip  # the release's own head: the night's numbers
    assert "computed the hidden states of 1 stored record without them" in summary, summary
    assert_same_rows(rows(output), rows(folder / "clean-2.parquet"), 1e-5)
    states = gets(seen(proxy, "clean"), ".hidden")
    assert all(a.range for a in states) and len(states) == RECORDS + 2  # a part's states each; a header twice
    point_at(monkeypatch, proxy.url)
    monkeypatch.setenv("CLEF_CACHE_DIR", str(folder / "inspector"))  # another fresh machine
    forget_clients()
    shown = CliRunner().invoke(app, ["checkpoint", "info", store("clean"), "--json"])
    assert shown.exit_code == 0, shown.output
    info = json.loads(shown.stdout)
    assert info["keys"] == info["keys_with_hidden_states"] == RECORDS + 1
    finished = [(run["counts"]["run"], run["counts"]["reused"]) for run in info["runs"] if run["finished"]]
    # night 1, night 2, the states computed and the rehead, wherever each ran
    assert finished == [(RECORDS, 0), (1, RECORDS), (1, RECORDS), (0, RECORDS + 1)], info["runs"]
    reader = open_existing_store(remote_location(store("clean")), locked=False)  # every state in float32
    try:
        assert {file_states_dtype(shard.local()) for shard in reader.hidden_shards()} == {"float32"}
    finally:
        reader.close()


def test_train_head_reads_only_the_gold_records_states_and_trains_the_folder_stores_head(
    bucket, proxy, folder, uninterrupted, monkeypatch, tmp_path
):
    """train-head on the bucket store from a fresh machine (the store made by a keep run on
    another) downloads the states of the gold records' parts only, and trains byte for byte the
    head train-head trains from a folder store the same run made."""
    from typer.testing import CliRunner

    from clef_cli.cli import app

    from .support.s3_proxy import point_at

    local = folder / "folder-store"
    run(machine_env(proxy, folder, "folder"), uninterrupted["inputs"], folder / "folder.parquet", local)
    labels = [{"id": f"r{n}", "labels": {"urgent": "true" if n % 3 else "false"}} for n in range(6)]
    gold = write_jsonl(tmp_path / "gold.jsonl", labels)
    common = ["--gold", str(gold), "--folds", "2", "--epochs", "1", "--device", "cpu", "--force", "--quiet"]
    point_at(monkeypatch, proxy.url)
    monkeypatch.setenv("CLEF_CACHE_DIR", str(folder / "trainer"))
    forget_clients()
    proxy.clear()
    heads = {}
    for name, checkpoint in (("bucket", store("clean")), ("folder", str(local))):
        trained = CliRunner().invoke(app, ["train-head", checkpoint, "-o", str(tmp_path / name), *common])
        assert trained.exit_code == 0, trained.output
        heads[name] = (tmp_path / name / "joint_head.safetensors").read_bytes()
    assert heads["bucket"] == heads["folder"]
    states = gets(seen(proxy, "clean"), ".hidden")
    assert len(states) == len(labels) and all(a.range for a in states)  # the gold records' parts, by range
    reports = [json.loads((tmp_path / name / "training_report.json").read_text())["gold"] for name in heads]
    assert reports[0] == reports[1] and reports[0]["records"] == len(labels)


@pytest.mark.ray
def test_ray_keeps_hidden_states_without_a_shared_disk(store_env, cluster, bucket, proxy, folder):
    inputs = [write_jsonl(folder / "ray.jsonl", records(6))]
    proxy.clear()
    driver = machine_env(proxy, folder, "driver")
    ray = ["--ray", "--ray-address", cluster, "--ray-actors", "2", "--cpus-per-worker", "0.5", "--block-records", "2"]
    run(driver, inputs, folder / "ray.parquet", "ray", *ray)
    put = {a.path.split("?")[0] for a in seen(proxy, "ray") if a.method == "PUT" and ".hidden" in a.path}
    manifest = latest_manifest(bucket, "ray")
    named = {f"/{BUCKET}/ray/{name}" for segment in manifest["segments"].values() for name in segment["hidden"]}
    parts = sum(segment["parts"] for segment in manifest["segments"].values())
    assert named == put and len(put) == parts  # each batch's states sent once, by its actor; the driver sent none
    assert not list((folder / "driver").rglob("ray-*")), "an actor wrote into the driver's cache"
    proxy.clear()
    output = folder / "ray-rehead.parquet"
    run(machine_env(proxy, folder, "ray-rehead"), inputs, output, "ray", "--rehead", str(TINY_MODEL))
    assert_same_rows(rows(output), rows(folder / "ray.parquet"), 1e-5)
    assert len(gets(seen(proxy, "ray"), ".hidden")) == parts  # each batch's states, once
