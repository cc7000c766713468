"""The running attempt's ``Protected`` condition in a pass: the verdict of
``decide.protection`` set in the status, the ``Unprotected`` Warning once per attempt, and
whether a pass is about to give it (the reconciler then reads the bucket manifest before it
plans, so a checkpoint committed since its last read is not missed).
"""

from __future__ import annotations

from dataclasses import replace

from trainingrun.api import Condition, TrainingRunStatus
from trainingrun.decide import reasons as R
from trainingrun.decide.naming import pod_name
from trainingrun.decide.observed import Observed, Plan, attempt_label, newer, sooner
from trainingrun.decide.podview import parse_instant
from trainingrun.decide.protection import Verdict, judge
from trainingrun.decide.status import Event, is_finished, is_held, set_condition


def protect(p: Plan, obs: Observed, current: str) -> Plan:
    """The ``Protected`` condition of the running attempt (``decide.protection``). Its flip to
    False is the Warning ``Unprotected``, once per attempt: a condition set before this
    attempt's trainer started speaks of an earlier attempt and is replaced, not continued, so
    its time moves and the next attempt warns again. A flip back to True is a Normal
    ``CheckpointCommitted``. The pass comes back at the deadline, which a quiet run would
    otherwise pass without a look."""
    conds = p.status.conditions
    if not obs.spec.checkpoint.unprotected_after_seconds:
        if any(c.type == R.PROTECTED for c in conds):  # the warning was turned off
            kept = [c for c in conds if c.type != R.PROTECTED]
            return replace(p, status=p.status.model_copy(update={"conditions": kept}))
        return p
    judged = verdict_of(p.status, obs, current)
    if judged is None:
        return p
    v, conds, old = judged
    # Never before the trainer's start (the operator's clock may lag the node's): else the
    # condition would look older than the attempt on the next pass.
    at = max(obs.now, v.since)
    conds = set_condition(conds, R.PROTECTED, v.protected, v.reason, v.message, obs.generation, at)
    was = old.status if old else None
    events = list(p.events)
    if (v.protected is False and was != "False") or (v.protected is True and was == "False"):
        events.append(Event(R.event_type(v.reason), v.reason, v.message))
    requeue = sooner(p.requeue_after, v.recheck_after)
    status = p.status.model_copy(update={"conditions": conds})
    return replace(p, status=status, events=events, requeue_after=requeue)


def verdict_of(
    status: TrainingRunStatus, obs: Observed, current: str
) -> tuple[Verdict, list[Condition], Condition | None] | None:
    """The protection verdict of the running attempt, the conditions to set it in, and the
    ``Protected`` condition it follows (None: none, or one of an earlier attempt, replaced)."""
    label = attempt_label(obs, status.attempt, current)
    v = judge(obs.pod, status.latest_checkpoint, obs.spec.checkpoint, label, obs.now)
    if v is None:
        return None
    conds = list(status.conditions)
    old = next((c for c in conds if c.type == R.PROTECTED), None)
    old_time = parse_instant(old.last_transition_time) if old else None
    # The Unknown that started() set for this very attempt (its label is in the message) is
    # this attempt's, though set before its trainer started: kept, not replaced.
    own = old is not None and (old.status, old.reason, old.message) == (
        "Unknown",
        v.reason,
        v.message,
    )
    if old is not None and not own and (old_time is None or old_time < v.since):
        conds, old = [c for c in conds if c.type != R.PROTECTED], None
    return v, conds, old


def warns_unprotected(obs: Observed) -> bool:
    """Whether a pass of ``obs`` is about to warn that the running attempt is unprotected (its
    ``Protected`` condition flips to False), judged on the checkpoint the status records: the
    reconciler then reads the bucket manifest before it plans, so a checkpoint committed since
    its last read is not missed. Needs no plan: the pass plans once, after that read."""
    status = obs.status
    if status.attempt == 0 or is_finished(status) or is_held(status):
        return False
    if not obs.spec.checkpoint.unprotected_after_seconds:
        return False
    latest = newer(obs.latest, status.latest_checkpoint)
    status = status.model_copy(update={"latest_checkpoint": latest})
    judged = verdict_of(status, obs, pod_name(obs.name, status.attempt, 0, obs.spec.replicas))
    if judged is None:
        return False
    v, _, old = judged
    return v.protected is False and (old.status if old else None) != "False"
