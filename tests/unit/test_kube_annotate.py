"""What ``Kube.annotate_pod`` makes of the API server's answers, and that ``Kube`` no longer
lists pods across namespaces (the node lookup reads the pod cache).

Covers, against a loopback API server on 127.0.0.1: the annotation is a JSON merge patch of the
annotations only; 404 is nothing to do, 403 is ``Forbidden`` (the caller goes on with other
namespaces), any other refusal is raised as it is (``HttpError`` with the server's message); no
method of ``Kube`` lists pods across namespaces.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

import pytest

from tests.unit.fakes import answer_json, loopback_api_client
from trainingrun.operator import kube
from trainingrun.operator.kube import Forbidden, Kube
from trainingrun.operator.kubeconn import HttpError

ANNOTATION = {"trainingrun.dev/preemption-notice": "x"}


class _PatchAnswers(BaseHTTPRequestHandler):
    """Answers every PATCH with ``status`` and records (path, content type, body)."""

    status: ClassVar[int] = 200
    seen: ClassVar[list[tuple[str, str, Any]]] = []

    def do_PATCH(self) -> None:  # the http.server hook's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, self.headers["Content-Type"], body))
        code = type(self).status
        answer = {"kind": "Status", "code": code, "message": f"refused with {code}"}
        answer_json(self, code, body if code == 200 else answer)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args  # the server's own access log is not under test


def kube_answering(status: int) -> Iterator[Kube]:
    answers = type("Answers", (_PatchAnswers,), {"status": status, "seen": []})
    with loopback_api_client(answers) as rest:
        k = Kube(rest)
        k.seen = answers.seen  # type: ignore[attr-defined]  # for the assertions
        yield k


@pytest.fixture(params=[200])
def answering(request: pytest.FixtureRequest) -> Iterator[Kube]:
    yield from kube_answering(request.param)


def test_annotation_is_a_merge_patch_of_the_annotations_only(answering: Kube) -> None:
    answering.annotate_pod("ml", "r-1", ANNOTATION)
    assert answering.seen == [  # type: ignore[attr-defined]
        (
            "/api/v1/namespaces/ml/pods/r-1",
            "application/merge-patch+json",
            {"metadata": {"annotations": ANNOTATION}},
        )
    ]


@pytest.mark.parametrize("answering", [404], indirect=True)
def test_annotation_of_a_pod_gone_is_nothing_to_do(answering: Kube) -> None:
    answering.annotate_pod("ml", "r-1", ANNOTATION)


@pytest.mark.parametrize("answering", [403], indirect=True)
def test_annotation_refused_with_403_is_forbidden(answering: Kube) -> None:
    with pytest.raises(Forbidden, match="refused with 403"):
        answering.annotate_pod("ml", "r-1", ANNOTATION)


@pytest.mark.parametrize("answering", [500], indirect=True)
def test_annotation_refused_otherwise_is_raised_as_it_is(answering: Kube) -> None:
    with pytest.raises(HttpError, match="refused with 500") as refused:
        answering.annotate_pod("ml", "r-1", ANNOTATION)
    assert refused.value.status == 500


def test_kube_never_lists_pods_across_namespaces() -> None:
    source = inspect.getsource(kube)
    assert '"/api/v1/pods' not in source
    assert "PODS = " in source and "/namespaces/{namespace}/pods" in source
