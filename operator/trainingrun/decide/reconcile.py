"""One reconcile pass of a TrainingRun as a pure function: observed state in, desired status and
the actions to apply out. The kopf handlers only gather the observation, call these functions
and apply the plan (``trainingrun.operator.applier``: status, Events, annotations, pods).

The attempt counter moves in two steps so that an operator killed at any point neither makes a
second pod for one attempt nor skips an attempt number:

1. ``plan()`` sees attempt N's pod ended and writes ``attempt = N+1`` with no active pod (and a
   ``nextAttemptTime`` after a failure's backoff). Until that write lands, pod N still exists and
   the next pass decides the same again.
2. ``plan()`` sees attempt N+1 due and asks for its pod ``<run>-<N+1>``; a second create answers
   409, which means done. ``started()`` records the pod as active.

When attempt N+1 is due at once (a preemption, a bad checkpoint, a failure without backoff),
the plan of step 1 also asks for its pod: the controller creates it in the same pass and writes
step 1's status together with ``started()``'s, in one write once the pod exists, so a
resubmission costs one pass, one status write and one read of the bucket manifest. An operator
killed before that write finds attempt N's pod ended again and decides the same: its create of
``<run>-<N+1>`` answers 409 and adopts the pod. One killed between two writes (a next attempt
that waited) finds attempt N+1 recorded with no pod: step 2.

While an attempt runs, its ``Protected`` condition says whether it committed a checkpoint since
its trainer started (``decide.protection``; ``protect`` below).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

from trainingrun.api import TrainingRunStatus
from trainingrun.contract import ANNOTATION_RESUME_STEP, STOP_EVICTED, parse_time, rfc3339
from trainingrun.decide import goodput, hold, notices, progress, savefit
from trainingrun.decide import reasons as R
from trainingrun.decide.classify import Outcome
from trainingrun.decide.gang import Member
from trainingrun.decide.naming import pod_name
from trainingrun.decide.observed import (
    Observed,
    Plan,
    attempt_label,
    attempt_outcome,
    newer,
    sooner,
)
from trainingrun.decide.podview import stops_by_itself
from trainingrun.decide.policy import Action, Counters, decide
from trainingrun.decide.protection import awaiting_message
from trainingrun.decide.status import (
    Event,
    condition_event,
    is_finished,
    is_held,
    is_true,
    set_condition,
    with_status,
)
from trainingrun.decide.unprotected import protect


def _with(status: TrainingRunStatus, obs: Observed, **changes: Any) -> TrainingRunStatus:
    return with_status(status, obs.generation, **changes)


def plan(obs: Observed) -> Plan:
    """The pass for ``obs``; see the module docstring for the two-step attempt counter, and
    ``decide.hold`` for a run paused or queued."""
    status = obs.status
    if is_finished(status):
        return Plan(_with(status, obs))
    latest = newer(obs.latest, status.latest_checkpoint)
    conds, events = hold.mark(status, obs.spec, obs.queue, obs.generation, obs.now)
    status = status.model_copy(update={"latest_checkpoint": latest, "conditions": conds})
    # Between attempts (no node) the last estimate stays: it was made for the last node.
    if obs.node is not None or status.save_estimate is None:
        grace = obs.spec.preemption.termination_grace_period_seconds
        status, fit = savefit.mark(status, grace, obs.node, obs.generation, obs.now)
        events += fit
    status = goodput.restored(status, obs.ledger)  # display only, as the ledger's two below
    status = goodput.seen(goodput.seen(status, obs.last_word), obs.progress)
    p = _plan(status, obs)
    p = replace(p, status=progress.marked(p.status, obs.progress, obs.now))
    p = replace(p, status=_ledger_shown(obs.status, p.status, obs))
    if events:
        p = replace(p, events=[*events, *p.events])
    notice = notices.hand_on(obs.gang, obs.spec.preemption.notice_taints)
    return replace(p, notice=notice) if notice is not None else p


def _ledger_shown(
    before: TrainingRunStatus, after: TrainingRunStatus, obs: Observed
) -> TrainingRunStatus:
    """``after`` with the goodput ledger's figures made again when its attempts or phase
    changed this pass (a progress record, a start, an end): at most as often as those, so the
    ledger alone never writes the status."""
    if after.goodput is not None and (after.attempts, after.phase) == (
        before.attempts,
        before.phase,
    ):
        return after
    return goodput.shown(after, obs.created, obs.now, finished=is_finished(after))


def _plan(status: TrainingRunStatus, obs: Observed) -> Plan:
    held = is_held(status)
    if status.attempt == 0:
        if held:  # created suspended or queued: no pod
            return _held(status, obs)
        return _due(_with(status, obs, attempt=1, next_attempt_time=None), obs)

    current = pod_name(obs.name, status.attempt, 0, obs.spec.replicas)
    if status.active_pod != current and any(m.pod is None for m in obs.gang):
        if not held:
            return _due(status, obs)  # attempt recorded, pods not all created yet
        if all(m.pod is None for m in obs.gang):
            return _held(status, obs)
        # Some pods of an attempt not recorded as started: they go, and the next attempt
        # (a new name for each pod) waits for the hold to be lifted.
        return _ended(status, obs, hold.end_now(status), current)

    outcome = hold.stopped(obs.gang, attempt_outcome(obs))
    if outcome.ended:
        return _ended(status, obs, outcome, current)
    if held:
        return _stopping(status, obs, outcome, current)
    return protect(_running(status, obs, outcome, current), obs, current)


def _held(status: TrainingRunStatus, obs: Observed) -> Plan:
    """No pod while the hold lasts; the status says why (the holding condition's words)."""
    ctype = R.ADMITTED if hold.held_by(status) == STOP_EVICTED else R.SUSPENDED
    c = next(c for c in status.conditions if c.type == ctype)
    return Plan(_with(status, obs, reason=c.reason, message=c.message))


def _stopping(status: TrainingRunStatus, obs: Observed, outcome: Outcome, current: str) -> Plan:
    """A held run's attempt still runs: ask its pods to save and stop, or end it past the
    grace period (``decide.hold.stopping``)."""
    s = hold.stopping(status, obs.spec, obs.gang, obs.now)
    if s.overdue is not None:
        return _ended(status, obs, s.overdue, current)
    p = _running(status, obs, outcome, current)
    return replace(
        p,
        annotate=s.ask,
        annotations=s.annotations,
        requeue_after=sooner(p.requeue_after, s.recheck_after),
    )


def _running(status: TrainingRunStatus, obs: Observed, outcome: Outcome, current: str) -> Plan:
    """The attempt goes on: its pod is recorded as active, and a wait is reported."""
    if obs.pod is not None and not is_true(status, R.RUNNING):
        # The pod exists but its start was not recorded (the write after its creation
        # failed, or the operator stopped between the two): record it as started() would.
        adopted, event = started(status, obs, obs.pod)
        return Plan(adopted, events=[event])
    resume = _resume_step(obs.pod)
    new = _with(
        status,
        obs,
        active_pod=current,
        resume_step=resume if resume is not None else status.resume_step,
        next_attempt_time=None,
    )
    if outcome.decide_at is not None:  # a pull or a config retried, a gang member unscheduled
        new = new.model_copy(update={"reason": outcome.reason, "message": outcome.message})
        wait = max((outcome.decide_at - obs.now).total_seconds(), 0.0) + 1.0
        return Plan(new, requeue_after=wait)
    if status.reason in WAITING:  # the wait is over: back to the start's
        running = next((c for c in status.conditions if c.type == R.RUNNING), None)
        if running is not None:
            new = new.model_copy(update={"reason": running.reason, "message": running.message})
    return Plan(new)


# Reasons of a running attempt that waits for something (a pass looks again at ``decide_at``).
WAITING = frozenset({R.IMAGE_PULL_RETRYING, R.CONTAINER_CONFIG_RETRYING, R.GANG_SCHEDULING})


def _resume_step(pod: Mapping[str, Any] | None) -> int | None:
    value = ((pod or {}).get("metadata") or {}).get("annotations", {}).get(ANNOTATION_RESUME_STEP)
    return int(value) if value is not None and str(value).isdigit() else None


def _due(status: TrainingRunStatus, obs: Observed) -> Plan:
    """Attempt ``status.attempt`` has no pod yet: create it now, or wait out the backoff."""
    due = parse_time(status.next_attempt_time)
    if due and due > obs.now:
        new = _with(status, obs)
        return Plan(new, requeue_after=(due - obs.now).total_seconds())
    return Plan(_with(status, obs), create_attempt=status.attempt)


def _still_running(m: Member) -> bool:
    """A pod that still runs (node NotReady, notice, a gang's other members) is deleted so it
    cannot write again; one whose containers all stopped on a Ready node ends by itself and
    keeps its logs."""
    return (
        m.pod is not None
        and (m.pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and not stops_by_itself(m.pod, m.node, m.node_deleted)
    )


def _to_delete(obs: Observed, outcome: Outcome) -> tuple[str, ...]:
    """The pods an ended attempt deletes: those still running, or every one of an attempt
    stopped for a hold (its pods go: nothing of the run stays while it is held)."""
    if hold.for_hold(outcome):
        return tuple(m.name for m in obs.gang if m.pod is not None)
    return tuple(m.name for m in obs.gang if _still_running(m))


def counters_of(s: TrainingRunStatus) -> Counters:
    """The policy's counters as the status records them."""
    return Counters(
        s.restarts,
        s.preemptions,
        s.consecutive_failures,
        (*s.bad_checkpoints,),
        s.stalled_attempts,
    )


def _ended(status: TrainingRunStatus, obs: Observed, outcome: Outcome, current: str) -> Plan:
    counters = counters_of(status)
    latest_step = status.latest_checkpoint.step if status.latest_checkpoint else None
    status = goodput.ended(status, outcome, latest_step, obs.created, obs.now)
    # The pod's annotation is the record of what it resumed from, even when the status write
    # after its creation was lost.
    resume_step = status.resume_step if status.resume_step is not None else _resume_step(obs.pod)
    d = decide(
        outcome,
        counters,
        obs.spec.restart_policy,
        resume_step=resume_step,
        latest_step=latest_step,
    )
    c = d.counters
    base: dict[str, Any] = {
        "restarts": c.restarts,
        "preemptions": c.preemptions,
        "consecutive_failures": c.consecutive_failures,
        "stalled_attempts": c.stalled,
        "bad_checkpoints": list(c.bad_checkpoints),
        "active_pod": None,
        "reason": d.reason,
        "message": d.message,
    }
    delete = _to_delete(obs, outcome)
    attempt_msg = f"{attempt_label(obs, status.attempt, current)}: {d.message}"
    gen, now = obs.generation, obs.now
    conds, event = condition_event(
        status.conditions, R.RUNNING, False, d.reason, attempt_msg, gen, now
    )

    if d.action is Action.FINISH:
        conds, event = condition_event(conds, R.SUCCEEDED, True, d.reason, attempt_msg, gen, now)
        new = _with(status, obs, conditions=conds, next_attempt_time=None, **base)
        return Plan(new, events=[event])
    if d.action is Action.FAIL:
        conds, event = condition_event(conds, R.FAILED, True, d.reason, attempt_msg, gen, now)
        new = _with(status, obs, conditions=conds, next_attempt_time=None, **base)
        return Plan(new, delete_pods=delete, events=[event])

    next_time = obs.now + timedelta(seconds=d.delay_seconds) if d.delay_seconds else None
    new = _with(
        status,
        obs,
        conditions=conds,
        attempt=status.attempt + 1,
        resume_step=None,
        next_attempt_time=rfc3339(next_time) if next_time else None,
        **base,
    )
    events = [event]
    if d.delay_seconds:
        return Plan(new, delete_pods=delete, events=events, requeue_after=float(d.delay_seconds))
    if is_held(new):  # the next attempt is recorded, and created once the hold is lifted
        return Plan(new, delete_pods=delete, events=events)
    # Due now: the pod of the next attempt is asked for in this very plan (after its status).
    return Plan(new, create_attempt=new.attempt, delete_pods=delete, events=events)


def started(
    status: TrainingRunStatus,
    obs: Observed,
    pod: Mapping[str, Any],
) -> tuple[TrainingRunStatus, Event]:
    """Status and Event after the pod of ``status.attempt`` (a gang's rank 0, once every rank's
    pod was created) was created or found."""
    name = (pod.get("metadata") or {}).get("name", "")
    resume = _resume_step(pod)
    label = attempt_label(obs, status.attempt, name)
    if resume is not None:
        reason, msg = R.RESUMED, f"{label} resumes from step {resume}"
    else:
        reason, msg = R.STARTED, f"{label} starts from scratch"
    conds, event = condition_event(
        status.conditions, R.RUNNING, True, reason, msg, obs.generation, obs.now
    )
    limit = obs.spec.checkpoint.unprotected_after_seconds
    if limit:
        # The attempt's own Protected, replacing the last attempt's verdict: what ``protect``
        # says once the trainer runs with nothing committed yet, so its start writes nothing.
        conds = [c for c in conds if c.type != R.PROTECTED]
        waiting = awaiting_message(label, limit)
        conds = set_condition(
            conds, R.PROTECTED, None, R.AWAITING_CHECKPOINT, waiting, obs.generation, obs.now
        )
    ledger = goodput.begun(status, resume, obs.now)
    new = _with(
        goodput.shown(ledger, obs.created, obs.now, finished=False),
        obs,
        active_pod=name,
        resume_step=resume,
        next_attempt_time=None,
        conditions=conds,
        reason=reason,
        message=msg,
    )
    return new, event
