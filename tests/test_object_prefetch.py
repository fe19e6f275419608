"""A planning window's objects read into the job's spool before its records are encoded, several
at a time (encoding/object_prefetch.py), against moto's S3 server behind the counting proxy: each
object one GET per job, the fence asked before any request, the size limit and a missing object
kept as the encoder's errors, reads that overlap, and a stop request that ends them."""

from __future__ import annotations

import json
import threading

import pyarrow.parquet as pq
import pytest

from clef_cli.encoding.media_limits import MediaLimits
from clef_cli.encoding.object_prefetch import ObjectPrefetch, PrefetchStopped
from clef_cli.encoding.remote_spool import RemoteSpool
from clef_cli.inputs.records import Record
from clef_cli.locations.remote_fetch import FetchError

from .support.helpers import MEDIA, settings_for
from .test_s3_media import BUCKET, QUESTIONS, s3  # noqa: F401 (its bucket fixture)

IMAGES = [MEDIA / "image_a.png", MEDIA / "image_b.png"]


def image_bytes(number: int) -> bytes:
    """A distinct object per number (bytes after a PNG's end are ignored by decoders)."""
    return IMAGES[number % 2].read_bytes() + number.to_bytes(4, "big")


def put_images(client, count: int, prefix: str = "in/img") -> list[str]:
    names = []
    for number in range(count):
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{number}.png", Body=image_bytes(number))
        names.append(f"img/{number}.png")
    return names


def record(index: int, *images: str) -> Record:
    return Record(str(index), index, "x", (), images=tuple(images), base_dir=f"s3://{BUCKET}/in/")


def outcome(future) -> str:
    try:
        future.result(timeout=60)
    except PrefetchStopped:
        return "stopped"
    return "read"


def concurrent_gets(proxy, wanted: int = 2, seconds: float = 2.0):
    """Hold each media GET until `wanted` of them are in flight at once (or `seconds` pass, so
    reads one after the other end too, before the store client's own timeout of 3 s gives up
    and asks again); returns [in flight, most in flight at once]."""
    seen = [0, 0]
    lock = threading.Lock()
    enough = threading.Event()

    def hold(method: str, path: str) -> bool:
        if method != "GET" or "/in/img/" not in path:
            return False
        with lock:
            seen[0] += 1
            seen[1] = max(seen)
            if seen[0] >= wanted:
                enough.set()
        enough.wait(seconds)
        with lock:
            seen[0] -= 1
        return False

    proxy.hold = hold
    return seen


def test_a_windows_objects_are_read_once_each_into_the_spool_several_at_a_time(s3, proxy, tmp_path):  # noqa: F811
    names = put_images(s3, 6)
    s3.put_object(Bucket=BUCKET, Key="in/big.png", Body=b"\0" * 5000)
    s3.put_object(Bucket=BUCKET, Key="other/secret.png", Body=image_bytes(9))
    folder = tmp_path / "remote-media"
    folder.mkdir()
    limits = MediaLimits(max_file_bytes=4000, remote_spool=folder)
    records = [record(number, name) for number, name in enumerate(names)]
    records.append(record(6, names[0], names[1]))  # named again: not read again
    records.append(record(7, "gone.png", "big.png", "../other/secret.png", f"s3://{BUCKET}/other/secret.png"))
    seen = concurrent_gets(proxy)
    try:
        with ObjectPrefetch(limits) as prefetch:
            futures = prefetch.records(records)
            assert [outcome(future) for future in futures] == ["read"] * 8
            assert prefetch.records(records) == [None] * 8  # all in the spool now: nothing to read
    finally:
        proxy.hold = None
    assert seen[1] >= 2, seen  # the reads overlapped
    spool = RemoteSpool(folder)
    for number, name in enumerate(names):
        uri = f"s3://{BUCKET}/in/{name}"
        assert spool.stored(uri) == image_bytes(number)
        assert proxy.count("GET", f"/in/{name}") == 1 and proxy.count("HEAD", f"/in/{name}") == 1, proxy.requests
    # the fence is asked before any request: an object outside the input's folder is never asked for
    assert not any("secret" in path for _, path in proxy.requests), proxy.requests
    # a missing object and one over --max-file-bytes are the records' errors, kept for the encoder
    for name, transient in (("gone.png", False), ("big.png", False)):
        with pytest.raises(FetchError) as error:
            spool.stored(f"s3://{BUCKET}/in/{name}")
        assert error.value.transient is transient
    assert proxy.count("GET", "/in/big.png") == 0  # its size is checked before a byte is read
    assert not list(folder.glob(".*.tmp"))


def test_a_throttled_object_stays_transient_for_the_encoder(s3, proxy, tmp_path):  # noqa: F811
    names = put_images(s3, 2)
    folder = tmp_path / "remote-media"
    folder.mkdir()
    proxy.failures[f"/in/{names[1]}"] = 1000
    with ObjectPrefetch(MediaLimits(remote_spool=folder)) as prefetch:
        assert [outcome(future) for future in prefetch.records([record(0, *names)])] == ["read"]
    spool = RemoteSpool(folder)
    assert spool.stored(f"s3://{BUCKET}/in/{names[0]}") == image_bytes(0)
    with pytest.raises(FetchError) as error:
        spool.stored(f"s3://{BUCKET}/in/{names[1]}")
    assert error.value.transient


def test_a_stop_request_ends_the_reads_and_leaves_no_partial_file(s3, proxy, tmp_path):  # noqa: F811
    names = put_images(s3, 12)
    folder = tmp_path / "remote-media"
    folder.mkdir()
    stop = threading.Event()
    proxy.hold = lambda method, path: method == "GET" and "/in/img/" in path
    proxy.held, proxy.release = threading.Event(), threading.Event()
    try:
        with ObjectPrefetch(MediaLimits(remote_spool=folder), stop, requests=2) as prefetch:
            futures = prefetch.records([record(number, name) for number, name in enumerate(names)])
            assert proxy.held.wait(30)
            stop.set()  # the first GET is in flight: a stop request
            proxy.release.set()
            outcomes = [outcome(future) for future in futures]
    finally:
        proxy.hold = None
        proxy.release.set()
    assert outcomes == ["stopped"] * len(names)  # the reads in flight stop at their chunk, the others never start
    assert proxy.count("GET", "/in/img/") <= 2, proxy.requests
    assert list(folder.iterdir()) == []


# --------------------------------------------------------------------------- in a job


def night_two(s3, proxy, tmp_path, records: list[dict], run):  # noqa: F811
    """A first night over `records` (their images in the bucket), then every state edited: the
    second night rescores them with every object keyed from the store's cache (no read while
    keying). `run(settings)` runs a night."""
    body = "".join(json.dumps(item) + "\n" for item in records)
    s3.put_object(Bucket=BUCKET, Key="in/records.jsonl", Body=body)
    common = {"hidden_states": "drop", "max_length": 8192, "checkpoint": tmp_path / "store"}
    inputs = [f"s3://{BUCKET}/in/records.jsonl"]
    first = run(settings_for(tmp_path, inputs, "n1.parquet", **common))
    assert first.failed == 0 and first.forwarded == len(records), first
    edited = "".join(json.dumps({**item, "state": "x (edited)"}) + "\n" for item in records)
    s3.put_object(Bucket=BUCKET, Key="in/records.jsonl", Body=edited)
    proxy.clear()
    return settings_for(tmp_path, inputs, "n2.parquet", **common)


def one_image_each(names: list[str]) -> list[dict]:
    return [{"id": str(n), "state": "x", "questions": QUESTIONS, "images": [name]} for n, name in enumerate(names)]


def local_run(settings):
    from clef_cli.engines.local.pipeline import ScoreJob

    return ScoreJob(settings).run()


def test_a_night_over_cached_objects_reads_each_once_and_several_at_a_time(s3, proxy, tmp_path, monkeypatch):  # noqa: F811
    from clef_cli.engines.local.pipeline import ScoreJob
    from clef_cli.store import media_stats

    monkeypatch.setattr(media_stats, "RACY_NS", 0)  # the store dates objects to the second
    names = put_images(s3, 4)
    settings = night_two(s3, proxy, tmp_path, one_image_each(names), local_run)
    seen = concurrent_gets(proxy)
    try:
        summary = ScoreJob(settings).run()
    finally:
        proxy.hold = None
    assert summary.failed == 0 and summary.forwarded == 4, summary
    for name in names:
        assert proxy.count("GET", f"/in/{name}") == 1, (name, proxy.requests)
    assert seen[1] >= 2, seen  # read ahead of the encoder, not one record after the other
    assert all(row["error"] is None for row in pq.read_table(settings.output).to_pylist())


def test_a_stop_request_while_a_window_is_read_stops_the_job_without_reading_it_all(s3, proxy, tmp_path, monkeypatch):  # noqa: F811
    from clef_cli.engines.local.pipeline import ScoreJob
    from clef_cli.store import media_stats

    monkeypatch.setattr(media_stats, "RACY_NS", 0)
    names = put_images(s3, 24)
    settings = night_two(s3, proxy, tmp_path, one_image_each(names), local_run)
    stop = threading.Event()

    def first_get_stops(method: str, path: str) -> bool:
        if method == "GET" and "/in/img/" in path:
            stop.set()  # a Ctrl-C as the window's first object is read
        return False

    proxy.hold = first_get_stops
    try:
        summary = ScoreJob(settings, stop=stop).run()
    finally:
        proxy.hold = None
    assert summary.interrupted and summary.forwarded == 0, summary
    assert proxy.count("GET", "/in/img/") < len(names) // 2, proxy.requests  # the reads not started are dropped


@pytest.mark.slow  # a Ray cluster and two scoring runs (about 40 s on the 2-core machine)
@pytest.mark.ray
def test_ray_actors_read_a_blocks_objects_ahead_once_each(store_env, cluster, s3, proxy, tmp_path, monkeypatch):  # noqa: F811
    from clef_cli.engines.ray.job import RayScoreJob, RaySettings
    from clef_cli.store import media_stats

    monkeypatch.setattr(media_stats, "RACY_NS", 0)
    names = put_images(s3, 4)
    pairs = [{"id": str(n), "state": "x", "questions": QUESTIONS, "images": names[2 * n : 2 * n + 2]} for n in (0, 1)]
    cluster_settings = RaySettings(num_workers=1, cpus_per_worker=0.5, block_records=2)

    def run(settings):
        return RayScoreJob(settings, cluster_settings).run()

    settings = night_two(s3, proxy, tmp_path, pairs, run)
    seen = concurrent_gets(proxy)
    try:
        summary = run(settings)
    finally:
        proxy.hold = None
    assert summary.failed == 0 and summary.forwarded == 2, summary
    for name in names:
        assert proxy.count("GET", f"/in/{name}") == 1, (name, proxy.requests)  # the job's copy, which the actor sees
    assert seen[1] >= 2, seen  # a block's objects read ahead, not one after the other


def test_an_actor_on_a_node_without_the_jobs_copy_reads_ahead_into_its_own(tmp_path):
    from clef_cli.engines.ray.actor import node_spool

    seen = MediaLimits(remote_spool=tmp_path)
    assert node_spool(seen) == (seen, None)  # this node sees the job's copy: the actor reads into it
    limits, own = node_spool(MediaLimits(remote_spool=tmp_path / "on-the-driver"))
    try:
        assert own is not None and limits.remote_spool == own.folder and list(own.folder.iterdir()) == []
        assert ObjectPrefetch(limits).spool is not None  # so its reads go ahead there too
    finally:
        if own is not None:
            own.remove()
