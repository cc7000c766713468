"""End-to-end fixtures: two local pod runner nodes on which the attempts' pods run as real
processes. The operator and the CRD are the session fixtures of tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.localenv import LocalEnv
from tests.podrunner import RunnerHandle, start_runner


@pytest.fixture
def runner_nodes(localenv: LocalEnv) -> Iterator[list[RunnerHandle]]:
    """Two pod runner nodes (label ``type=local``), stopped and removed afterwards."""
    handles = [start_runner(localenv), start_runner(localenv)]
    yield handles
    for handle in handles:
        handle.stop()
