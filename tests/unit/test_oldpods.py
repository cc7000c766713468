"""The pure decision about pods of older attempts (``trainingrun.decide.oldpods``), no cluster.
Covers:

- rules O1-O5 for one pod: left alone when it stopped and nobody asked it to go; the first
  DELETE with grace 0 on a NotReady or gone node, else with the pod's own grace; a refused
  DELETE sent again, with grace 0 once overdue; grace 0 once a graceful DELETE is overdue or the
  node is lost; a grace-0 DELETE sent again every minute; lingering (reported at once, then every
  ``report_seconds``, with a DELETE that checks it is still there), from the operator's memory or
  from the pod's own deletionTimestamp after an operator restart;
- ``sweep`` over several pods: the DELETEs and the lingering ones collected, a requeue only
  while a pod remains to be seen go;
- ``old_pod``: the decision's view of a pod in API JSON and its node;
- the OldPodLingers message: pod, attempt, how long, the likely cause and its fix.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.unit.builders import NAMESPACE, T0, PodBuilder, make_node, make_pod
from trainingrun.contract import LABEL_ATTEMPT, LABEL_RUN, rfc3339
from trainingrun.decide.oldpods import (
    Asked,
    Delete,
    Lingering,
    NodeState,
    OldPod,
    Timing,
    decide_pod,
    draining_until,
    lingers_message,
    old_pod,
    sweep,
)

NOW = T0
TIMING = Timing(margin_seconds=30, retry_seconds=5, resend_seconds=60, report_seconds=600)


def ago(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def pod(**fields: Any) -> OldPod:
    """Pod r1-1 of attempt 1 on a Ready node n1, running, grace 30 s, unless told."""
    return OldPod(**({"name": "r1-1", "attempt": 1, "node_name": "n1"} | fields))


def deleting(seconds_ago: float, grace: int) -> dict[str, Any]:
    """The pod's own record of a DELETE accepted ``seconds_ago`` with ``grace``."""
    return {"deletion": NOW - ago(seconds_ago) + ago(grace), "deletion_grace": grace}


FIRST_DELETES = [
    pytest.param(pod(), Delete("r1-1", None), id="ready-node-own-grace"),
    pytest.param(pod(node=NodeState.NOT_READY), Delete("r1-1", 0), id="not-ready-node-grace-0"),
    pytest.param(pod(node=NodeState.GONE), Delete("r1-1", 0), id="node-gone-grace-0"),
    pytest.param(pod(node_name=""), Delete("r1-1", None), id="not-scheduled-own-grace"),
    pytest.param(pod(ended=True), None, id="O1-stopped-left-for-its-logs"),
    pytest.param(pod(ended=True, node=NodeState.GONE), None, id="O1-stopped-node-gone"),
]


@pytest.mark.parametrize(("old", "expected"), FIRST_DELETES)
def test_a_pod_nobody_asked_to_go(old: OldPod, expected: Delete | None) -> None:
    assert decide_pod(old, None, NOW, TIMING) == (expected, None)


WAITS_AND_ESCALATIONS = [
    pytest.param(pod(**deleting(10, 30)), None, None, id="O3-graceful-within-grace-waits"),
    pytest.param(pod(**deleting(59, 30)), None, None, id="O3-graceful-within-the-margin-waits"),
    pytest.param(
        pod(**deleting(60, 30)), None, Delete("r1-1", 0), id="O3-graceful-overdue-grace-0"
    ),
    pytest.param(
        pod(node=NodeState.NOT_READY, **deleting(5, 30)),
        None,
        Delete("r1-1", 0),
        id="O3-graceful-then-node-not-ready-grace-0",
    ),
    pytest.param(
        pod(ended=True, **deleting(10, 30)),
        None,
        None,
        id="O3-stopped-but-deleted-by-someone-waits",
    ),
    pytest.param(
        pod(),
        Asked(first=NOW - ago(10), accepted=NOW - ago(10)),
        None,
        id="O3-memory-only-cache-not-caught-up-waits",
    ),
    pytest.param(
        pod(),
        Asked(first=NOW - ago(61), accepted=NOW - ago(61)),
        Delete("r1-1", 0),
        id="O3-memory-only-overdue-grace-0",
    ),
    pytest.param(
        pod(grace_seconds=600),
        Asked(first=NOW - ago(120), accepted=NOW - ago(120)),
        None,
        id="O3-the-pods-own-long-grace-is-waited-for",
    ),
    pytest.param(
        pod(),
        Asked(first=NOW - ago(5), error="503 unavailable"),
        Delete("r1-1", None),
        id="O2-refused-sent-again",
    ),
    pytest.param(
        pod(node=NodeState.GONE),
        Asked(first=NOW - ago(5), error="503 unavailable"),
        Delete("r1-1", 0),
        id="O2-refused-node-gone-sent-again-grace-0",
    ),
    pytest.param(pod(**deleting(10, 0)), None, None, id="O4-forced-within-the-margin-waits"),
    pytest.param(
        pod(**deleting(61, 0)),
        Asked(first=NOW - ago(61), accepted=NOW - ago(61), grace=0, said=NOW - ago(20)),
        Delete("r1-1", 0),
        id="O4-forced-sent-again-after-a-minute",
    ),
]


@pytest.mark.parametrize(("old", "asked", "expected"), WAITS_AND_ESCALATIONS)
def test_a_pod_asked_to_go_that_does_not_linger(
    old: OldPod, asked: Asked | None, expected: Delete | None
) -> None:
    delete, linger = decide_pod(old, asked, NOW, TIMING)

    assert delete == expected
    assert linger is None or not linger.say


LINGERING = [
    pytest.param(
        pod(finalizers=("example.com/keep",), **deleting(30, 0)),
        Asked(first=NOW - ago(30), accepted=NOW - ago(30), grace=0),
        (Delete("r1-1", 0), 30.0, True),
        id="O5-forced-30s-ago-said-at-once-with-a-delete",
    ),
    pytest.param(
        pod(**deleting(40, 0)),
        Asked(first=NOW - ago(100), accepted=NOW - ago(40), grace=0, said=NOW - ago(10)),
        (None, 100.0, False),
        id="O5-said-10s-ago-not-again",
    ),
    pytest.param(
        pod(**deleting(700, 0)),
        Asked(first=NOW - ago(700), accepted=NOW - ago(50), grace=0, said=NOW - ago(600)),
        (Delete("r1-1", 0), 700.0, True),
        id="O5-said-10min-ago-said-again",
    ),
    pytest.param(
        pod(**deleting(95, 0)),
        None,
        (Delete("r1-1", 0), 95.0, True),
        id="O5-after-an-operator-restart-from-the-pods-own-record",
    ),
    pytest.param(
        pod(),
        Asked(first=NOW - ago(60), error="403 forbidden"),
        (Delete("r1-1", 0), 60.0, True),
        id="O5-every-delete-refused-for-grace-plus-margin",
    ),
]


@pytest.mark.parametrize(("old", "asked", "expected"), LINGERING)
def test_a_pod_that_lingers(
    old: OldPod, asked: Asked | None, expected: tuple[Delete | None, float, bool]
) -> None:
    delete, linger = decide_pod(old, asked, NOW, TIMING)

    assert linger is not None
    assert (delete, linger.asked_for, linger.say) == expected
    assert linger.error == (asked.error if asked else "")


def test_sweep_collects_deletes_and_lingering_and_requeues_while_pods_remain() -> None:
    pods = [
        pod(name="r1-1", attempt=1, ended=True),  # left for its logs
        pod(name="r1-2", attempt=2, node=NodeState.NOT_READY),
        pod(name="r1-3", attempt=3, **deleting(45, 0)),
    ]

    s = sweep(pods, {}, NOW, TIMING)

    assert s.deletes == [Delete("r1-2", 0), Delete("r1-3", 0)]
    assert [(x.pod.name, x.say) for x in s.lingering] == [("r1-3", True)]
    assert s.requeue_after == TIMING.retry_seconds


@pytest.mark.parametrize(
    "pods",
    [pytest.param([], id="none"), pytest.param([pod(ended=True)], id="only-a-stopped-one")],
)
def test_sweep_without_a_pod_to_see_go_asks_no_requeue(pods: list[OldPod]) -> None:
    assert sweep(pods, {}, NOW, TIMING).requeue_after is None
    assert sweep(pods, {}, NOW, TIMING).deletes == []


def labelled(builder: PodBuilder, attempt: str = "1") -> dict[str, Any]:
    """The pod with the run and attempt labels the operator sets."""
    built = builder.build()
    built["metadata"]["labels"] = {LABEL_RUN: "r1", LABEL_ATTEMPT: attempt}
    return built


def test_old_pod_reads_a_running_pod_and_its_not_ready_node() -> None:
    raw = labelled(make_pod("r1-1").running())

    seen = old_pod(raw, make_node("n1").not_ready().build(), False)

    assert seen == OldPod(name="r1-1", attempt=1, node=NodeState.NOT_READY, node_name="n1")


def test_old_pod_reads_a_deletion_its_grace_and_finalizers() -> None:
    raw = labelled(make_pod("r1-1").running(), attempt="2")
    raw["metadata"] |= {
        "deletionTimestamp": rfc3339(NOW + ago(20)),
        "deletionGracePeriodSeconds": 20,
        "finalizers": ["example.com/keep"],
    }
    raw["spec"]["terminationGracePeriodSeconds"] = 120

    seen = old_pod(raw, None, True)

    assert seen is not None
    assert (seen.attempt, seen.node, seen.grace_seconds) == (2, NodeState.GONE, 120)
    assert (seen.deleting_since, seen.finalizers) == (NOW, ("example.com/keep",))


@pytest.mark.parametrize(
    ("builder", "ended"),
    [
        pytest.param(make_pod("r1-1").trainer_exited(1), True, id="failed"),
        pytest.param(make_pod("r1-1").trainer_exited(0, phase="Running"), True, id="stopping"),
        pytest.param(make_pod("r1-1").running(), False, id="running"),
    ],
)
def test_old_pod_ended_on_a_ready_node(builder: PodBuilder, ended: bool) -> None:
    seen = old_pod(labelled(builder), make_node("n1").build(), False)

    assert seen is not None and seen.ended is ended


def test_old_pod_without_an_attempt_label_is_none() -> None:
    assert old_pod(make_pod("r1-1").running().build(), None, False) is None


MESSAGES = [
    pytest.param(
        pod(finalizers=("example.com/keep",)),
        "",
        ["finalizers example.com/keep", '"finalizers":null', f"-n {NAMESPACE} patch pod r1-1"],
        id="finalizer",
    ),
    pytest.param(
        pod(node=NodeState.NOT_READY),
        "",
        ["node n1 is NotReady", "delete pod r1-1 --force --grace-period=0"],
        id="node-not-ready",
    ),
    pytest.param(
        pod(node=NodeState.GONE), "", ["node n1 is gone", "--force --grace-period=0"], id="gone"
    ),
    pytest.param(
        pod(), "403 forbidden", ["refused its DELETE (403 forbidden)", "pods: delete"], id="refused"
    ),
    pytest.param(pod(), "", ["kubelet on n1 has not confirmed"], id="kubelet"),
]


@pytest.mark.parametrize(("old", "error", "parts"), MESSAGES)
def test_lingers_message_names_pod_attempt_time_cause_and_fix(
    old: OldPod, error: str, parts: list[str]
) -> None:
    message = lingers_message(Lingering(old, 95.0, True, error), NAMESPACE)

    assert message.startswith("pod r1-1 of attempt 1 is still there 95s after it was asked to go")
    for part in parts:
        assert part in message


@pytest.mark.parametrize(
    ("seconds", "shown"), [(45, "45s"), (119, "119s"), (600, "10m"), (7500, "2h5m")]
)
def test_lingers_message_says_how_long_in_a_readable_unit(seconds: float, shown: str) -> None:
    message = lingers_message(Lingering(pod(), seconds, True), NAMESPACE)

    assert f"still there {shown} after" in message


def _exited(phase: str, finished: str | None, grace: int | None = 20) -> dict[str, Any]:
    pod = make_pod("r1-1").running().trainer_exited(143, phase=phase).build()
    if finished is not None:
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = finished
    if grace is not None:
        pod["spec"]["terminationGracePeriodSeconds"] = grace
    return pod


@pytest.mark.parametrize(
    ("pod", "node", "until"),
    [
        pytest.param(
            _exited("Running", rfc3339(T0)), "ready", T0 + timedelta(seconds=20), id="drains"
        ),
        pytest.param(
            _exited("Running", rfc3339(T0), grace=None),
            "ready",
            T0 + timedelta(seconds=30),
            id="default-grace",
        ),
        pytest.param(
            _exited("Running", rfc3339(T0 - timedelta(seconds=5)), grace=20),
            "ready",
            T0 + timedelta(seconds=15),
            id="from-the-exit",
        ),
        pytest.param(_exited("Failed", rfc3339(T0)), "ready", None, id="stopped"),
        pytest.param(_exited("Running", None), "ready", None, id="exit-time-unknown"),
        pytest.param(_exited("Running", rfc3339(T0)), "not-ready", None, id="node-not-ready"),
        pytest.param(_exited("Running", rfc3339(T0)), "gone", None, id="node-gone"),
        pytest.param(make_pod("r1-1").running().build(), "ready", None, id="trainer-runs"),
    ],
)
def test_draining_until(pod: dict[str, Any], node: str, until: Any) -> None:
    node_obj = None if node == "gone" else make_node("n1").build()
    if node == "not-ready":
        node_obj = make_node("n1").not_ready().build()
    assert draining_until(pod, node_obj, node == "gone") == until
