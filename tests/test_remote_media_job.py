"""Remote media in a whole `clef score` job (issue 31): a refused URL is that record's error and the
others score; each URL is fetched once per job (keying and decoding share the bytes), so the key
hashes exactly the bytes decoded."""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from clef_cli.cli import app
from clef_cli.encoding.media import MediaError, MediaLimits, remote_bytes
from clef_cli.encoding.remote_spool import RemoteSpool
from clef_cli.inputs.readers import read_records
from clef_cli.store.record_key import MediaHasher

from .support.helpers import MEDIA, TINY_MODEL, write_jsonl
from .support.media_server import body, media_server

runner = CliRunner()
NOUL = {"q": {"type": "noul", "instructions": "Is it a parcel?"}}
COUNTS = re.compile(r"(\d+) run through the model, (\d+) from the checkpoint, (\d+) duplicates? collapsed")


def score(inputs, output, *extra):
    args = ["score", str(inputs), "-o", str(output), "-m", str(TINY_MODEL), "--workers", "0", "--quiet", *extra]
    result = runner.invoke(app, args)
    match = COUNTS.search(result.stderr)
    assert match, result.output
    return result.exit_code, tuple(int(group) for group in match.groups())


def rows(path) -> dict[str, dict]:
    return {row["id"]: row for row in pq.read_table(path).to_pylist()}


def test_a_loopback_url_is_refused_by_default_and_the_other_records_score(tmp_path):
    with media_server(routes={"/a.png": body((MEDIA / "image_a.png").read_bytes())}) as server:
        records = [
            {"id": "text", "state": "a text-only record", "questions": NOUL},
            {"id": "local", "state": "a local image", "questions": NOUL, "images": [str(MEDIA / "image_a.png")]},
            {"id": "remote", "state": "a remote image", "questions": NOUL, "images": [server.url("/a.png")]},
        ]
        inputs = write_jsonl(tmp_path / "in.jsonl", records)
        code, counts = score(inputs, tmp_path / "out.parquet", "--allow-remote-media")
        assert server.requests == []  # the private address was never asked
    assert code == 3 and counts == (2, 0, 0)  # the refused record never reaches the model
    out = rows(tmp_path / "out.parquet")
    assert out["text"]["error"] is None and out["local"]["error"] is None
    refused = out["remote"]
    assert refused["error_kind"] == "media"  # final: a refusal is never retried
    assert refused["error"] == (
        f"record 'remote', field 'images[0]': {server.url('/a.png')}: host 127.0.0.1 resolves to a loopback "
        "address 127.0.0.1; pass --allow-private-media-hosts to fetch from a local server"
    )


def test_each_url_is_fetched_once_per_job_and_keyed_by_its_bytes(tmp_path):
    image_a, image_b = (MEDIA / "image_a.png").read_bytes(), (MEDIA / "image_b.png").read_bytes()
    routes = {"/a.png": body(image_a), "/b.png": body(image_b), "/c.png": body(image_b)}
    with media_server(routes=routes) as server:
        records = [
            {"id": "a", "state": "first", "questions": NOUL, "images": [server.url("/a.png")]},
            {"id": "b", "state": "second", "questions": NOUL, "images": [server.url("/b.png")]},
            {"id": "c", "state": "third", "questions": NOUL, "images": [server.url("/c.png")]},
            {"id": "a-again", "state": "fourth", "questions": NOUL, "images": [server.url("/a.png")]},
            {"id": "a-local", "state": "first", "questions": NOUL, "images": [str(MEDIA / "image_a.png")]},
            {"id": "by-name", "state": "fifth", "questions": NOUL, "images": [server.url("/a.png", "localhost")]},
        ]
        inputs = write_jsonl(tmp_path / "in.jsonl", records)
        store = str(tmp_path / "store.ckpt")
        options = ("--allow-remote-media", "--allow-private-media-hosts", "--allowed-media-domains", "127.0.0.1")
        code, counts = score(inputs, tmp_path / "one.parquet", *options, "--checkpoint", store)
        # 3 URLs, 3 requests: planned from the header and decoded later, each from the job's copy
        assert sorted(server.requests) == ["/a.png", "/b.png", "/c.png"]
        assert code == 3 and counts == (4, 0, 1)  # a-local is a's prompt: the same bytes, the same key
        one = rows(tmp_path / "one.parquet")
        assert one["a"]["record_key"] == one["a-local"]["record_key"] and one["a"]["error"] is None
        refused = one["by-name"]
        assert refused["error_kind"] == "media" and "localhost is not in --allowed-media-domains" in refused["error"]

        server.routes["/c.png"] = body(image_a)  # replaced under the same URL
        server.requests.clear()
        code, counts = score(inputs, tmp_path / "two.parquet", *options, "--checkpoint", store)
        assert sorted(server.requests) == ["/a.png", "/b.png", "/c.png"]  # once per job, again
    assert code == 3 and counts == (1, 4, 1)  # only c runs: its bytes changed; the refusal is reused
    two = rows(tmp_path / "two.parquet")
    assert two["c"]["record_key"] != one["c"]["record_key"]
    assert two["c"]["answers"] != one["c"]["answers"] or two["c"]["prompt_tokens"] != one["c"]["prompt_tokens"]
    assert not (tmp_path / "store.ckpt" / "remote-media").exists()  # the job's copies go with it


def test_keying_fetches_each_url_once_and_the_workers_read_that_copy(tmp_path):
    image = (MEDIA / "image_a.png").read_bytes()
    routes = {f"/{number}.png": body(image) for number in range(6)}
    with media_server(routes=routes) as server:
        spool = RemoteSpool.fresh(tmp_path / "spool")
        limits = MediaLimits(allow_remote=True, allow_private_media_hosts=True, remote_spool=spool.folder)
        urls = [server.url(f"/{number}.png") for number in range(6)] + [server.url("/missing")]
        records = [
            {"id": str(number), "state": "s", "questions": NOUL, "images": [url, urls[0]]}
            for number, url in enumerate(urls)
        ]
        hasher = MediaHasher(limits)
        hasher.prefetch(read_records([write_jsonl(tmp_path / "in.jsonl", records)]))  # several at a time
        assert sorted(server.requests) == [*(f"/{number}.png" for number in range(6)), "/missing"]
        keys = [hasher.entry(url, None) for url in urls]
        assert keys[:6] == ["sha256:" + hashlib.sha256(image).hexdigest()] * 6  # the bytes, not the URL
        assert keys[6] == f"unfetched:{urls[6]}"  # a 404 may pass: the record is tried next run
        assert all(remote_bytes(url, limits) == image for url in urls[:6])
        with pytest.raises(MediaError, match="HTTP 404") as failed:
            remote_bytes(urls[6], limits)
        assert failed.value.transient
        assert len(server.requests) == 7  # keyed and decoded: one request per URL
        assert remote_bytes(urls[0], replace(limits, remote_spool=None)) == image  # no job copy: fetched
        assert len(server.requests) == 8


@pytest.mark.parametrize("option", [["--allowed-media-domains", "cdn.example"], ["--allow-private-media-hosts"]])
def test_a_remote_option_without_remote_media_exits_2(tmp_path, option):
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "state": "s", "questions": NOUL}])
    result = runner.invoke(app, ["score", str(inputs), "-o", str(tmp_path / "o.parquet"), *option, "--dry-run"])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {option[0]} applies to remote media only: add --allow-remote-media"


def test_a_fresh_spool_drops_what_a_killed_job_left_and_fetches_again(tmp_path):
    """A job killed mid-way leaves its spool (bytes, a stored failure). The next job's fresh spool
    must hold none of it: a URL whose server is now down fails now (it is not served yesterday's
    bytes without a request), and a URL that failed yesterday is asked again."""
    from clef_cli.locations.remote_fetch import FetchError, FetchPolicy

    policy = FetchPolicy(max_bytes=1 << 20, allow_private=True)
    yesterday, today = (MEDIA / "image_a.png").read_bytes(), (MEDIA / "image_b.png").read_bytes()
    folder = tmp_path / "remote-media"
    with media_server(routes={"/b.png": body(today)}) as live:
        failed_url = live.url("/late.png")
        with media_server(routes={"/a.png": body(yesterday)}) as gone:
            down_url = gone.url("/a.png")
            killed = RemoteSpool.fresh(folder)
            assert killed.digest(down_url, policy) == hashlib.sha256(yesterday).hexdigest()
            with pytest.raises(FetchError, match="HTTP 404"):
                killed.digest(failed_url, policy)  # stored as this URL's failure
        assert len(list(folder.iterdir())) == 2  # killed: never removed
        live.routes["/late.png"] = body(today)
        live.requests.clear()

        spool = RemoteSpool.fresh(folder)
        assert list(folder.iterdir()) == []
        assert spool.stored(down_url) is None and spool.stored(failed_url) is None
        with pytest.raises(FetchError, match="cannot fetch") as down:
            spool.digest(down_url, policy)  # asked again: its server is gone
        assert down.value.transient
        assert spool.digest(failed_url, policy) == hashlib.sha256(today).hexdigest()
        assert live.requests == ["/late.png"]
