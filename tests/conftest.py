"""Shared fixtures: the tiny random Clef-Omni release and the reference's golden outputs."""

from __future__ import annotations

import json

import pytest

from .support import background
from .support.helpers import GOLDEN, GOLDEN_MAX_LENGTH, GOLDEN_RECORDS, TINY_MODEL, require, require_ray


@pytest.hookimpl(trylast=True)  # after `-m` and `-k` have deselected
def pytest_collection_modifyitems(config, items):
    background.run_last(items)


def pytest_collection_finish(session):
    """Start the background jobs the selected tests wait for (tests/support/background.py)."""
    if not session.config.option.collectonly:
        background.start_for(session.items)


def pytest_sessionfinish(session):
    background.stop_all()


def pytest_configure(config):
    """A test server's thread that fails (a client of an earlier test hanging up on moto or the
    proxy) prints its traceback to sys.stderr as it is then: inside a `CliRunner.invoke`, that is
    the command's captured stderr, and a one-line error read as many. It goes to the process's."""
    import socketserver
    import sys
    import traceback

    def handle_error(server, request, client_address):
        print(f"test server {client_address}:", file=sys.__stderr__)
        traceback.print_exc(file=sys.__stderr__)

    socketserver.BaseServer.handle_error = handle_error


def pytest_runtest_setup(item):
    """Ray's log handler writes to sys.stderr as it is at each line (`PlainRayHandler`), and
    Ray's threads log after its shutdown: aimed at the process's stderr, a late line cannot land
    in a later test's captured command output (the likely second line of a one-line error in CI,
    2026-12-07, after the Ray tests had run in the same process)."""
    import logging
    import sys

    if "ray" not in sys.modules:
        return
    for name in ["ray", *(name for name in logging.root.manager.loggerDict if name.startswith("ray."))]:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if type(handler).__name__ == "PlainRayHandler":
                logger.removeHandler(handler)
                stream = logging.StreamHandler(sys.__stderr__)
                stream.setFormatter(logging.Formatter("ray: %(message)s"))
                stream.setLevel(handler.level)
                logger.addHandler(stream)


@pytest.fixture(scope="session")
def s3_server():
    """An S3 endpoint (moto's server) on a free local port, shared by the session's S3 tests; its
    URL. moto is a test extra (`pip install -e ".[test]"`); under CI=true its absence fails."""
    import logging
    import socket

    moto_server = require("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="module")
def proxy(s3_server):
    """A counting (and failing, delaying, holding) proxy in front of the S3 server, per module
    (tests/support/s3_proxy.py); its URL is `proxy.url`."""
    from .support.s3_proxy import S3Proxy

    found = S3Proxy(s3_server)
    found.url = found.start()
    yield found
    found.stop()


@pytest.fixture
def store_bucket(request, s3_server, proxy, monkeypatch):
    """An empty bucket named by the test module's `BUCKET`, the job's environment aimed at it
    through the counting proxy (its counts cleared); boto3's client of it. Emptied and removed
    after the test, the clients and manifests this process read forgotten either side."""
    import boto3

    from clef_cli.locations import buckets, object_store
    from clef_cli.store.remote import manifests

    from .support.s3_proxy import emptied, point_at

    point_at(monkeypatch, proxy.url)
    monkeypatch.setattr(object_store, "RETRY_DELAYS", ())
    client = boto3.client("s3", endpoint_url=s3_server)
    client.create_bucket(Bucket=request.module.BUCKET)
    proxy.clear()
    proxy.failures.clear()
    buckets.forget()
    manifests.forget()
    yield client
    emptied(client, request.module.BUCKET)
    buckets.forget()
    manifests.forget()


@pytest.fixture(scope="module")
def store_env(proxy):
    """The bucket's endpoint (the proxy) and the test credentials in this process's environment
    before the module's Ray cluster starts (requested before `cluster`): a local cluster's workers
    inherit them, as a real cluster's nodes have their own."""
    import os

    from .support.s3_proxy import TEST_ENVIRONMENT

    values = {"AWS_ENDPOINT_URL": proxy.url, **TEST_ENVIRONMENT}
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    yield values
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def cluster():
    """The address of a 2-CPU local Ray cluster for a module's `--ray` runs (this session's, when
    another module started it); Ray's absence fails under CI=true (require_ray)."""
    ray = require_ray()
    started = not ray.is_initialized()
    if started:
        from clef_cli.engines.ray.job import job_runtime_env

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=job_runtime_env())
    yield ray.get_runtime_context().gcs_address
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def release():
    from clef_cli.release import resolve_release

    return resolve_release(str(TINY_MODEL))


@pytest.fixture(scope="session")
def processor(release):
    from clef_cli.release import load_processor

    return load_processor(release)


@pytest.fixture(scope="session")
def encoder(processor):
    from clef_cli.encoding.prompt import PromptEncoder

    return PromptEncoder(processor, max_length=GOLDEN_MAX_LENGTH)


@pytest.fixture(scope="session")
def golden_records():
    from clef_cli.inputs.readers import read_records

    return list(read_records([GOLDEN_RECORDS]))


@pytest.fixture(scope="session")
def expected():
    return [json.loads(line) for line in (GOLDEN / "expected_A.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def golden_encoded(encoder, golden_records):
    return [encoder.encode(record) for record in golden_records]


@pytest.fixture(scope="session")
def scorer(release):
    import torch

    from clef_cli.model.scoring import load_scorer

    torch.manual_seed(0)
    return load_scorer(release, device="cpu", dtype="float32")


@pytest.fixture
def memory(monkeypatch):
    """The bucket `s3://clef-memory`, empty, in memory (an obstore MemoryStore served in process:
    tests/support/remote_stores.py `served_memory`); what this process read of stores forgotten either side."""
    from .support.remote_stores import served_memory

    yield from served_memory(monkeypatch)
