"""Fixtures for operator integration tests live in tests/conftest.py (the CRD, the one session
operator, per-test namespaces with a credentials Secret), shared with the e2e tier. Here: those
of the agent tests (sync and restore as processes against SeaweedFS)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.agents import S3, SyncProcess
from tests.localenv import LocalEnv


@pytest.fixture
def agent_s3(localenv: LocalEnv) -> S3:
    """The bucket as the agents see it (endpoint, credentials); ``s3`` is the boto3 client."""
    return S3.of(localenv)


@pytest.fixture
def run_key() -> str:
    """A fresh run prefix in the bucket."""
    return f"agents/{uuid.uuid4().hex[:10]}"


@pytest.fixture
def syncs(tmp_path: Path) -> Iterator[list[SyncProcess]]:
    """The sync processes a test starts; killed if still running at its end."""
    started: list[SyncProcess] = []
    yield started
    for proc in started:
        proc.close()
