"""What installing the package brings: the images install its wheel with these dependencies."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def project() -> dict[str, Any]:
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"])


def names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name for r in requirements}


def test_the_kubernetes_client_is_the_tests_not_the_products() -> None:
    """The product calls the API through trainingrun.operator.kubeconn (an import-linter contract
    keeps
    the library out); the library and its dependencies added 87 MB to an installed product."""
    assert "kubernetes" not in names(project()["dependencies"])
    assert "kubernetes" in names(project()["optional-dependencies"]["dev"])
