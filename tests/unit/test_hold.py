"""Pauses and queues (decide.hold through plan()): ``spec.suspend`` and Kueue's admission.

Covers:

- a run created suspended or queued makes no pod and says why; lifting the hold asks for
  attempt 1;
- a hold on a running attempt asks every pod to save and stop (notice and stop annotations,
  once), shows Suspending, and comes back at the grace period's end;
- the stopped attempt ends as a pause: spec.suspend spends nothing, an eviction by Kueue is a
  preemption (within maxPreemptions); the next attempt is recorded and waits for the hold;
- past the grace period the pods are deleted in the pass that records the end; pods that do
  not run yet are deleted at once; a success during the stop still finishes the run;
- a hold lifted while the attempt stops resubmits at once, counting nothing;
- Kueue's words reach the status; a reworded wait changes the message without a new Event;
- the same observation gives the same plan.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.unit.builders import RunBuilder, make_node, make_run, pod_from
from tests.unit.test_reconcile import Driver
from trainingrun.contract import ANNOTATION_NOTICE, ANNOTATION_STOP, STOP_EVICTED, STOP_SUSPEND
from trainingrun.decide import reasons as R
from trainingrun.decide.gang import Member
from trainingrun.decide.pod import AgentSettings, build_pod
from trainingrun.decide.reconcile import plan
from trainingrun.decide.status import (
    PHASE_PENDING,
    PHASE_QUEUED,
    PHASE_RUNNING,
    PHASE_SUCCEEDED,
    PHASE_SUSPENDED,
    PHASE_SUSPENDING,
    phase_of,
)

GRACE = 60


def _running(run: RunBuilder) -> tuple[Driver, dict[str, Any]]:
    """A run whose attempt 1 was created and runs."""
    d = Driver(run.with_grace_period(GRACE))
    assert d.pass_().create_attempt == 1
    pod = pod_from(d.start()).running().build()
    assert d.pass_(pod, node=make_node().build()).status.phase == PHASE_RUNNING
    return d, pod


def _suspend(run: RunBuilder) -> RunBuilder:
    return run.with_suspend(True)


def _evict(run: RunBuilder) -> RunBuilder:
    return run.with_queue(False, R.EVICTED, "Preempted: to admit workload team/high")


HOLDS = [
    pytest.param(_suspend, STOP_SUSPEND, PHASE_SUSPENDED, R.SUSPEND_REQUESTED, id="spec.suspend"),
    pytest.param(_evict, STOP_EVICTED, PHASE_QUEUED, R.EVICTED, id="kueue-eviction"),
]


def _asked(pod: dict[str, Any], why: str) -> dict[str, Any]:
    """The pod after the operator asked it to stop for ``why``."""
    builder = pod_from(pod).annotated(ANNOTATION_STOP, why)
    return builder.annotated(ANNOTATION_NOTICE, "held").build()


@pytest.mark.parametrize(
    ("hold", "phase", "reason"),
    [
        (_suspend, PHASE_SUSPENDED, R.SUSPEND_REQUESTED),
        (lambda r: r.with_queue(False, R.QUEUED, "waiting for quota"), PHASE_QUEUED, R.QUEUED),
        (lambda r: r.with_queue(False, R.KUEUE_NOT_INSTALLED, "no Kueue"), PHASE_QUEUED, None),
    ],
)
def test_a_run_created_held_makes_no_pod_until_released(
    hold: Any, phase: str, reason: str | None
) -> None:
    run = hold(make_run("r1"))
    d = Driver(run)

    p = d.pass_()

    assert (p.create_attempt, p.status.attempt, p.status.phase) == (None, 0, phase)
    assert p.status.reason == (reason or R.KUEUE_NOT_INSTALLED)
    assert [e.reason for e in p.events] == [reason or R.KUEUE_NOT_INSTALLED]
    assert p.events[0].type == ("Warning" if reason is None else "Normal")
    assert plan(d.observe()).events == []  # said once

    run.with_suspend(False).with_queue(True, R.ADMITTED_BY_KUEUE, "admitted by ClusterQueue cq")
    released = d.pass_()

    assert (released.create_attempt, released.status.phase) == (1, PHASE_PENDING)


@pytest.mark.parametrize(("hold", "why", "phase", "reason"), HOLDS)
def test_a_hold_asks_the_running_attempt_to_save_and_stop_once(
    hold: Any, why: str, phase: str, reason: str
) -> None:
    d, pod = _running(make_run("r1"))
    hold(d.run)

    p = d.pass_(pod, node=make_node().build())

    assert p.annotate == ("r1-1",)
    assert p.annotations[ANNOTATION_STOP] == why
    assert ANNOTATION_NOTICE in p.annotations
    assert (p.status.phase, p.delete_pods, p.create_attempt) == (PHASE_SUSPENDING, (), None)
    assert p.requeue_after == pytest.approx(GRACE + 1)
    assert [e.reason for e in p.events] == [reason]

    again = d.pass_(_asked(pod, why), node=make_node().build())

    assert again.annotate == ()
    assert again.events == []


@pytest.mark.parametrize(("hold", "why", "phase", "reason"), HOLDS)
def test_the_stopped_attempt_ends_as_its_hold_says_and_waits_for_release(
    hold: Any, why: str, phase: str, reason: str
) -> None:
    d, pod = _running(make_run("r1").with_checkpoint(40))
    hold(d.run)
    d.pass_(pod, node=make_node().build())
    d.advance(5)
    stopped = pod_from(_asked(pod, why)).trainer_exited(143).build()  # saved, then exited

    p = d.pass_(stopped, node=make_node().build())

    assert (p.status.attempt, p.status.active_pod, p.create_attempt) == (2, None, None)
    assert p.delete_pods == ("r1-1",)  # ended, and still removed: nothing stays while held
    assert p.status.phase == phase
    assert p.status.restarts == 0
    assert p.status.preemptions == (1 if why == STOP_EVICTED else 0)
    assert p.events[-1].reason == (R.PREEMPTED if why == STOP_EVICTED else R.PAUSED)
    assert ("evicted by Kueue" if why == STOP_EVICTED else "spec.suspend") in p.events[-1].message
    assert plan(d.observe()).create_attempt is None  # still held: no pod

    d.run.with_suspend(False).with_queue(True, R.ADMITTED_BY_KUEUE, "admitted")
    released = d.pass_()

    assert (released.create_attempt, released.status.attempt) == (2, 2)
    assert released.status.preemptions == p.status.preemptions


def test_an_eviction_spends_the_preemption_budget() -> None:
    d, pod = _running(make_run("r1").with_restart_policy(maxPreemptions=0))
    _evict(d.run)
    d.pass_(pod, node=make_node().build())

    p = d.pass_(pod_from(_asked(pod, STOP_EVICTED)).trainer_exited(143).build())

    assert p.status.reason == R.PREEMPTIONS_EXHAUSTED
    assert p.status.phase == "Failed"


@pytest.mark.parametrize(("hold", "why", "phase", "reason"), HOLDS)
def test_pods_still_running_after_the_grace_period_are_deleted(
    hold: Any, why: str, phase: str, reason: str
) -> None:
    d, pod = _running(make_run("r1"))
    hold(d.run)
    d.pass_(pod, node=make_node().build())
    d.advance(GRACE - 1)
    assert d.pass_(_asked(pod, why), node=make_node().build()).delete_pods == ()
    d.advance(1)

    p = d.pass_(_asked(pod, why), node=make_node().build())

    assert p.delete_pods == ("r1-1",)
    assert (p.status.attempt, p.status.phase, p.create_attempt) == (2, phase, None)
    assert "did not stop within the grace period" in (p.status.message or "")


def test_a_pod_not_running_yet_is_deleted_at_once() -> None:
    d = Driver(make_run("r1").with_grace_period(GRACE))
    d.pass_()
    pending = pod_from(d.start()).build()  # created, not scheduled
    d.run.with_suspend(True)

    p = d.pass_(pending)

    assert p.delete_pods == ("r1-1",)
    assert (p.status.attempt, p.status.phase, p.status.restarts) == (2, PHASE_SUSPENDED, 0)


def test_pods_of_an_attempt_not_recorded_as_started_go_and_the_next_attempt_waits() -> None:
    d = Driver(make_run("r1").with_replicas(2))
    assert d.pass_().create_attempt == 1
    rank0 = pod_from(d.build()).running().build()
    d.run.with_suspend(True)
    obs = replace(d.observe(rank0), peers=(Member("r1-1-1", None),))  # not created yet

    p = plan(obs)

    assert (p.status.attempt, p.create_attempt, p.status.phase) == (2, None, PHASE_SUSPENDED)
    assert p.delete_pods == ("r1-1-0",)


def test_a_success_during_the_stop_finishes_the_run() -> None:
    d, pod = _running(make_run("r1"))
    d.run.with_suspend(True)
    d.pass_(pod, node=make_node().build())

    p = d.pass_(pod_from(_asked(pod, STOP_SUSPEND)).trainer_exited(0).build())

    assert p.status.phase == PHASE_SUCCEEDED


def test_a_suspension_lifted_while_stopping_resubmits_at_once_counting_nothing() -> None:
    d, pod = _running(make_run("r1"))
    d.run.with_suspend(True)
    d.pass_(pod, node=make_node().build())
    d.run.with_suspend(False)
    assert d.pass_(_asked(pod, STOP_SUSPEND)).status.phase == PHASE_RUNNING

    p = d.pass_(pod_from(_asked(pod, STOP_SUSPEND)).trainer_exited(143).build())

    assert (p.create_attempt, p.status.attempt) == (2, 2)
    assert (p.status.restarts, p.status.preemptions) == (0, 0)
    assert p.events[-1].reason == R.PAUSED


def test_every_pod_of_a_gang_is_asked() -> None:
    run = make_run("r1").with_replicas(3).with_grace_period(GRACE)
    d = Driver(run)
    assert d.pass_().create_attempt == 1
    ranks = [build_pod(run.ref(), 1, None, AgentSettings(), 1, rank) for rank in range(3)]
    d.start()
    run.with_suspend(True)
    pods = [pod_from(pod).running().build() for pod in ranks]
    peers = tuple(Member(pod["metadata"]["name"], pod) for pod in pods[1:])

    p = plan(replace(d.observe(pods[0]), peers=peers))

    assert p.annotate == ("r1-1-0", "r1-1-1", "r1-1-2")


def test_kueue_rewording_a_wait_changes_the_message_without_an_event() -> None:
    run = make_run("r1").with_queue(False, R.QUEUED, "couldn't assign flavors: cpu 1 > 0")
    d = Driver(run)
    d.pass_()
    run.with_queue(False, R.QUEUED, "couldn't assign flavors: cpu 2 > 1")

    p = d.pass_()

    assert p.events == []
    assert p.status.message == "couldn't assign flavors: cpu 2 > 1"


@pytest.mark.parametrize(("hold", "why", "phase", "reason"), HOLDS)
def test_the_same_observation_gives_the_same_plan(
    hold: Any, why: str, phase: str, reason: str
) -> None:
    d, pod = _running(make_run("r1"))
    hold(d.run)
    obs = d.observe(pod, node=make_node().build())

    assert plan(obs) == plan(obs)


@pytest.mark.parametrize(
    ("conditions", "phase"),
    [
        ({R.RUNNING: "True", R.SUSPENDED: "True"}, PHASE_SUSPENDING),
        ({R.RUNNING: "True", R.ADMITTED: "False"}, PHASE_SUSPENDING),
        ({R.RUNNING: "True", R.ADMITTED: "True"}, PHASE_RUNNING),
        ({R.RUNNING: "False", R.SUSPENDED: "True"}, PHASE_SUSPENDED),
        ({R.SUSPENDED: "True", R.ADMITTED: "False"}, PHASE_SUSPENDED),
        ({R.ADMITTED: "False"}, PHASE_QUEUED),
        ({R.SUSPENDED: "False"}, PHASE_PENDING),
        ({R.SUCCEEDED: "True", R.SUSPENDED: "True"}, PHASE_SUCCEEDED),
    ],
)
def test_phase_of_a_held_run(conditions: dict[str, str], phase: str) -> None:
    status = make_run("r1").status()
    conds = [
        {"type": t, "status": v, "reason": "X", "lastTransitionTime": "2025-01-01T12:00:00Z"}
        for t, v in conditions.items()
    ]
    status = status.model_validate({"conditions": conds})

    assert phase_of(status) == phase
