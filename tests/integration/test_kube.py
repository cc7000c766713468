"""The Kubernetes wrapper (trainingrun.operator.kube) against the real API server: raw answers are
read to
the end before their connection goes back to the pool, so the call after a DELETE on the same
connection gets its own answer (an unread DELETE reply was once read as the next create's)."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from tests.localenv import LocalEnv
from trainingrun.operator.kube import Kube, load_config


def _pod(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": "nowhere",  # never runs: a bare API object
            "containers": [{"name": "c", "image": "example.invalid/c:1"}],
        },
    }


def test_calls_after_a_delete_on_one_connection_get_their_own_answers(
    localenv: LocalEnv, namespace: str
) -> None:
    kube = Kube(load_config(localenv.kubeconfig, pool_size=1))  # every call on one connection
    names = [f"p-{uuid.uuid4().hex[:6]}" for _ in range(3)]
    first, _ = kube.create_pod(_pod(namespace, names[0]))

    for previous, name in itertools.pairwise(names):
        assert kube.delete_pod_by_uid(namespace, previous, None, grace_seconds=0)
        created, fresh = kube.create_pod(_pod(namespace, name))
        assert (created["metadata"]["name"], fresh) == (name, True)

    assert kube.get_pod(namespace, names[0]) is None
    assert first["metadata"]["uid"] != created["metadata"]["uid"]
