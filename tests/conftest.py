"""Shared fixtures: the tiny random Clef-Omni release and the reference's golden outputs."""

from __future__ import annotations

import json

import pytest

from . import background
from .helpers import GOLDEN, GOLDEN_MAX_LENGTH, GOLDEN_RECORDS, TINY_MODEL


@pytest.hookimpl(trylast=True)  # after `-m` and `-k` have deselected
def pytest_collection_modifyitems(config, items):
    background.run_last(items)


def pytest_collection_finish(session):
    """Start the background jobs the selected tests wait for (tests/background.py)."""
    if not session.config.option.collectonly:
        background.start_for(session.items)


def pytest_sessionfinish(session):
    background.stop_all()


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
