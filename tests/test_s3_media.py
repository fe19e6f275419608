"""Media in an object store (moto's S3 server, behind a counting proxy): decoded exactly as local
copies, confined to the input's folder and --media-root URIs, errors sorted into the record's and
the job's, and a second night that lists folders and downloads nothing."""

from __future__ import annotations

import io
import json
import shutil
import threading

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.locations import object_store
from clef_cli.locations.uris import LocationProblem, is_under, joined, normalized

from .support.helpers import MEDIA, TINY_MODEL, assert_same_rows, write_jsonl

runner = CliRunner()
BUCKET = "clef-media"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"}}
COMMON = ["--model", str(TINY_MODEL), "--workers", "0", "--quiet", "--hidden-states", "drop", "--max-length", "8192"]


@pytest.fixture
def s3(store_bucket, proxy):
    """A bucket reached through the proxy (requests counted); boto3 goes to the server directly.
    No retries of clef's own: pyarrow's are enough here."""
    proxy.failure_status = 503
    object_store.forget()
    return store_bucket


def upload(client, folder, prefix):
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(folder).as_posix()}")


def media_folder(tmp_path):
    """records.jsonl with relative media beside it, as a local folder."""
    folder = tmp_path / "in"
    (folder / "img").mkdir(parents=True)
    (folder / "av").mkdir()
    shutil.copy(MEDIA / "image_a.png", folder / "img" / "a.png")
    shutil.copy(MEDIA / "image_b.png", folder / "img" / "b.png")
    shutil.copy(MEDIA / "tone_16k_mono.wav", folder / "av" / "tone.wav")
    shutil.copy(MEDIA / "clip_av.mp4", folder / "av" / "clip.mp4")
    records = [
        {"id": "img", "state": "two images", "questions": QUESTIONS, "images": ["img/a.png", "img/b.png"]},
        {"id": "aud", "state": "a tone", "questions": QUESTIONS, "audio": ["av/tone.wav"]},
        {"id": "vid", "state": "a clip", "questions": QUESTIONS, "videos": ["av/clip.mp4"]},
    ]
    write_jsonl(folder / "records.jsonl", records)
    return folder, records


def score(inputs, output, *extra):
    result = runner.invoke(app, ["score", *inputs, "-o", str(output), *COMMON, *extra])
    return result, (pq.read_table(output).to_pylist() if output.exists() else None)


def test_locations_resolve_like_paths_and_roots_respect_the_separator():
    assert joined("s3://b/records/", "img/a.png") == "s3://b/records/img/a.png"
    assert joined("s3://b/records/", "img/../x/./a.png") == "s3://b/records/x/a.png"
    assert joined("s3://b/records/", "../media/a.png") == "s3://b/media/a.png"
    assert normalized("S3://b//m/a.png") == "s3://b/m/a.png"
    assert is_under("s3://b/media/x.png", "s3://b/media")
    assert not is_under("s3://b/media-private/x.png", "s3://b/media")
    assert not is_under("s3://b/media-private/x.png", "s3://b/media/")
    assert not is_under("s3://c/media/x.png", "s3://b/media")
    for bad in ("s3://b/../../x", "s3://b/x?endpoint_override=evil:9000", "s3:///x"):
        with pytest.raises(LocationProblem):
            normalized(bad)


@pytest.mark.slow  # several scoring runs with the model (about 30 s on the 2-core machine)
def test_object_media_score_exactly_as_local_copies(s3, tmp_path):
    folder, records = media_folder(tmp_path)
    upload(s3, folder, "in")
    shared = ["--checkpoint", str(tmp_path / "shared")]
    local, local_rows = score([str(folder / "records.jsonl")], tmp_path / "local.parquet", *shared)
    assert local.exit_code == 0, local.output
    relative, rows = score([f"s3://{BUCKET}/in/records.jsonl"], tmp_path / "rel.parquet")
    assert relative.exit_code == 0, relative.output
    assert "3 run through the model" in relative.stderr, relative.stderr
    assert_same_rows(rows, local_rows)
    fields = ("images", "audio", "videos")
    absolute = [
        {**record, **{f: [f"s3://{BUCKET}/in/{e}" for e in record[f]] for f in fields if f in record}}
        for record in records
    ]
    s3.put_object(Bucket=BUCKET, Key="in/absolute.jsonl", Body="".join(json.dumps(r) + "\n" for r in absolute))
    # the same bytes give the same key from a local file or an object: the store has them all
    result, absolute_rows = score([f"s3://{BUCKET}/in/absolute.jsonl"], tmp_path / "abs.parquet", *shared)
    assert result.exit_code == 0, result.output
    assert "0 run through the model, 3 from the checkpoint" in result.stderr, result.stderr
    assert_same_rows(absolute_rows, local_rows)


def test_objects_are_confined_to_the_inputs_folder_and_the_media_roots(s3, tmp_path):
    image = (MEDIA / "image_a.png").read_bytes()
    for key in ("in/img/a.png", "media/a.png", "media-private/a.png"):
        s3.put_object(Bucket=BUCKET, Key=key, Body=image)
    entries = {
        "inside": "img/a.png",
        "dotted": "img/../img/./a.png",
        "absolute": f"s3://{BUCKET}/in/img/a.png",
        "root": f"s3://{BUCKET}/media/a.png",
        "sibling": f"s3://{BUCKET}/media-private/a.png",
        "climb": "../media-private/a.png",
        "climb_abs": f"s3://{BUCKET}/in/../media-private/a.png",
        "missing": "img/none.png",
    }
    lines = "".join(
        json.dumps({"id": k, "state": "x", "questions": QUESTIONS, "images": [v]}) + "\n" for k, v in entries.items()
    )
    s3.put_object(Bucket=BUCKET, Key="in/records.jsonl", Body=lines)
    inputs = [f"s3://{BUCKET}/in/records.jsonl"]
    result, rows = score(inputs, tmp_path / "o.parquet", "--media-root", f"s3://{BUCKET}/media")
    assert result.exit_code == 3, result.output
    errors = {row["id"]: (row["error_kind"], row["error"]) for row in rows}
    for ok in ("inside", "dotted", "absolute", "root"):
        assert errors[ok] == (None, None), errors[ok]
    for refused in ("sibling", "climb", "climb_abs"):
        kind, message = errors[refused]
        assert kind == "media" and "--media-root" in message and "media-private/a.png" in message, message
    assert errors["missing"][0] == "media" and "object not found" in errors["missing"][1]
    # without the root, the media bucket's object is refused too; the input's folder still allowed
    result, rows = score(inputs, tmp_path / "o2.parquet")
    errors = {row["id"]: row["error_kind"] for row in rows}
    assert errors["root"] == "media" and errors["inside"] is None


def test_throttling_is_retried_then_transient(s3, proxy, monkeypatch, tmp_path):
    monkeypatch.setattr(object_store, "RETRY_DELAYS", (0.01,))  # the client's ATTEMPTS, then clef's one more round
    s3.put_object(Bucket=BUCKET, Key="in/a.png", Body=(MEDIA / "image_a.png").read_bytes())
    s3.put_object(Bucket=BUCKET, Key="in/b.png", Body=(MEDIA / "image_b.png").read_bytes())
    lines = [{"id": n, "state": "x", "questions": QUESTIONS, "images": [f"{n}.png"]} for n in ("a", "b")]
    s3.put_object(Bucket=BUCKET, Key="in/records.jsonl", Body="".join(json.dumps(r) + "\n" for r in lines))
    proxy.failures.update({"in/a.png": 3, "in/b.png": 1000})
    result, rows = score([f"s3://{BUCKET}/in/records.jsonl"], tmp_path / "o.parquet")
    assert result.exit_code == 3, result.output
    errors = {row["id"]: (row["error_kind"], row["error"]) for row in rows}
    assert errors["a"] == (None, None), errors["a"]  # 503 three times, then answered
    assert errors["b"][0] == "transient" and "kept failing" in errors["b"][1], errors["b"]
    proxy.failures.clear()  # the next run tries the transient record again and scores it
    again, rows = score([f"s3://{BUCKET}/in/records.jsonl"], tmp_path / "o.parquet")
    assert again.exit_code == 0, again.output


def test_a_missing_object_is_asked_for_once_never_retried(s3, proxy, monkeypatch):
    """Only a transient failure (throttling, 5xx, a timeout) is tried again (`_retried`): a missing
    object is the record's error at the first answer, however many retries a transient one gets."""
    monkeypatch.setattr(object_store, "RETRY_DELAYS", (0.0, 0.0))
    with pytest.raises(LocationProblem, match="object not found") as missing:
        object_store.read_object(f"s3://{BUCKET}/in/missing.png", 1 << 20, io.BytesIO())
    assert not missing.value.transient
    assert [path for _, path in proxy.requests] == [f"/{BUCKET}/in/missing.png"]


def test_a_throttled_listing_is_transient_never_an_empty_folder(s3, proxy):
    """A LIST the store keeps throttling (after pyarrow's own retries, about 6 s) makes the
    object's stamp a transient problem (the next run tries the record again), never `object not
    found` from a folder read as empty; the same folder lists once the store answers."""
    s3.put_object(Bucket=BUCKET, Key="in/a.png", Body=(MEDIA / "image_a.png").read_bytes())
    proxy.failures["list-type=2"] = 10_000
    with pytest.raises(LocationProblem, match="kept failing") as throttled:
        object_store.stamp(f"s3://{BUCKET}/in/a.png")
    assert throttled.value.transient
    proxy.failures.clear()
    assert object_store.stamp(f"s3://{BUCKET}/in/a.png").size == (MEDIA / "image_a.png").stat().st_size


def test_no_credentials_or_an_unknown_bucket_end_the_job_with_one_line(s3, monkeypatch, tmp_path):
    s3.put_object(Bucket=BUCKET, Key="in/a.png", Body=(MEDIA / "image_a.png").read_bytes())
    records = [
        {"id": f"r{i}", "state": "x", "questions": QUESTIONS, "images": [f"s3://{BUCKET}/in/a.png"]} for i in range(3)
    ]
    records.append({"id": "gone", "state": "x", "questions": QUESTIONS, "images": ["s3://no-such-bucket-here/a.png"]})
    local = write_jsonl(tmp_path / "records.jsonl", records)
    output, store = tmp_path / "o.parquet", tmp_path / "store"
    args = [
        "--media-root",
        f"s3://{BUCKET}/in/",
        "--media-root",
        "s3://no-such-bucket-here/",
        "--checkpoint",
        str(store),
    ]
    result, _ = score([str(local)], output, *args)
    assert result.exit_code == 2, result.output  # the URI must change: exit 2 (locations/failures.py)
    assert "no-such-bucket-here" in result.stderr and "does not exist" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not output.exists()
    write_jsonl(local, records[:3])
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    result, _ = score([str(local)], output, *args)
    assert result.exit_code == 1, result.output
    assert ": no credentials (" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not output.exists()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "clef-test")  # credentials back: nothing was lost
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "clef-test-secret")
    result, rows = score([str(local)], output, *args)
    assert result.exit_code == 0, result.output
    assert [row["error"] for row in rows] == [None] * 3


def test_a_second_night_lists_and_downloads_no_unchanged_object(s3, proxy, monkeypatch, tmp_path):
    from clef_cli.store import media_stats

    monkeypatch.setattr(media_stats, "RACY_NS", 0)  # the store dates objects to the second
    folder, records = media_folder(tmp_path)
    upload(s3, folder, "in")
    inputs, store = [f"s3://{BUCKET}/in/records.jsonl"], ["--checkpoint", str(tmp_path / "store")]
    first, _ = score(inputs, tmp_path / "n1.parquet", *store)
    assert first.exit_code == 0, first.output
    media_gets = proxy.count("GET", "/in/img/") + proxy.count("GET", "/in/av/")
    assert media_gets >= 4  # each object read once while keying (spooled for the encoder)
    assert proxy.count("GET", "/in/img/a.png") == 1, proxy.requests
    proxy.clear()
    second, _ = score(inputs, tmp_path / "n2.parquet", *store)
    assert second.exit_code == 0, second.output
    assert "0 run through the model, 3 from the checkpoint" in second.stderr, second.stderr
    assert proxy.count("GET", "/in/img/") + proxy.count("GET", "/in/av/") == 0, proxy.requests
    assert proxy.count("HEAD", "/in/img/") + proxy.count("HEAD", "/in/av/") == 0, proxy.requests
    lists = [path for method, path in proxy.requests if method == "GET" and "list-type=2" in path]
    assert len(lists) == 2, lists  # one LIST per folder: in/img/ and in/av/
    # an edited object is read and its record scored again; the others still are not
    s3.put_object(Bucket=BUCKET, Key="in/img/b.png", Body=(MEDIA / "image_a.png").read_bytes() + b"\0")
    proxy.clear()
    third, _ = score(inputs, tmp_path / "n3.parquet", *store)
    assert third.exit_code == 0, third.output
    assert "1 run through the model, 2 from the checkpoint" in third.stderr, third.stderr
    assert proxy.count("GET", "/in/img/b.png") == 1 and proxy.count("GET", "/in/av/") == 0, proxy.requests
    proxy.clear()
    verified, _ = score(inputs, tmp_path / "n4.parquet", *store, "--verify-media")
    assert verified.exit_code == 0, verified.output
    assert proxy.count("GET", "/in/av/clip.mp4") == 1  # --verify-media downloads and hashes again
    # every state edited: new keys, the media keyed from the cache; the encoder reads each object
    # once (then from the job's copy), not once for planning and again for the batch
    edited = [{**record, "state": record["state"] + " (edited)"} for record in records]
    s3.put_object(Bucket=BUCKET, Key="in/records.jsonl", Body="".join(json.dumps(r) + "\n" for r in edited))
    proxy.clear()
    rescored, _ = score(inputs, tmp_path / "n5.parquet", *store)
    assert rescored.exit_code == 0 and "3 run through the model" in rescored.stderr, rescored.output
    for name in ("img/a.png", "img/b.png", "av/tone.wav", "av/clip.mp4"):
        assert proxy.count("GET", f"/in/{name}") == 1, (name, proxy.requests)


@pytest.mark.slow  # several scoring runs with the model (about 30 s on the 2-core machine)
def test_a_remote_output_needs_a_checkpoint_and_appears_only_whole(s3, proxy, tmp_path):
    from clef_cli.locations.object_store import filesystem

    (tmp_path / "in").mkdir()
    records = write_jsonl(tmp_path / "in" / "records.jsonl", [{"id": "a", "state": "x", "questions": QUESTIONS}])
    target = f"s3://{BUCKET}/out/night.parquet"
    refused = runner.invoke(app, ["score", str(records), "-o", target, *COMMON])
    assert refused.exit_code == 2 and "--checkpoint" in refused.stderr, refused.output
    assert len(refused.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    store = tmp_path / "store"
    proxy.failures[f"PUT /{BUCKET}/out/night.parquet"] = 10_000  # the upload fails (at once: a 503 would be
    proxy.failure_status = 400  # retried for seconds); the check before the job (a probe beside it) passes
    failed = runner.invoke(app, ["score", str(records), "-o", target, "--checkpoint", str(store), *COMMON])
    assert failed.exit_code == 1 and "rerun to upload it again" in failed.stderr, failed.output
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix="out/").get("KeyCount") == 0  # no object, no partial one
    proxy.failures.clear()
    proxy.failure_status = 503
    kept = ["--keep-staged-output"]  # to compare the upload with its stage (removed after an upload otherwise)
    again = runner.invoke(app, ["score", str(records), "-o", target, "--checkpoint", str(store), *kept, *COMMON])
    assert again.exit_code == 0, again.output
    assert "0 run through the model, 1 from the checkpoint" in again.stderr, again.stderr
    assert again.stderr.splitlines()[0].endswith(f"-> {target}"), again.stderr  # the URI given, not the stage
    keys = [item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET, Prefix="out/")["Contents"]]
    assert keys == ["out/night.parquet"]  # no folder marker, no probe
    fs, path = filesystem(target)
    uploaded = pq.read_table(fs.open_input_file(path)).to_pylist()
    assert_same_rows(uploaded, pq.read_table(store / "upload" / "night.parquet").to_pylist())
    assert [row["id"] for row in uploaded] == ["a"]


def test_credentials_lost_while_decoding_end_the_job_with_one_line(s3, monkeypatch, tmp_path):
    from clef_cli.store import media_stats

    monkeypatch.setattr(media_stats, "RACY_NS", 0)
    s3.put_object(Bucket=BUCKET, Key="in/img/a.png", Body=(MEDIA / "image_a.png").read_bytes())
    records = [{"id": "text", "state": "no media", "questions": QUESTIONS}]
    image = f"s3://{BUCKET}/in/img/a.png"
    records.append({"id": "img", "state": "one image", "questions": QUESTIONS, "images": [image]})
    local = write_jsonl(tmp_path / "records.jsonl", records[1:])
    inputs = [str(local)]
    store = ["--checkpoint", str(tmp_path / "store"), "--media-root", f"s3://{BUCKET}/in/"]
    first, _ = score(inputs, tmp_path / "o.parquet", *store)  # caches the image's digest
    assert first.exit_code == 0, first.output
    # night 2: the image record's state changed (it runs again, its image keyed from the cache,
    # so read only by the encoder), and the credentials are gone by then
    records[1]["state"] = "one image, edited"
    write_jsonl(local, records)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    second, rows = score(inputs, tmp_path / "o2.parquet", *store)
    assert second.exit_code == 1, second.output
    assert ": no credentials (" in second.stderr and len(second.stderr.strip().splitlines()) == 1, second.stderr
    assert rows is None  # no output with an error row per record


def test_the_one_writer_puts_an_object_whole_or_not_at_all(s3, proxy):
    from clef_cli.locations.object_store import ObjectStoreError
    from clef_cli.store.atomic import ensure_writable, write_text

    target = f"s3://{BUCKET}/out/stats.json"
    ensure_writable(target, "--stats-json", stdout=True)  # the bucket takes a write (a probe, removed)
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix="out/").get("KeyCount") == 0
    write_text(target, '{"night": 1}\n')
    assert s3.get_object(Bucket=BUCKET, Key="out/stats.json")["Body"].read() == b'{"night": 1}\n'
    proxy.failures[f"PUT /{BUCKET}/out/stats.json"], proxy.failure_status = 10_000, 400
    with pytest.raises(ObjectStoreError, match="rerun to upload it again"):
        write_text(target, '{"night": 2}\n')
    assert s3.get_object(Bucket=BUCKET, Key="out/stats.json")["Body"].read() == b'{"night": 1}\n'  # untouched
    keys = [item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET, Prefix="out/")["Contents"]]
    assert keys == ["out/stats.json"]  # no folder marker (pyarrow made one at every delete)


def test_an_upload_the_store_refuses_leaves_the_target_and_nothing_beside_it(s3, proxy):
    """The store refused the put onto the target: the target stays as it was, and nothing else is
    left beside it (no temporary key, no folder marker)."""
    from clef_cli.locations.object_store import ObjectStoreError
    from clef_cli.store.atomic import write_text

    target = f"s3://{BUCKET}/out/stats.json"
    write_text(target, '{"night": 1}\n')
    proxy.clear()
    proxy.failures[f"/{BUCKET}/out/stats.json"], proxy.failure_status = 10_000, 400  # the target's key alone
    with pytest.raises(ObjectStoreError, match="rerun to upload it again"):
        write_text(target, '{"night": 2}\n')
    puts = [path for method, path in proxy.requests if method == "PUT"]
    assert any(path.startswith(f"/{BUCKET}/out/stats.json") for path in puts)  # the target was asked
    assert s3.get_object(Bucket=BUCKET, Key="out/stats.json")["Body"].read() == b'{"night": 1}\n'  # untouched
    keys = [item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET, Prefix="out/")["Contents"]]
    assert keys == ["out/stats.json"]


def test_the_quality_commands_read_their_tables_from_the_store(s3, tmp_path):
    """eval, calibrate, review and compare take a scored file and a gold file as s3:// URIs and
    say the same as they say of the local files (only the names they print differ)."""
    from .support.helpers import FIXTURES

    scored = FIXTURES / "output_golden"
    rows = pq.read_table(scored / "wide.parquet").to_pylist()
    gold = [  # a label of each question's options, in turn, so some agree with the answers and some not
        {"id": row["id"], "labels": {a["question_id"]: a["labels"][n % len(a["labels"])]["label"] for a in answers}}
        for n, (row, answers) in enumerate((row, row["answers"]) for row in rows)
        if answers
    ]
    local = {"old.parquet": scored / "wide.parquet", "new.parquet": scored / "wide-kept-calibrated.parquet"}
    local["gold.jsonl"] = write_jsonl(tmp_path / "gold.jsonl", gold)
    for name, path in local.items():
        s3.upload_file(str(path), BUCKET, f"tables/{name}")
    remote = {name: f"s3://{BUCKET}/tables/{name}" for name in local}

    def run(where, *command):
        named = {name: str(value) for name, value in where.items()}
        out = tmp_path / ("s3" if where is remote else "local")
        out.mkdir(exist_ok=True)
        argv = [part.format(out=out, **{n.split(".")[0]: v for n, v in named.items()}) for part in command]
        result = runner.invoke(app, argv)
        assert result.exit_code == 0, (argv, result.output)
        return result.stdout.replace(named["old.parquet"], "OLD").replace(named["new.parquet"], "NEW"), out

    commands = [
        ["eval", "{old}", "--gold", "{gold}", "--json", "{out}/metrics.json", "--format", "tsv"],
        ["calibrate", "{old}", "--gold", "{gold}", "-o", "{out}/cal.json", "--method", "global", "--format", "tsv"],
        ["review", "{new}", "-o", "{out}/review.jsonl", "--format", "jsonl", "--exclude", "{gold}", "--limit", "5"],
        ["compare", "{old}", "{new}", "--json", "{out}/drift.json"],
    ]
    for command in commands:
        assert run(remote, *command)[0] == run(local, *command)[0], command
    for name in ("metrics.json", "cal.json", "review.jsonl", "drift.json"):
        text = {where: (tmp_path / where / name).read_text() for where in ("s3", "local")}
        for where, named in (("s3", remote), ("local", local)):
            for key, value in named.items():
                text[where] = text[where].replace(str(value), key)
        assert text["s3"] == text["local"], name
    assert json.loads((tmp_path / "s3" / "drift.json").read_text())["old"]["path"] == remote["old.parquet"]
    missing = runner.invoke(app, ["eval", f"s3://{BUCKET}/tables/none.parquet", "--gold", remote["gold.jsonl"]])
    assert missing.exit_code == 2 and "object not found" in missing.stderr, missing.output
    assert len(missing.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # a Ray cluster and two scoring runs (about 40 s on the 2-core machine)
@pytest.mark.ray
def test_ray_actors_read_object_media_as_the_local_run_reads_copies(store_env, cluster, s3, tmp_path):
    from clef_cli.engines.local.pipeline import ScoreJob
    from clef_cli.engines.ray.job import RayScoreJob, RaySettings

    from .support.helpers import settings_for

    folder, _ = media_folder(tmp_path)
    upload(s3, folder, "in")
    small = {"hidden_states": "drop", "max_length": 8192}
    local = ScoreJob(settings_for(tmp_path, [folder / "records.jsonl"], "local.parquet", **small)).run()
    assert local.failed == 0
    remote = settings_for(tmp_path, [f"s3://{BUCKET}/in/records.jsonl"], "ray.parquet", **small)
    summary = RayScoreJob(remote, RaySettings(num_workers=1, cpus_per_worker=0.5, block_records=2)).run()
    assert summary.failed == 0 and summary.forwarded == 3, summary
    rows = pq.read_table(tmp_path / "ray.parquet").to_pylist()
    assert_same_rows(rows, pq.read_table(tmp_path / "local.parquet").to_pylist())
    assert all(row["error"] is None for row in rows)


@pytest.mark.slow  # a real `clef score` process loads the model, then is killed (about 15 s)
def test_a_remote_output_killed_mid_upload_leaves_no_upload_behind_and_the_rerun_uploads(s3, proxy, tmp_path):
    """Issue 51.2: a SIGKILL during the upload left an incomplete multipart upload that no rerun
    aborts (neither pyarrow nor obstore can list one). The output now goes up in one PUT (up to
    uploads.SINGLE_PUT_BYTES), straight to its key: killed during it, the store holds the whole
    object or none, and no multipart upload."""
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "in").mkdir()
    records = write_jsonl(tmp_path / "in" / "records.jsonl", [{"id": "a", "state": "x", "questions": QUESTIONS}])
    target, store = f"s3://{BUCKET}/out/night.parquet", tmp_path / "store"
    argv = ["score", str(records), "-o", target, "--checkpoint", str(store), *COMMON]
    # held: the first request carrying the output's bytes under out/ (not the check's empty probe)
    proxy.hold = lambda method, path: method == "PUT" and "/out/" in path and "clef-probe" not in path
    proxy.held, proxy.release = threading.Event(), threading.Event()
    try:
        job = subprocess.Popen([sys.executable, "-m", "clef_cli", *argv], env=os.environ.copy(), stderr=subprocess.PIPE)
        assert proxy.held.wait(180), job.communicate(timeout=5)  # its output is on its way to the store
        job.send_signal(signal.SIGKILL)
        assert job.wait(30) == -signal.SIGKILL
    finally:
        proxy.release.set()  # the held request goes on to the store now, as a late one would
        proxy.hold = None
    time.sleep(1)  # the released request reaches the store
    assert not s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads"), "an upload no rerun can abort"
    keys = [item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET, Prefix="out/").get("Contents", [])]
    assert keys in ([], ["out/night.parquet"]), keys  # the whole object or none, nothing beside it
    staged = (store / "upload" / "night.parquet").read_bytes()
    if keys:
        assert s3.get_object(Bucket=BUCKET, Key="out/night.parquet")["Body"].read() == staged
    proxy.clear()
    again = runner.invoke(app, [*argv, "--keep-staged-output"])  # its stage kept, to compare with the upload
    assert again.exit_code == 0, again.output
    assert "0 run through the model, 1 from the checkpoint" in again.stderr, again.stderr
    keys = [item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET, Prefix="out/")["Contents"]]
    assert keys == ["out/night.parquet"], keys
    rewritten = (store / "upload" / "night.parquet").read_bytes()  # written again from the store
    assert s3.get_object(Bucket=BUCKET, Key="out/night.parquet")["Body"].read() == rewritten
