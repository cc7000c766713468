"""Fixtures for operator integration tests live in tests/conftest.py (the CRD, the one session
operator, per-test namespaces with a credentials Secret), shared with the e2e tier. Here: those
of the agent tests (sync and restore as processes against SeaweedFS)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.agents import S3, SyncProcess


@pytest.fixture
def agent_s3(seaweedfs: S3) -> S3:
    """The bucket as the agents see it (endpoint, credentials), on the session's own SeaweedFS
    (the agent tests run beside the cluster tests)."""
    return seaweedfs


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
