"""plan(), started(), set_condition(), phase_of() and fail(): reconcile passes as pure
functions, driven through the sequences a run goes through.

Covers:

- a new run asks for attempt 1; started() records the pod as active (Started or Resumed);
- a running pod keeps the run Running with ``activePod`` set, and a pod whose ``started()``
  write was lost is adopted;
- a failed pod moves to attempt N+1 with ``nextAttemptTime`` in the future and a requeue, and
  the pod of N+1 is asked for only once that time has passed;
- a preempted pod moves to attempt N+1 and asks for its pod in the same plan, spends a
  preemption and no restart; one still running (node NotReady) is deleted, an ended one is not,
  nor one whose trainer ended while its sidecar still commits on a Ready node (it keeps its logs);
  a failure without backoff asks for the next pod in the same plan too;
- a pod missing while ``activePod`` names it is a preemption; one not created yet is not;
- an image pull error keeps the run Running with reason ImagePullRetrying and a requeue for the
  end of the grace, then fails it; a pull that goes through gives the start its reason back;
- success waits until the pod has ended (the sidecar's last commit), then records that
  checkpoint;
- success, an exhausted restart budget and a permanent error finish the run with the matching
  conditions, phase and Event; finished runs are left alone;
- a bad checkpoint is recorded and the next attempt starts at once; the latest checkpoint
  never goes backwards;
- ``lastTransitionTime`` changes only when a condition's status flips;
- idempotence: the same observation gives the same plan, and feeding the planned status back
  with an unchanged world changes nothing;
- crash loops are still caught when the attempts resume below a checkpoint recorded as bad, and
  a bad checkpoint is recorded even when the pod's start was not (started() write lost);
- phase_of() and fail().
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from tests.unit.builders import T0, RunBuilder, make_node, make_pod, make_run, pod_from
from trainingrun.api import Condition, TrainingRunStatus
from trainingrun.contract import SYNC_CONTAINER, parse_time, rfc3339
from trainingrun.decide import reasons as R
from trainingrun.decide.classify import (
    CONFIG_CACHE_GRACE_SECONDS,
    CONFIG_CACHE_RECHECK_SECONDS,
    IMAGE_PULL_GRACE_SECONDS,
)
from trainingrun.decide.observed import Observed, Plan
from trainingrun.decide.pod import AgentSettings, build_pod, resume_of
from trainingrun.decide.reasons import CRASH_LOOP as REASON_CRASH_LOOP
from trainingrun.decide.reasons import FAILED, RUNNING, SUCCEEDED
from trainingrun.decide.reasons import RESTARTS_EXHAUSTED as REASON_RESTARTS_EXHAUSTED
from trainingrun.decide.reconcile import plan, started
from trainingrun.decide.status import (
    PHASE_BACKOFF,
    PHASE_FAILED,
    PHASE_PENDING,
    PHASE_RUNNING,
    PHASE_SUCCEEDED,
    Event,
    fail,
    phase_of,
    set_condition,
)


class Driver:
    """Plays the controller around plan(): each pass observes the run with the status the last
    pass planned (the write landed), and ``start()`` makes the pod plan() asked for with
    build_pod() and records it with started()."""

    def __init__(self, run: RunBuilder, now: datetime = T0) -> None:
        self.run = run
        self.status = run.status()
        self.now = now
        self.events: list[Event] = []

    def observe(
        self,
        pod: dict[str, Any] | None = None,
        *,
        node: dict[str, Any] | None = None,
        node_deleted: bool = False,
    ) -> Observed:
        return self.run.observe(
            pod, node=node, node_deleted=node_deleted, status=self.status, now=self.now
        )

    def pass_(
        self,
        pod: dict[str, Any] | None = None,
        *,
        node: dict[str, Any] | None = None,
        node_deleted: bool = False,
    ) -> Plan:
        p = plan(self.observe(pod, node=node, node_deleted=node_deleted))
        self.status = p.status
        self.events.extend(p.events)
        return p

    def build(self, resume_step: int | None = None) -> dict[str, Any]:
        """The pod of ``status.attempt``, as the controller would create it."""
        ref = self.run.ref()
        return build_pod(
            ref, self.status.attempt, resume_of(ref, resume_step), AgentSettings(), epoch=1
        )

    def start(self, resume_step: int | None = None) -> dict[str, Any]:
        pod = self.build(resume_step)
        self.status, event = started(self.status, self.observe(), pod)
        self.events.append(event)
        return pod

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def _launched(run: RunBuilder, resume_step: int | None = None) -> tuple[Driver, dict[str, Any]]:
    """A run whose first pass asked for attempt 1 and whose pod was then created."""
    d = Driver(run)
    assert d.pass_().create_attempt == 1
    return d, d.start(resume_step)


def _condition(status: TrainingRunStatus, ctype: str) -> Condition:
    return next(c for c in status.conditions if c.type == ctype)


# -- starting -----------------------------------------------------------------------------


def test_new_run_asks_for_attempt_1() -> None:
    d = Driver(make_run("r1").with_generation(3))

    p = d.pass_()

    assert p.create_attempt == 1
    assert (p.delete_pods, p.events, p.requeue_after) == ((), [], None)
    assert p.status.attempt == 1
    assert p.status.active_pod is None
    assert p.status.phase == PHASE_PENDING
    assert p.status.observed_generation == 3


def test_started_from_scratch_records_the_active_pod() -> None:
    d, pod = _launched(make_run("r1"))

    assert pod["metadata"]["name"] == "r1-1"
    assert d.status.active_pod == "r1-1"
    assert d.status.phase == PHASE_RUNNING
    assert d.status.resume_step is None
    assert _condition(d.status, RUNNING).status == "True"
    assert d.events[-1] == Event("Normal", "Started", "attempt 1 (r1-1) starts from scratch")


def test_started_from_a_checkpoint_records_the_resume_step() -> None:
    d, _ = _launched(make_run("r1").with_checkpoint(120), resume_step=120)

    assert d.status.resume_step == 120
    assert d.status.reason == "Resumed"
    assert d.events[-1].reason == "Resumed"
    assert "step 120" in d.events[-1].message


def test_running_pod_keeps_the_run_running() -> None:
    d, pod = _launched(make_run("r1"))

    p = d.pass_(pod_from(pod).running().build(), node=make_node().build())

    assert p.status.phase == PHASE_RUNNING
    assert p.status.active_pod == "r1-1"
    assert p.status.attempt == 1
    assert (p.create_attempt, p.delete_pods, p.events) == (None, (), [])


def test_running_pod_whose_start_was_not_recorded_is_adopted() -> None:
    d = Driver(make_run("r1").with_checkpoint(120))
    d.pass_()
    pod = d.build(resume_step=120)  # created, but the started() status write was lost

    p = d.pass_(pod_from(pod).running().build())

    assert p.status.active_pod == "r1-1"
    assert p.status.resume_step == 120
    assert p.status.phase == PHASE_RUNNING
    assert p.create_attempt is None
    assert (p.status.reason, _condition(p.status, RUNNING).reason) == ("Resumed", "Resumed")
    assert p.events == [Event("Normal", "Resumed", "attempt 1 (r1-1) resumes from step 120")]


def test_replacement_pod_whose_start_was_not_recorded_shows_resumed_not_the_last_failure() -> None:
    d, pod = _launched(make_run("r1").with_checkpoint(42))
    d.status = d.pass_(pod_from(pod).trainer_exited(1).build()).status
    assert (d.status.attempt, d.status.reason) == (2, "Failed")
    replacement = d.build(resume_step=42)  # created; the write recording it did not land

    p = d.pass_(pod_from(replacement).running().build())

    assert (p.status.active_pod, p.status.reason) == ("r1-2", "Resumed")
    assert "resumes from step 42" in (p.status.message or "")
    assert _condition(p.status, RUNNING).status == "True"
    assert (p.status.restarts, p.status.attempt) == (1, 2)


# -- failure and backoff ------------------------------------------------------------------


def test_failed_attempt_backs_off_then_asks_for_the_next() -> None:
    run = make_run("r1").with_restart_policy(backoff={"initial_seconds": 30})
    d, pod = _launched(run)

    failed = d.pass_(pod_from(pod).trainer_exited(1).build())

    assert failed.status.attempt == 2
    assert (failed.status.restarts, failed.status.preemptions) == (1, 0)
    assert failed.status.active_pod is None
    due = parse_time(failed.status.next_attempt_time)
    assert due is not None
    assert due > d.now
    assert failed.requeue_after == 30
    assert failed.create_attempt is None
    assert failed.delete_pods == ()  # the pod ended; it stays for its logs
    assert failed.status.phase == PHASE_BACKOFF
    assert _condition(failed.status, RUNNING).status == "False"
    assert [(e.type, e.reason) for e in failed.events] == [("Warning", "Failed")]

    d.advance(10)
    waiting = d.pass_(None)
    assert waiting.create_attempt is None
    assert waiting.requeue_after == pytest.approx(20)
    assert waiting.status.attempt == 2

    d.advance(20)
    due_now = d.pass_(None)
    assert due_now.create_attempt == 2

    second = d.start()
    assert second["metadata"]["name"] == "r1-2"
    assert d.status.next_attempt_time is None
    assert d.status.phase == PHASE_RUNNING


def test_failed_attempt_without_backoff_asks_for_the_next_pod_in_the_same_plan() -> None:
    run = make_run("r1").with_restart_policy(backoff={"initial_seconds": 0, "max_seconds": 0})
    d, pod = _launched(run)

    failed = d.pass_(pod_from(pod).trainer_exited(1).build())

    assert (failed.status.attempt, failed.status.restarts) == (2, 1)
    assert failed.status.next_attempt_time is None
    assert failed.status.active_pod is None  # recorded by started() once the pod exists
    assert (failed.create_attempt, failed.requeue_after, failed.delete_pods) == (2, None, ())
    assert [(e.type, e.reason) for e in failed.events] == [("Warning", "Failed")]

    second = d.start()
    assert second["metadata"]["name"] == "r1-2"
    assert (d.status.active_pod, d.status.phase) == ("r1-2", PHASE_RUNNING)


def test_restart_budget_exhausted_fails_the_run() -> None:
    d, pod = _launched(make_run("r1").with_restart_policy(max_restarts=0))

    p = d.pass_(pod_from(pod).trainer_exited(137, reason="OOMKilled").build())

    assert p.status.phase == PHASE_FAILED
    assert p.status.reason == REASON_RESTARTS_EXHAUSTED
    assert _condition(p.status, FAILED).status == "True"
    assert _condition(p.status, FAILED).reason == REASON_RESTARTS_EXHAUSTED
    assert p.status.attempt == 1
    assert p.create_attempt is None
    assert [(e.type, e.reason) for e in p.events] == [("Warning", REASON_RESTARTS_EXHAUSTED)]


def test_permanent_error_fails_the_run_and_deletes_the_waiting_pod() -> None:
    d, pod = _launched(make_run("r1"))

    p = d.pass_(pod_from(pod).on_node().waiting("InvalidImageName").build())

    assert p.status.phase == PHASE_FAILED
    assert p.status.reason == "InvalidImageName"
    assert p.delete_pods == ("r1-1",)
    assert p.create_attempt is None


def test_image_pull_error_is_retried_then_fails_the_run_once_the_grace_is_spent() -> None:
    d, pod = _launched(make_run("r1"))
    failing = pod_from(pod).scheduled(rfc3339(d.now)).waiting("ErrImagePull", message="timeout")

    d.advance(60)
    p = d.pass_(failing.build(), node=make_node().build())

    assert p.status.phase == PHASE_RUNNING
    assert p.status.reason == "ImagePullRetrying"
    assert "timeout" in p.status.message and "fails if the image" in p.status.message
    assert (p.create_attempt, p.delete_pods, p.events) == (None, (), [])
    assert p.requeue_after == IMAGE_PULL_GRACE_SECONDS - 60 + 1

    d.advance(IMAGE_PULL_GRACE_SECONDS - 60)
    p = d.pass_(failing.waiting("ImagePullBackOff").build(), node=make_node().build())

    assert p.status.phase == PHASE_FAILED
    assert p.status.reason == "ImagePullBackOff"
    assert p.delete_pods == ("r1-1",)


def test_a_kubelet_cache_not_synced_keeps_the_run_running_then_gives_the_start_back() -> None:
    d, pod = _launched(make_run("r1"))
    d.advance(60)
    waiting = pod_from(pod).scheduled(rfc3339(d.now - timedelta(seconds=60)))
    words = "failed to sync secret cache: timed out waiting for the condition"
    waiting = waiting.waiting("CreateContainerConfigError", container=SYNC_CONTAINER, message=words)

    p = d.pass_(waiting.build(), node=make_node().build())

    assert p.status.phase == PHASE_RUNNING
    assert p.status.reason == "ContainerConfigRetrying"
    assert words in p.status.message and "the kubelet retries" in p.status.message
    assert "the attempt fails at" in p.status.message
    assert (p.create_attempt, p.delete_pods, p.events) == (None, (), [])
    assert p.requeue_after == CONFIG_CACHE_RECHECK_SECONDS + 1

    p = d.pass_(pod_from(pod).running(since=rfc3339(d.now)).build(), node=make_node().build())

    assert p.status.reason == "Started"
    assert p.status.phase == PHASE_RUNNING


def test_a_kubelet_cache_never_synced_fails_the_attempt_and_replaces_its_pod() -> None:
    run = make_run("r1").with_restart_policy(backoff={"initial_seconds": 0, "max_seconds": 0})
    d, pod = _launched(run)
    scheduled = d.now
    words = "failed to sync configmap cache: timed out waiting for the condition"
    waiting = pod_from(pod).on_node("spot-7").scheduled(rfc3339(scheduled))
    waiting = waiting.waiting("CreateContainerConfigError", message=words)

    d.advance(CONFIG_CACHE_GRACE_SECONDS - 10)  # the last recheck waits only to the deadline
    p = d.pass_(waiting.build(), node=make_node("spot-7").build())
    assert p.status.reason == "ContainerConfigRetrying"
    assert p.requeue_after == 10 + 1

    d.advance(10)
    p = d.pass_(waiting.build(), node=make_node("spot-7").build())

    assert (p.status.attempt, p.status.restarts) == (2, 1)
    assert (p.create_attempt, p.delete_pods) == (2, ("r1-1",))
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "Failed")]
    assert "ContainerConfigUnreadable" in p.events[0].message
    assert "the kubelet of node spot-7 could not read it" in p.events[0].message


def test_image_pull_that_goes_through_gives_the_start_back_its_reason() -> None:
    d, pod = _launched(make_run("r1"))
    d.advance(30)
    failing = pod_from(pod).scheduled(rfc3339(d.now)).waiting("ErrImagePull")
    assert d.pass_(failing.build(), node=make_node().build()).status.reason == "ImagePullRetrying"

    p = d.pass_(pod_from(pod).running(since=rfc3339(d.now)).build(), node=make_node().build())

    assert (p.status.reason, p.status.message) == (
        "Started",
        "attempt 1 (r1-1) starts from scratch",
    )
    # No wait for the pull any more; only the Protected deadline, 1800 s after the trainer's start.
    assert p.requeue_after == 1800.0


# -- preemption ---------------------------------------------------------------------------


def test_preempted_attempt_is_replaced_at_once_without_spending_restarts() -> None:
    d, pod = _launched(make_run("r1").with_checkpoint(100).with_status(restarts=2), 100)

    p = d.pass_(pod_from(pod).trainer_exited(143).disrupted("PreemptionByScheduler").build())

    assert p.status.attempt == 2
    assert (p.status.restarts, p.status.preemptions) == (2, 1)
    assert p.status.next_attempt_time is None
    # The pod of attempt 2 is asked for in the same plan (the controller writes the status
    # first); a pass that sees attempt 2 recorded and no pod asks again.
    assert p.create_attempt == 2
    assert p.requeue_after is None
    assert [(e.type, e.reason) for e in p.events] == [("Normal", "Preempted")]

    assert d.pass_(None).create_attempt == 2


def test_preempted_pod_that_still_runs_is_deleted() -> None:
    d, pod = _launched(make_run("r1"))

    p = d.pass_(pod_from(pod).running().build(), node=make_node().not_ready().build())

    assert p.delete_pods == ("r1-1",)
    assert p.status.preemptions == 1
    assert p.status.attempt == 2


@pytest.mark.parametrize(
    ("node_ready", "deleted"),
    [
        pytest.param(True, (), id="ready-node-finishes-it-logs-kept"),
        pytest.param(False, ("r1-1",), id="not-ready-node-cannot-so-it-is-deleted"),
    ],
)
def test_failed_trainer_with_the_sidecar_still_up(
    node_ready: bool, deleted: tuple[str, ...]
) -> None:
    d, pod = _launched(make_run("r1"))
    node = make_node().build() if node_ready else make_node().not_ready().build()

    p = d.pass_(pod_from(pod).trainer_exited(1, phase="Running").build(), node=node)

    assert p.status.attempt == 2
    assert p.delete_pods == deleted


def test_notice_taints_come_from_the_spec() -> None:
    run = make_run("r1").with_notice_taints("example.com/reclaim")
    d, pod = _launched(run)

    p = d.pass_(
        pod_from(pod).trainer_exited(143).build(),
        node=make_node().tainted("example.com/reclaim", "NoExecute").build(),
    )

    assert (p.status.preemptions, p.status.restarts) == (1, 0)
    assert "example.com/reclaim" in (p.status.message or "")


def test_missing_pod_named_by_active_pod_is_a_preemption() -> None:
    d, _ = _launched(make_run("r1"))

    p = d.pass_(None)

    assert (p.status.preemptions, p.status.restarts) == (1, 0)
    assert p.status.attempt == 2
    assert p.status.reason == "Preempted"
    assert "PodDeleted" in (p.status.message or "")
    assert p.delete_pods == ()


def test_missing_pod_not_created_yet_is_not_a_preemption() -> None:
    d = Driver(make_run("r1"))
    d.pass_()  # attempt 1 recorded; the pod was never created

    p = d.pass_(None)

    assert p.create_attempt == 1
    assert p.status.preemptions == 0
    assert p.status.attempt == 1


# -- success and finished runs ------------------------------------------------------------


def test_success_waits_for_the_sidecars_last_commit() -> None:
    run = make_run("r1").with_checkpoint(400)
    d, pod = _launched(run, resume_step=400)
    node = make_node().build()

    p = d.pass_(pod_from(pod).running().trainer_exited(0, phase="Running").build(), node=node)

    assert p.status.phase == PHASE_RUNNING
    assert (p.create_attempt, p.delete_pods, p.events) == (None, (), [])

    run.with_checkpoint(500)  # the sidecar committed the final checkpoint, then stopped
    p = d.pass_(pod_from(pod).trainer_exited(0).build(), node=node)

    assert p.status.phase == PHASE_SUCCEEDED
    assert p.status.latest_checkpoint is not None
    assert p.status.latest_checkpoint.step == 500
    assert p.delete_pods == ()


def test_success_finishes_the_run() -> None:
    d, pod = _launched(make_run("r1").with_checkpoint(500), resume_step=400)

    p = d.pass_(pod_from(pod).trainer_exited(0).build())

    assert p.status.phase == PHASE_SUCCEEDED
    assert _condition(p.status, SUCCEEDED).status == "True"
    assert _condition(p.status, RUNNING).status == "False"
    assert p.status.active_pod is None
    assert p.status.latest_checkpoint is not None
    assert p.status.latest_checkpoint.step == 500
    assert (p.create_attempt, p.delete_pods) == (None, ())
    assert [(e.type, e.reason) for e in p.events] == [("Normal", "Succeeded")]


def _succeeded() -> Driver:
    d, pod = _launched(make_run("r1"))
    d.pass_(pod_from(pod).trainer_exited(0).build())
    return d


def _failed() -> Driver:
    d, pod = _launched(make_run("r1").with_restart_policy(max_restarts=0))
    d.pass_(pod_from(pod).trainer_exited(1).build())
    return d


@pytest.mark.parametrize("finish", [_succeeded, _failed], ids=["succeeded", "failed"])
@pytest.mark.parametrize(
    "pod",
    [
        pytest.param(None, id="pod-gone"),
        pytest.param(make_pod("r1-1").trainer_exited(1).build(), id="pod-failed"),
    ],
)
def test_finished_runs_are_left_alone(finish: Any, pod: dict[str, Any] | None) -> None:
    d = finish()
    before = d.status

    p = d.pass_(pod)

    assert p.status == before
    assert (p.create_attempt, p.delete_pods, p.events, p.requeue_after) == (None, (), [], None)


# -- checkpoints --------------------------------------------------------------------------


def test_bad_checkpoint_is_recorded_and_the_next_attempt_starts_at_once() -> None:
    d, pod = _launched(make_run("r1").with_checkpoint(200), resume_step=200)

    p = d.pass_(pod_from(pod).restore_exited(3, message="checksum mismatch").build())

    assert p.status.bad_checkpoints == [200]
    assert p.status.attempt == 2
    assert (p.status.restarts, p.status.preemptions) == (0, 0)
    assert p.status.next_attempt_time is None
    assert (p.create_attempt, p.requeue_after) == (2, None)
    assert d.pass_(None).create_attempt == 2


def test_latest_checkpoint_is_recorded_and_never_goes_backwards() -> None:
    run = make_run("r1").with_checkpoint(200)
    d, pod = _launched(run, resume_step=200)
    running = pod_from(pod).running().build()

    def latest_step_after_pass() -> int | None:
        latest = d.pass_(running).status.latest_checkpoint
        return None if latest is None else latest.step

    assert latest_step_after_pass() == 200
    run.with_checkpoint(100)
    assert latest_step_after_pass() == 200
    run.without_checkpoint()  # manifest not read this pass
    assert latest_step_after_pass() == 200
    run.with_checkpoint(300)
    assert latest_step_after_pass() == 300
    assert d.status.latest_checkpoint == run.checkpoint_ref(300)


# -- conditions ---------------------------------------------------------------------------


def test_set_condition_keeps_the_time_while_the_status_holds() -> None:
    first = set_condition([], RUNNING, True, "Started", "attempt 1", 1, T0)
    later = T0 + timedelta(minutes=5)

    same = set_condition(first, RUNNING, True, "AttemptRunning", "pod r1-1", 2, later)

    assert same[0].last_transition_time == rfc3339(T0)
    assert (same[0].reason, same[0].message, same[0].observed_generation) == (
        "AttemptRunning",
        "pod r1-1",
        2,
    )


def test_set_condition_moves_the_time_when_the_status_flips() -> None:
    first = set_condition([], RUNNING, True, "Started", "attempt 1", 1, T0)
    later = T0 + timedelta(minutes=5)

    flipped = set_condition(first, RUNNING, False, "Failed", "attempt 1 failed", 1, later)

    assert flipped[0].status == "False"
    assert flipped[0].last_transition_time == rfc3339(later)


def test_set_condition_leaves_other_conditions_alone() -> None:
    conds = set_condition([], RUNNING, False, "Failed", "", 1, T0)

    both = set_condition(conds, FAILED, True, "CrashLoop", "", 1, T0 + timedelta(hours=1))

    assert [(c.type, c.status) for c in both] == [(RUNNING, "False"), (FAILED, "True")]
    assert both[0] == conds[0]


def test_transition_time_through_passes() -> None:
    d, pod = _launched(make_run("r1"))
    started_at = _condition(d.status, RUNNING).last_transition_time

    d.advance(60)
    d.pass_(pod_from(pod).running().build())
    assert _condition(d.status, RUNNING).last_transition_time == started_at

    d.advance(60)
    d.pass_(pod_from(pod).trainer_exited(1).build())
    assert _condition(d.status, RUNNING).status == "False"
    assert _condition(d.status, RUNNING).last_transition_time == rfc3339(T0 + timedelta(minutes=2))


# -- idempotence --------------------------------------------------------------------------


def _observations() -> list[Any]:
    def new() -> Observed:
        return Driver(make_run("r1")).observe()

    def running() -> Observed:
        d, pod = _launched(make_run("r1"))
        return d.observe(pod_from(pod).running().build())

    def failed() -> Observed:
        d, pod = _launched(make_run("r1"))
        return d.observe(pod_from(pod).trainer_exited(1).build())

    def preempted() -> Observed:
        d, pod = _launched(make_run("r1"))
        return d.observe(pod_from(pod).running().build(), node=make_node().not_ready().build())

    def backing_off() -> Observed:
        d, pod = _launched(make_run("r1"))
        d.pass_(pod_from(pod).trainer_exited(1).build())
        return d.observe(None)

    return [pytest.param(f, id=f.__name__) for f in (new, running, failed, preempted, backing_off)]


@pytest.mark.parametrize("observation", _observations())
def test_same_observation_gives_the_same_plan(observation: Any) -> None:
    obs = observation()

    assert plan(obs) == plan(obs)


def test_running_status_is_a_fixpoint() -> None:
    d, pod = _launched(make_run("r1"))
    running = pod_from(pod).running().build()

    first = d.pass_(running)
    second = d.pass_(running)

    assert second.status == first.status
    assert (second.create_attempt, second.delete_pods, second.events) == (None, (), [])


def test_an_ended_attempt_is_counted_once() -> None:
    d, pod = _launched(make_run("r1"))
    d.pass_(pod_from(pod).trainer_exited(1).build())
    after_failure = d.status

    # The controller now reads the pod of attempt 2, which does not exist yet.
    again = d.pass_(None)

    assert again.status == after_failure
    assert (again.status.attempt, again.status.restarts) == (2, 1)
    assert again.events == []


# -- crash loops and bad checkpoints ------------------------------------------------------


def test_failures_resumed_below_a_bad_checkpoint_count_toward_crash_loop() -> None:
    # Checkpoints 100 and 200 are committed; 200 turns out corrupt. The attempts that resume
    # from 100 then crash without committing anything: that is a crash loop, even though the
    # newest committed step (200, recorded as bad) is above the step they resumed from.
    run = (
        make_run("r1").with_checkpoint(200).with_restart_policy(max_restarts=10, crash_loop_limit=2)
    )
    d, pod = _launched(run, resume_step=200)
    d.pass_(pod_from(pod).restore_exited(3).build())
    assert d.status.bad_checkpoints == [200]

    reasons = []
    for _ in range(2):
        d.advance(3600)  # past any backoff
        assert d.pass_(None).create_attempt == d.status.attempt
        pod = d.start(resume_step=100)
        d.pass_(pod_from(pod).trainer_exited(1).build())
        reasons.append(d.status.reason)

    assert reasons == ["Failed", REASON_CRASH_LOOP], (
        f"two failures without a new checkpoint (limit 2) gave {reasons}, "
        f"consecutiveFailures={d.status.consecutive_failures}"
    )
    assert d.status.phase == PHASE_FAILED


def test_bad_checkpoint_is_recorded_when_the_pods_start_was_not() -> None:
    # The pod of attempt 2 resumed from 200 but the started() status write was lost (operator
    # restarted): the pod's resume annotation is then the only record of the step it used.
    run = make_run("r1").with_checkpoint(200)
    d, _ = _launched(run, resume_step=200)
    d.pass_(None)  # attempt 1 gone: preempted
    assert d.pass_(None).create_attempt == 2
    pod = d.build(resume_step=200)

    p = d.pass_(pod_from(pod).restore_exited(3).build())

    assert p.status.bad_checkpoints == [200], (
        "the restore of r1-2 found checkpoint 200 corrupt but it was not recorded as bad, so "
        "the next attempt would choose it again"
    )


# -- phase and invalid spec ---------------------------------------------------------------


def _status(
    *conditions: tuple[str, bool], next_attempt_time: str | None = None
) -> TrainingRunStatus:
    conds: list[Condition] = []
    for ctype, value in conditions:
        conds = set_condition(conds, ctype, value, "R", "", 1, T0)
    return TrainingRunStatus(conditions=conds, next_attempt_time=next_attempt_time)


@pytest.mark.parametrize(
    ("status", "phase"),
    [
        pytest.param(_status(), PHASE_PENDING, id="no-conditions-pending"),
        pytest.param(_status((RUNNING, True)), PHASE_RUNNING, id="running"),
        pytest.param(
            _status((RUNNING, False), next_attempt_time="2025-01-01T12:00:30Z"),
            PHASE_BACKOFF,
            id="waiting-for-next-attempt-backoff",
        ),
        pytest.param(_status((RUNNING, False)), PHASE_PENDING, id="between-attempts-pending"),
        pytest.param(_status((RUNNING, False), (SUCCEEDED, True)), PHASE_SUCCEEDED, id="succeeded"),
        pytest.param(_status((RUNNING, True), (FAILED, True)), PHASE_FAILED, id="failed-wins"),
        pytest.param(
            _status((SUCCEEDED, True), (FAILED, True)), PHASE_FAILED, id="failed-beats-succeeded"
        ),
        pytest.param(_status((FAILED, False)), PHASE_PENDING, id="failed-false-is-not-failed"),
    ],
)
def test_phase_of(status: TrainingRunStatus, phase: str) -> None:
    assert phase_of(status) == phase


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        (R.INVALID_SPEC, "spec.checkpoint.storage: Field required"),
        (R.MISSING_SECRET, "Secret ns/creds named by spec.checkpoint.storage... does not exist"),
    ],
    ids=["invalid-spec", "missing-secret"],
)
def test_fail_sets_one_reason_in_status_condition_and_event(reason: str, message: str) -> None:
    d, _ = _launched(make_run("r1"))
    later = T0 + timedelta(minutes=1)

    new, event = fail(d.status, 4, reason, message, later)

    assert new.phase == PHASE_FAILED
    assert (new.reason, new.message) == (reason, message)
    assert new.observed_generation == 4
    failed = _condition(new, FAILED)
    assert (failed.status, failed.reason, failed.message) == ("True", reason, message)
    assert failed.last_transition_time == rfc3339(later)
    assert event == Event("Warning", reason, message)
    assert plan(make_run("r1").observe(status=new)).create_attempt is None
