"""The node handler's work (``Notices.node_changed``) when the API server refuses the notice
annotation in some namespaces (namespaced mode: the operator's Role is missing there, or an
admission policy refuses the patch).

Covers: a 403 from one namespace skips that namespace's other pods and does not stop the other
namespaces; every run on the node still gets its pass; the refusal is logged once per namespace,
not once per pod or per node event, and again after that namespace accepted an annotation;
errors other than 403 are not swallowed.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.unit.builders import make_node, make_pod
from trainingrun.contract import ANNOTATION_NOTICE, LABEL_ATTEMPT, LABEL_RUN
from trainingrun.operator.kube import ApiError, Forbidden
from trainingrun.operator.notices import Notices

NOTICE = "karpenter.sh/disrupted"


class RefusingAnnotator:
    """Answers 403 (``Forbidden``, as ``Kube.annotate_pod`` does) for the namespaces in
    ``refused``; records the annotations of the others."""

    def __init__(self, *refused: str) -> None:
        self.refused = set(refused)
        self.asked: list[tuple[str, str]] = []
        self.patched: list[tuple[str, str]] = []

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.asked.append((namespace, name))
        if namespace in self.refused:
            raise Forbidden(f'pods "{name}" is forbidden: no Role in namespace "{namespace}"')
        self.patched.append((namespace, name))


def pod(namespace: str, name: str, run: str) -> dict[str, Any]:
    built = make_pod(name).on_node("n1").running().build()
    built["metadata"]["namespace"] = namespace
    built["metadata"]["labels"] = {LABEL_RUN: run, LABEL_ATTEMPT: "1"}
    return built


PODS = [
    pod("team-a", "a-1", "a"),
    pod("team-a", "b-1", "b"),
    pod("team-b", "c-1", "c"),
    pod("team-c", "d-1", "d"),
]
NODE = make_node("n1").tainted(NOTICE).build()


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_403_in_one_namespace_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = RefusingAnnotator("team-a")
    notices = Notices(api, [NOTICE])

    with caplog.at_level(logging.INFO, logger="trainingrun.operator"):
        runs = notices.node_changed(NODE, PODS)

    assert api.patched == [("team-b", "c-1"), ("team-c", "d-1")]
    assert api.asked.count(("team-a", "b-1")) == 0  # one refusal is the namespace's answer
    # Every run on the node needs its pass, annotated or not.
    assert sorted(runs) == [("team-a", "a"), ("team-a", "b"), ("team-b", "c"), ("team-c", "d")]
    (warning,) = refusals(caplog)
    assert "team-a" in warning and "n1" in warning and "forbidden" in warning


def test_a_refusal_is_logged_once_until_the_namespace_accepts_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = RefusingAnnotator("team-a")
    notices = Notices(api, [NOTICE])

    with caplog.at_level(logging.INFO, logger="trainingrun.operator"):
        notices.node_changed(NODE, PODS)
        notices.node_changed(NODE, PODS)  # the next event of the same node
        assert len(refusals(caplog)) == 1
        api.refused.clear()  # the Role is back
        notices.node_changed(NODE, PODS[:1])
        api.refused.add("team-a")  # and gone again
        notices.node_changed(NODE, PODS[1:2])

    assert len(refusals(caplog)) == 2


def test_other_errors_are_not_swallowed() -> None:
    class Failing:
        def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
            raise ApiError("500 etcdserver: request timed out")

    with pytest.raises(ApiError):
        Notices(Failing(), [NOTICE]).node_changed(NODE, PODS)


def test_a_pod_annotated_already_is_not_patched_again() -> None:
    api = RefusingAnnotator()
    noticed = pod("team-b", "c-1", "c")
    noticed["metadata"]["annotations"][ANNOTATION_NOTICE] = NOTICE

    runs = Notices(api, [NOTICE]).node_changed(NODE, [noticed])

    assert (api.asked, runs) == ([], [("team-b", "c")])
