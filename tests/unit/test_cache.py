"""The pod cache's index by run (``ClusterView.run_pods``), which the sweep of old pods reads.
Covers: pods filed under (namespace, run label) and nothing else; a label that changes moves the
pod; an older resourceVersion moves nothing; a pod gone (by the watch, or by a DELETE's 404
through ``pod_gone``) leaves the index and keeps its last state; the slim pod keeps what the
sweep reads (finalizers, the grace period).
"""

from __future__ import annotations

from typing import Any

from tests.unit.builders import NAMESPACE, make_pod
from tests.unit.fakes import NoApi
from trainingrun.contract import LABEL_ATTEMPT, LABEL_RUN
from trainingrun.operator.cache import ClusterView, slim_pod


def pod(name: str, run: str | None, rv: int = 1, namespace: str = NAMESPACE) -> dict[str, Any]:
    built = make_pod(name).running().build()
    built["metadata"] |= {"namespace": namespace, "resourceVersion": str(rv)}
    if run is not None:
        built["metadata"]["labels"] = {LABEL_RUN: run, LABEL_ATTEMPT: "1"}
    return built


def names(view: ClusterView, run: str, namespace: str = NAMESPACE) -> list[str]:
    return sorted(p["metadata"]["name"] for p in view.run_pods(namespace, run))


def test_pods_are_filed_under_their_namespace_and_run_label() -> None:
    view = ClusterView(NoApi())
    for p in (pod("a-1", "a"), pod("a-2", "a"), pod("b-1", "b"), pod("x", None)):
        view.pods.put((NAMESPACE, p["metadata"]["name"]), p)
    view.pods.put(("other", "a-1"), pod("a-1", "a", namespace="other"))

    assert (names(view, "a"), names(view, "b"), names(view, "x")) == (["a-1", "a-2"], ["b-1"], [])
    assert names(view, "a", "other") == ["a-1"]


def test_a_changed_label_moves_the_pod_and_an_older_version_does_not() -> None:
    view = ClusterView(NoApi())
    view.pods.put((NAMESPACE, "p"), pod("p", "a", rv=1))
    view.pods.put((NAMESPACE, "p"), pod("p", "b", rv=2))
    view.pods.put((NAMESPACE, "p"), pod("p", "a", rv=1))  # a late event of the old version

    assert (names(view, "a"), names(view, "b")) == ([], ["p"])


def test_a_pod_gone_leaves_the_index_and_keeps_its_last_state() -> None:
    view = ClusterView(NoApi())
    view.pods.put((NAMESPACE, "a-1"), pod("a-1", "a"))
    view.pods.put((NAMESPACE, "a-2"), pod("a-2", "a"))

    view.pods.gone((NAMESPACE, "a-1"), None)
    view.pod_gone(NAMESPACE, "a-2")

    assert names(view, "a") == []
    last = view.pods.last((NAMESPACE, "a-2"))
    assert last is not None and last["metadata"]["name"] == "a-2"


def test_the_slim_pod_keeps_finalizers_and_the_grace_period() -> None:
    raw = pod("a-1", "a")
    raw["metadata"]["finalizers"] = ["example.com/keep"]
    raw["spec"]["terminationGracePeriodSeconds"] = 120

    slim = slim_pod(raw)

    assert slim["metadata"]["finalizers"] == ["example.com/keep"]
    assert slim["spec"] == {"nodeName": "n1", "terminationGracePeriodSeconds": 120}
