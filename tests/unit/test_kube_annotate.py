"""What ``Kube.annotate_pod`` makes of the API server's answers, and that ``Kube`` no longer
lists pods across namespaces (the node lookup reads the pod cache).

Covers: 404 is nothing to do, 403 is ``Forbidden`` (the caller goes on with other namespaces),
any other refusal is raised as it is; no method of ``Kube`` calls
``list_pod_for_all_namespaces``.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from trainingrun import kube
from trainingrun.kube import Forbidden, Kube


class PatchAnswers:
    """A CoreV1Api whose pod patch answers ``status`` (200: accepted)."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.bodies: list[dict[str, Any]] = []

    def patch_namespaced_pod(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.bodies.append(body)
        if self.status != 200:
            raise ApiException(status=self.status, reason="refused")


def kube_answering(status: int) -> tuple[Kube, PatchAnswers]:
    k = Kube(client.ApiClient())
    core = PatchAnswers(status)
    k.core = core
    return k, core


def test_annotation_is_a_patch_of_the_annotations_only() -> None:
    k, core = kube_answering(200)
    k.annotate_pod("ml", "r-1", {"trainingrun.dev/preemption-notice": "x"})
    assert core.bodies == [
        {"metadata": {"annotations": {"trainingrun.dev/preemption-notice": "x"}}}
    ]


def test_annotation_of_a_pod_gone_is_nothing_to_do() -> None:
    k, _ = kube_answering(404)
    k.annotate_pod("ml", "r-1", {"trainingrun.dev/preemption-notice": "x"})


def test_annotation_refused_with_403_is_forbidden() -> None:
    k, _ = kube_answering(403)
    with pytest.raises(Forbidden):
        k.annotate_pod("ml", "r-1", {"trainingrun.dev/preemption-notice": "x"})


def test_annotation_refused_otherwise_is_raised_as_it_is() -> None:
    k, _ = kube_answering(500)
    with pytest.raises(ApiException):
        k.annotate_pod("ml", "r-1", {"trainingrun.dev/preemption-notice": "x"})


def test_kube_never_lists_pods_across_namespaces() -> None:
    assert "list_pod_for_all_namespaces" not in inspect.getsource(kube)
