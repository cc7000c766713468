"""Which of the operator's pods are on a node, answered from its own pod cache (the pods its kopf
watch saw) instead of a cluster-wide list of pods by ``spec.nodeName``.

Covers: ``ClusterView.pods_on_node`` files pods with the run label under their node, in every
watched namespace, and nothing unscheduled, elsewhere or unlabelled; a pod scheduled later moves
in and an older resourceVersion moves nothing; a pod gone leaves; ``Notices.node_changed`` takes
those pods as they are and makes no API call but the annotation.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.builders import NAMESPACE, make_node, make_pod
from tests.unit.fakes import NoApi
from trainingrun.contract import ANNOTATION_NOTICE, LABEL_ATTEMPT, LABEL_RUN
from trainingrun.operator.cache import ClusterView
from trainingrun.operator.notices import Notices

NOTICE = "karpenter.sh/disrupted"


class Annotations:
    """The one call ``Notices`` makes: records each annotation; anything else is an error."""

    def __init__(self) -> None:
        self.patched: list[tuple[str, str, dict[str, str]]] = []

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.patched.append((namespace, name, annotations))


def pod(
    name: str, node: str | None, *, run: str | None = "r", rv: int = 1, namespace: str = NAMESPACE
) -> dict[str, Any]:
    builder = make_pod(name).running()
    built = builder.build()
    built["metadata"] |= {"namespace": namespace, "resourceVersion": str(rv)}
    built["metadata"]["labels"] = {LABEL_RUN: run, LABEL_ATTEMPT: "1"} if run else {}
    if node is None:
        built["spec"].pop("nodeName", None)
    else:
        built["spec"]["nodeName"] = node
    return built


def cached(*pods: dict[str, Any]) -> ClusterView:
    view = ClusterView(NoApi())
    for p in pods:
        view.pods.put((p["metadata"]["namespace"], p["metadata"]["name"]), p)
    return view


def on(view: ClusterView, node: str) -> list[tuple[str, str]]:
    return sorted(
        (p["metadata"]["namespace"], p["metadata"]["name"]) for p in view.pods_on_node(node)
    )


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param(
            [pod("r-1", "n1"), pod("s-1", "n1", run="s", namespace="other")],
            [("ml", "r-1"), ("other", "s-1")],
            id="run-pods-of-every-namespace",
        ),
        pytest.param([pod("r-1", "n2")], [], id="pod-on-another-node"),
        pytest.param([pod("r-1", None)], [], id="pod-not-scheduled-yet"),
        pytest.param([pod("x", "n1", run=None)], [], id="pod-without-the-run-label"),
    ],
)
def test_pods_on_a_node_come_from_the_cache(
    pods: list[dict[str, Any]], expected: list[tuple[str, str]]
) -> None:
    assert on(cached(*pods), "n1") == expected


def test_a_pod_scheduled_later_moves_in_and_an_older_version_does_not_move_it_out() -> None:
    view = cached(pod("r-1", None, rv=1))
    view.pods.put((NAMESPACE, "r-1"), pod("r-1", "n1", rv=2))
    view.pods.put((NAMESPACE, "r-1"), pod("r-1", None, rv=1))  # a late event of the old version

    assert on(view, "n1") == [(NAMESPACE, "r-1")]


def test_a_pod_gone_leaves_its_node() -> None:
    view = cached(pod("r-1", "n1"), pod("r-2", "n1"))
    view.pods.gone((NAMESPACE, "r-1"), None)
    view.pod_gone(NAMESPACE, "r-2")

    assert on(view, "n1") == []


def test_the_run_index_still_files_pods_by_run() -> None:
    view = cached(pod("r-1", "n1"), pod("s-1", "n1", run="s"))

    assert [p["metadata"]["name"] for p in view.run_pods(NAMESPACE, "s")] == ["s-1"]


def test_a_notice_annotates_the_cached_pods_on_the_node_and_lists_nothing() -> None:
    view = cached(
        pod("r-1", "n1"),
        pod("s-1", "n1", run="s", namespace="other"),
        pod("t-1", "n2", run="t"),
    )
    api = Annotations()
    notices = Notices(api, [NOTICE])
    node = make_node("n1").tainted(NOTICE).build()

    runs = notices.node_changed(node, view.pods_on_node("n1"))

    assert sorted(runs) == [("ml", "r"), ("other", "s")]
    assert sorted(api.patched) == [
        ("ml", "r-1", {ANNOTATION_NOTICE: NOTICE}),
        ("other", "s-1", {ANNOTATION_NOTICE: NOTICE}),
    ]
