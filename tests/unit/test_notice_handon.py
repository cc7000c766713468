"""A preemption notice on one pod of an attempt reaches the others (``decide.notices``), as a
plan's effect: the pure choice of the notice and of the pods still to be told, and the apply
step writing the annotations after the status and Events it plans with them.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.builders import NAMESPACE, make_node, make_pod, pod_from
from tests.unit.test_reconciler import RUN, World
from trainingrun import contract as c
from trainingrun.contract import rfc3339
from trainingrun.decide import reasons as R
from trainingrun.decide.gang import Member
from trainingrun.decide.notices import Notice, hand_on

TAINTS = ("karpenter.sh/disrupted", "cloud.google.com/impending-node-termination")
NOTICE = {c.ANNOTATION_NOTICE: "karpenter.sh/disrupted"}


def _member(
    name: str,
    *,
    annotated: bool = False,
    tainted: bool = False,
    phase: str = "Running",
    absent: bool = False,
) -> Member:
    if absent:
        return Member(name, None)
    pod = make_pod(name).phase(phase).build()
    if annotated:
        pod["metadata"].setdefault("annotations", {}).update(NOTICE)
    node = make_node(f"node-{name}")
    if tainted:
        node = node.tainted("karpenter.sh/disrupted")
    return Member(name, pod, node.build())


@pytest.mark.parametrize(
    ("members", "expected"),
    [
        pytest.param([_member("p0"), _member("p1")], None, id="no-notice-anywhere"),
        pytest.param(
            [_member("p0", tainted=True), _member("p1"), _member("p2")],
            Notice("karpenter.sh/disrupted", ("p0", "p1", "p2")),
            id="tainted-node-of-rank-0-tells-all",
        ),
        pytest.param(
            [_member("p0"), _member("p1", annotated=True), _member("p2")],
            Notice("karpenter.sh/disrupted", ("p0", "p2")),
            id="annotated-rank-1-tells-the-others",
        ),
        pytest.param(
            [_member("p0", annotated=True), _member("p1", annotated=True)],
            None,
            id="everyone-told-already",
        ),
        pytest.param(
            [
                _member("p0", tainted=True),
                _member("p1", phase="Succeeded"),
                _member("p2", phase="Failed"),
                _member("p3", absent=True),
            ],
            Notice("karpenter.sh/disrupted", ("p0",)),
            id="stopped-and-absent-pods-are-skipped",
        ),
        pytest.param([_member("p0", absent=True)], None, id="no-pod-yet"),
    ],
)
def test_hand_on_picks_the_notice_and_the_pods_still_to_tell(
    members: list[Member], expected: Notice | None
) -> None:
    assert hand_on(members, TAINTS) == expected


def test_a_taint_the_run_does_not_name_is_no_notice() -> None:
    members = [_member("p0", tainted=True), _member("p1")]
    assert hand_on(members, ("cloud.google.com/impending-node-termination",)) is None


NODES = [f"n{i}" for i in range(3)]


def test_the_apply_step_annotates_after_the_status_and_events_it_plans_with() -> None:
    """A pass that warns the attempt unprotected (a status change and an Event) while a
    notice reached rank 1: the status is written first, then the Event, then the notice goes
    to ranks 0 and 2."""
    w = World(replicas=3)
    limit = w.builder.spec().checkpoint.unprotected_after_seconds
    for node in NODES:
        w.kube.nodes[node] = make_node(node).build()
    w.reconcile()  # the attempt's pods are created
    for rank, node in enumerate(NODES):
        running = pod_from(w.pod(f"{RUN}-1-{rank}")).on_node(node)
        w.report(running.running(since=rfc3339(w.clock.now())))
    w.reconcile()
    w.clock.advance(limit + 1)
    # The node handler told rank 1 (an operator-wide notice taint on its node).
    w.kube.annotate_pod(NAMESPACE, f"{RUN}-1-1", dict(NOTICE))
    w.report(pod_from(w.pod(f"{RUN}-1-1")))
    calls: list[tuple[str, str]] = []
    patch, annotate, post = w.kube.patch_run_status, w.kube.annotate_pod, w.events.post

    def patch_run_status(*args: Any, **kwargs: Any) -> Any:
        calls.append(("status", ""))
        return patch(*args, **kwargs)

    def annotate_pod(namespace: str, name: str, annotations: dict[str, str]) -> None:
        calls.append(("annotate", name))
        annotate(namespace, name, annotations)

    def post_event(run: Any, type_: str, reason: str, message: str) -> None:
        calls.append(("event", reason))
        post(run, type_, reason, message)

    w.kube.patch_run_status = patch_run_status  # type: ignore[method-assign]
    w.kube.annotate_pod = annotate_pod  # type: ignore[method-assign]
    w.events.post = post_event  # type: ignore[method-assign]

    w.reconcile()

    assert calls == [
        ("status", ""),
        ("event", R.UNPROTECTED),
        ("annotate", f"{RUN}-1-0"),
        ("annotate", f"{RUN}-1-2"),
    ]
    for rank in range(3):
        annotations = w.pod(f"{RUN}-1-{rank}")["metadata"]["annotations"]
        assert annotations[c.ANNOTATION_NOTICE] == NOTICE[c.ANNOTATION_NOTICE], rank
