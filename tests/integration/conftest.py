"""Fixtures for operator integration tests: the CRD installed, the operator running as a real
process, and per-test namespaces with a credentials Secret for the real bucket."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.integration.support import OperatorProcess, Runs, credentials_secret, wait_for
from tests.localenv import LocalEnv

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def crd(localenv: LocalEnv, api_client: Any) -> str:
    localenv.kubectl("apply", "-f", str(REPO / "crds" / "trainingrun.yaml"))
    localenv.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "crd/trainingruns.trainingrun.dev"
    )
    custom = client.CustomObjectsApi(api_client)

    def served() -> bool:
        try:
            custom.list_cluster_custom_object("trainingrun.dev", "v1alpha1", "trainingruns")
        except client.ApiException:
            return False
        return True

    wait_for(served, 30, "trainingruns to be served")
    return "trainingruns.trainingrun.dev"


@pytest.fixture(scope="session")
def operator(
    localenv: LocalEnv, crd: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(localenv, tmp_path_factory.mktemp("operator") / "operator.log")
    proc.start()
    yield proc
    proc.stop()
    log = proc.log_path.read_text(errors="replace")
    print(f"--- operator log (last 3000 chars) ---\n{log[-3000:]}")


@pytest.fixture
def runs(api_client: Any, namespace: str, localenv: LocalEnv, core_v1: Any) -> Runs:
    core_v1.create_namespaced_secret(namespace, credentials_secret(localenv))
    return Runs(api_client, namespace)


@pytest.fixture
def prefix() -> str:
    """A bucket prefix no other test uses."""
    return f"it-{uuid.uuid4().hex[:10]}"
