"""Shared fixtures: the local environment (real control plane + SeaweedFS), API clients, and
per-test namespaces and kwok nodes.

Tests under tests/integration/ and tests/e2e/ are marked automatically and use the session
environment: one that is already up (``make cluster``) is reused and left running; one the session
starts itself is stopped at the end.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests import localenv as localenv_mod

TIERS = ("integration", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def localenv() -> Iterator[localenv_mod.LocalEnv]:
    env = localenv_mod.load()
    started_here = env is None
    if env is None:
        env = localenv_mod.up()
    yield env
    if started_here and not os.environ.get("TRAININGRUN_KEEP_ENV"):
        localenv_mod.down()


@pytest.fixture(scope="session")
def api_client(localenv: localenv_mod.LocalEnv) -> Any:
    return config.new_client_from_config(config_file=localenv.kubeconfig)


@pytest.fixture(scope="session")
def core_v1(api_client: Any) -> Any:
    return client.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def s3(localenv: localenv_mod.LocalEnv) -> Any:
    return localenv_mod.s3_client(localenv)


@pytest.fixture
def namespace(core_v1: Any) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core_v1.delete_namespace(name)


@pytest.fixture
def kwok_node(core_v1: Any) -> Iterator[Callable[..., str]]:
    """Factory for nodes that the kwok controller keeps Ready; all are deleted afterwards."""
    created: list[str] = []

    def make(labels: dict[str, str] | None = None) -> str:
        name = f"kwok-{uuid.uuid4().hex[:8]}"
        node = client.V1Node(
            metadata=client.V1ObjectMeta(
                name=name,
                annotations={localenv_mod.KWOK_NODE_ANNOTATION: "fake"},
                labels={"type": "kwok", "kubernetes.io/hostname": name, **(labels or {})},
            )
        )
        core_v1.create_node(node)
        created.append(name)
        return name

    yield make
    for name in created:
        try:
            core_v1.delete_node(name)
        except ApiException as e:
            if e.status != 404:
                raise
