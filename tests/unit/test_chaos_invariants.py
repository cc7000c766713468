"""The chaos test's own checks can fail: events fed to its observer (tests/chaos/observe.py)
that break an invariant are recorded as breaks, and the legitimate cases next to them are not.
No threads, no cluster: the handlers are called as the watches would call them."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client

from tests.chaos.observe import JUDGE_DELAY_S, Ledger, Observer, Resumable
from tests.chaos.run import memory_check
from trainingrun.contract import ANNOTATION_RESUME_STEP, LABEL_ATTEMPT, LABEL_RUN


def observer() -> Observer:
    core = SimpleNamespace(list_namespaced_pod=None, list_node=None)
    custom = SimpleNamespace(list_namespaced_custom_object=None)
    return Observer(core, custom, None, None, "b", "ns", {}, "lease", list, 0.0)  # type: ignore[arg-type]


def pod(
    name: str,
    uid: str,
    node: str = "n1",
    phase: str = "Running",
    deleting: bool = False,
    trainer: str = "running",
    resume: int | None = None,
) -> client.V1Pod:
    run, attempt = name.rsplit("-", 1)
    state = client.V1ContainerState(
        running=client.V1ContainerStateRunning() if trainer == "running" else None,
        terminated=client.V1ContainerStateTerminated(exit_code=137) if trainer == "ended" else None,
    )
    annotations = {ANNOTATION_RESUME_STEP: str(resume)} if resume is not None else None
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name,
            uid=uid,
            labels={LABEL_RUN: run, LABEL_ATTEMPT: attempt},
            annotations=annotations,
            deletion_timestamp="2026-11-27T00:00:00Z" if deleting else None,
        ),
        spec=client.V1PodSpec(containers=[], node_name=node),
        status=client.V1PodStatus(
            phase=phase,
            container_statuses=[
                client.V1ContainerStatus(
                    name="trainer",
                    state=state,
                    image="i",
                    image_id="",
                    ready=True,
                    restart_count=0,
                )
            ],
        ),
    )


def node(name: str, ready: bool) -> client.V1Node:
    condition = client.V1NodeCondition(type="Ready", status="True" if ready else "False")
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, uid=f"uid-{name}"),
        status=client.V1NodeStatus(conditions=[condition]),
    )


def judged(o: Observer) -> list[str]:
    o.ledger.t0 -= JUDGE_DELAY_S + 1  # the judge's delay has passed
    o.judge()
    return [b.invariant for b in o.ledger.breaks]


def test_a_pod_created_twice_for_one_attempt_breaks() -> None:
    o = observer()
    o.on_pod("ADDED", pod("r-1", "u1"))
    o.on_pod("DELETED", pod("r-1", "u1"))
    o.on_pod("ADDED", pod("r-1", "u2"))
    assert [b.invariant for b in o.ledger.breaks] == ["one-pod-per-attempt"]


def test_a_skipped_attempt_and_a_status_going_back_break() -> None:
    o = observer()
    o.on_pod("ADDED", pod("r-1", "u1", trainer="ended"))
    o.on_pod("ADDED", pod("r-3", "u3"))
    o.on_run("MODIFIED", {"metadata": {"name": "r"}, "status": {"attempt": 3}})
    o.on_run("MODIFIED", {"metadata": {"name": "r"}, "status": {"attempt": 2}})
    assert [b.invariant for b in o.ledger.breaks] == ["attempts-in-order"] * 2


@pytest.mark.parametrize(
    ("old", "node_ready", "broken"),
    [
        ({}, True, True),  # the old trainer still runs on a Ready node: two live attempts
        ({"trainer": "ended"}, True, False),
        ({"deleting": True}, True, False),
        ({"phase": "Failed"}, True, False),
        ({}, False, False),  # its node is NotReady: the operator ends that attempt at once
    ],
    ids=["still-running", "trainer-ended", "being-deleted", "failed", "node-not-ready"],
)
def test_a_new_attempt_beside_a_live_one_breaks(
    old: dict[str, Any], node_ready: bool, broken: bool
) -> None:
    o = observer()
    o.on_node("ADDED", node("n1", node_ready))
    o.on_pod("ADDED", pod("r-1", "u1", **old))
    o.on_pod("ADDED", pod("r-2", "u2", node="n2"))
    assert judged(o) == (["one-live-attempt"] if broken else [])


def watch(o: Observer, name: str) -> Resumable:
    return next(w for w in o.watches if w.name == name)


def listing(objects: list[Any]) -> Callable[..., Any]:
    """A list call answering ``objects`` (as the list after a 410 would)."""
    meta = client.V1ListMeta(resource_version="9")
    return lambda **_: SimpleNamespace(items=objects, metadata=meta)


@pytest.mark.parametrize("gone_in_the_gap", [True, False], ids=["deleted", "still-there"])
def test_a_pod_deleted_while_the_watch_was_down_is_not_live_after_the_next_list(
    gone_in_the_gap: bool,
) -> None:
    """An API server restart can compact the watch's history (410): the pod's DELETED event is
    never seen, only its absence from the list that follows."""
    o = observer()
    pods = watch(o, "pods")
    o.on_node("ADDED", node("n1", True))
    pods.deliver("ADDED", pod("r-1", "u1"))
    pods.list_fn = listing([] if gone_in_the_gap else [pod("r-1", "u1")])
    assert pods.relist() == "9"
    assert pods.vanished == (1 if gone_in_the_gap else 0)
    pods.deliver("ADDED", pod("r-2", "u2", node="n2"))
    assert judged(o) == ([] if gone_in_the_gap else ["one-live-attempt"])


def test_a_node_deleted_while_the_watch_was_down_counts_as_a_node_fault() -> None:
    o = observer()
    nodes = watch(o, "nodes")
    nodes.deliver("ADDED", node("n1", True))
    nodes.deliver("ADDED", node("n2", True))
    o.on_pod("ADDED", pod("r-1", "u1"))
    nodes.list_fn = listing([node("n2", True)])
    nodes.relist()
    o.on_pod("ADDED", pod("r-2", "u2", node="n2"))
    assert o.ledger.node_ready == {"n1": False, "n2": True}
    assert judged(o) == []


def test_a_committed_object_that_changes_breaks() -> None:
    o = observer()
    o.see_object("run/checkpoints/c-10/e1/r0/model.bin", '"a"', 10)
    o.see_object("run/checkpoints/c-10/e1/r0/model.bin", '"a"', 10)
    assert o.ledger.breaks == []
    o.see_object("run/checkpoints/c-10/e1/r0/model.bin", '"b"', 10)
    assert [b.invariant for b in o.ledger.breaks] == ["committed-immutable"]


def test_a_resume_step_is_recorded_for_the_end_check() -> None:
    o = observer()
    o.on_pod("ADDED", pod("r-2", "u2", resume=40))
    assert o.ledger.resumed == [("r", 2, 40)]


@pytest.mark.parametrize(
    ("last_mb", "broken"), [(105.0, False), (111.0, True)], ids=["within-10%", "grew-11%"]
)
def test_memory_that_grows_over_10_percent_breaks(last_mb: float, broken: bool) -> None:
    led = Ledger(0.0)
    led.memory = [(float(t), 7, 100.0 if t < 200 else last_mb, True) for t in range(0, 300, 5)]
    result = memory_check(led, 300.0, 60.0, settled_from=100.0)
    assert result["first_minute_mb"] == 100.0
    assert [b.invariant for b in led.breaks] == (["memory-flat"] if broken else [])


def test_a_step_up_during_the_faults_is_reported_and_growth_after_them_judged() -> None:
    """A burst during the faults leaves a higher plateau (the heap kept): reported as the
    leader's second minute; only what grows in the settle period breaks."""
    led = Ledger(0.0)
    led.memory = [(float(t), 7, 100.0 if t < 150 else 115.0, True) for t in range(0, 400, 5)]
    result = memory_check(led, 400.0, 60.0, settled_from=200.0)
    assert (result["second_minute_led_mb"], result["first_minute_mb"]) == (100.0, 115.0)
    assert led.breaks == []
    led.memory += [(float(t), 7, 130.0, True) for t in range(400, 500, 5)]
    memory_check(led, 500.0, 60.0, settled_from=200.0)
    assert [b.invariant for b in led.breaks] == ["memory-flat"]


def test_a_leader_that_took_over_in_the_settle_period_is_judged_from_its_second_minute() -> None:
    led = Ledger(0.0)
    led.memory = [(float(t), 7, 100.0, t >= 250) for t in range(0, 300, 5)]
    memory_check(led, 300.0, 60.0, settled_from=100.0)
    assert [b.invariant for b in led.breaks] == ["memory-flat"]  # 50 s settled: too short
    led = Ledger(0.0)
    led.memory = [(float(t), 7, 100.0 if t < 400 else 120.0, t >= 250) for t in range(0, 500, 5)]
    result = memory_check(led, 500.0, 60.0, settled_from=100.0)
    assert result["settled_from_s"] == 310
    assert [b.invariant for b in led.breaks] == ["memory-flat"]  # 100 -> 120 MB
