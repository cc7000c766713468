"""Pauses and queues: a run held by ``spec.suspend``, or waiting for Kueue to admit its Workload,
has no pod.

Two conditions record a hold: ``Suspended`` (True while ``spec.suspend`` is true) and
``Admitted`` (for a run with a queue: False while Kueue has not admitted it, or evicted it).

A hold that begins while an attempt runs stops it the way a preemption notice does: every pod of
the attempt gets the notice annotation (the sync sidecar asks the trainer to save at the next
step end; the trainer exits after that save and the sidecar commits it and exits) and the stop
annotation, which records why. The attempt then ends as a pause: for ``spec.suspend`` it spends
nothing (``End.PAUSED``), an eviction by Kueue is a preemption. Pods still running once the
grace period (``spec.preemption.terminationGracePeriodSeconds``) has passed since the hold began
are deleted in the pass that records the end (SIGTERM: the trainer's last chance to save). The
next attempt is recorded then but created only when the hold is lifted, from the newest
committed checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from trainingrun.api import Condition, TrainingRunSpec, TrainingRunStatus
from trainingrun.contract import ANNOTATION_NOTICE, ANNOTATION_STOP, STOP_EVICTED, STOP_SUSPEND
from trainingrun.decide import reasons as R
from trainingrun.decide.classify import End, Outcome
from trainingrun.decide.gang import Member
from trainingrun.decide.podview import parse_instant
from trainingrun.decide.status import Event, condition, condition_event, is_false, set_condition

NOTICE_SUSPEND = "spec.suspend is true"
NOTICE_EVICTED = "evicted by Kueue"


@dataclass(frozen=True)
class Queue:
    """The run's admission by Kueue, as the reconciler read it from the run's Workload."""

    admitted: bool
    reason: str  # R.ADMITTED_BY_KUEUE, R.QUEUED, R.EVICTED, R.KUEUE_NOT_INSTALLED, ...
    message: str


def mark(
    status: TrainingRunStatus,
    spec: TrainingRunSpec,
    queue: Queue | None,
    generation: int,
    now: datetime,
) -> tuple[list[Condition], list[Event]]:
    """The ``Suspended`` and ``Admitted`` conditions for ``spec.suspend`` and ``queue`` (None:
    the run names no queue), and an Event for each change a user should hear of: a suspension
    and its end, and each new admission state (its message alone may change silently: Kueue
    rewords why a Workload waits as other workloads come and go)."""
    conds, events = list(status.conditions), []
    was = condition(status, R.SUSPENDED)
    if spec.suspend != (was is not None and was.status == "True"):
        reason, msg = (
            (R.SUSPEND_REQUESTED, f"{NOTICE_SUSPEND}: the attempt saves at its next step end")
            if spec.suspend
            else (R.SUSPEND_LIFTED, "spec.suspend is false: resumes from the newest checkpoint")
        )
        conds, ev = condition_event(conds, R.SUSPENDED, spec.suspend, reason, msg, generation, now)
        events.append(ev)
    old = condition(status, R.ADMITTED)
    if queue is None:
        return [c for c in conds if c.type != R.ADMITTED], events
    value = "True" if queue.admitted else "False"
    if old is None or old.status != value or old.reason != queue.reason:
        conds, ev = condition_event(
            conds, R.ADMITTED, queue.admitted, queue.reason, queue.message, generation, now
        )
        events.append(ev)
    elif old.message != queue.message:
        conds = set_condition(
            conds, R.ADMITTED, queue.admitted, queue.reason, queue.message, generation, now
        )
    return conds, events


def held_by(status: TrainingRunStatus) -> str | None:
    """Why the run may not have pods now: STOP_EVICTED (Kueue has not admitted it),
    STOP_SUSPEND (``spec.suspend``), or None."""
    if is_false(status, R.ADMITTED):
        return STOP_EVICTED
    c = condition(status, R.SUSPENDED)
    return STOP_SUSPEND if c is not None and c.status == "True" else None


def stopped(gang: Sequence[Member], outcome: Outcome) -> Outcome:
    """The ending of an attempt the operator asked to stop for a hold (its pods carry the stop
    annotation) is that hold's, not a failure or a node's preemption: a pause for
    ``spec.suspend``, an eviction for Kueue. Other endings (success, a refused checkpoint, a
    permanent error) stand."""
    if outcome.end not in (End.PREEMPTED, End.FAILED):
        return outcome
    why = next((w for m in gang if (w := _stop_of(m)) is not None), None)
    return _hold_outcome(why) if why else outcome


def _stop_of(m: Member) -> str | None:
    annotations = ((m.pod or {}).get("metadata") or {}).get("annotations") or {}
    why = annotations.get(ANNOTATION_STOP)
    return why if why in (STOP_SUSPEND, STOP_EVICTED) else None


def for_hold(outcome: Outcome) -> bool:
    """The ending is a hold's (``stopped``, ``stopping``, ``end_now``)."""
    return outcome.reason in (R.PAUSED, R.EVICTED)


def end_now(status: TrainingRunStatus) -> Outcome:
    """The ending of an attempt a hold stops before any pod of it ran."""
    return _hold_outcome(held_by(status) or STOP_SUSPEND)


def _hold_outcome(why: str, late: bool = False) -> Outcome:
    after = "; its pods did not stop within the grace period and are deleted" if late else ""
    if why == STOP_EVICTED:
        return Outcome(End.PREEMPTED, R.EVICTED, f"stopped: {NOTICE_EVICTED}{after}")
    return Outcome(End.PAUSED, R.PAUSED, f"stopped: {NOTICE_SUSPEND}{after}")


@dataclass(frozen=True)
class Stopping:
    """What a pass does to a running attempt of a held run."""

    ask: tuple[str, ...] = ()  # pods to annotate with ``annotations``
    annotations: dict[str, str] = field(default_factory=dict)
    overdue: Outcome | None = None  # end the attempt now, deleting its pods
    recheck_after: float | None = None  # seconds until the deadline


def stopping(
    status: TrainingRunStatus, spec: TrainingRunSpec, gang: Sequence[Member], now: datetime
) -> Stopping:
    """Asks every live pod of the attempt to save and stop (once), until the grace period since
    the hold began has passed; a gang none of whose pods runs yet has nothing to save and ends
    at once."""
    why = held_by(status) or STOP_SUSPEND
    c = condition(status, R.ADMITTED if why == STOP_EVICTED else R.SUSPENDED)
    since = (parse_instant(c.last_transition_time) if c else None) or now
    deadline = since + timedelta(seconds=spec.preemption.termination_grace_period_seconds)
    live = [m for m in gang if m.pod is not None and _phase(m) not in ("Succeeded", "Failed")]
    if now >= deadline or not any(_phase(m) == "Running" for m in live):
        return Stopping(overdue=_hold_outcome(why, late=now >= deadline))
    notice = NOTICE_EVICTED if why == STOP_EVICTED else NOTICE_SUSPEND
    ask = tuple(m.name for m in live if _stop_of(m) is None)
    return Stopping(
        ask=ask,
        annotations={ANNOTATION_NOTICE: notice, ANNOTATION_STOP: why},
        recheck_after=(deadline - now).total_seconds() + 1.0,
    )


def _phase(m: Member) -> str | None:
    phase = ((m.pod or {}).get("status") or {}).get("phase")
    return str(phase) if phase else None
