"""Fixtures of the chart tests: the helm binary (built from its Go module, cached)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import localenv


@pytest.fixture(scope="session")
def helm() -> Path:
    path = localenv.build_tools() / "helm"
    assert path.exists(), f"{path} is missing: hack/build-tools.sh should have built it"
    return path
