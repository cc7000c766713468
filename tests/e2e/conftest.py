"""End-to-end fixtures: the operator fixtures of the integration tier, and two local pod runner
nodes on which the attempts' pods run as real processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.conftest import crd, operator, prefix, runs  # noqa: F401 - fixtures
from tests.localenv import LocalEnv
from tests.podrunner import RunnerHandle, start_runner


@pytest.fixture
def runner_nodes(localenv: LocalEnv) -> Iterator[list[RunnerHandle]]:
    """Two pod runner nodes (label ``type=local``), stopped and removed afterwards."""
    handles = [start_runner(localenv), start_runner(localenv)]
    yield handles
    for handle in handles:
        handle.stop()
