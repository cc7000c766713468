"""The words of a run's status: its conditions, the Events that report their changes, and the
display phase derived from them. Shared by the pass (``decide.reconcile``) and the pauses
(``decide.hold``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trainingrun.api import Condition, TrainingRunStatus
from trainingrun.contract import rfc3339
from trainingrun.decide import reasons as R

# The display phases, derived from the conditions (R.RUNNING, R.SUCCEEDED, R.FAILED, and
# R.SUSPENDED and R.ADMITTED for a paused or queued run).
PHASE_PENDING = "Pending"
PHASE_RUNNING = "Running"
PHASE_BACKOFF = "Backoff"
PHASE_SUCCEEDED = "Succeeded"
PHASE_FAILED = "Failed"
PHASE_SUSPENDING = "Suspending"  # held while its attempt still runs: saving, then stopping
PHASE_SUSPENDED = "Suspended"  # held by spec.suspend, no pod
PHASE_QUEUED = "Queued"  # waiting for Kueue to admit it, no pod


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


def set_condition(
    conditions: list[Condition],
    ctype: str,
    status: bool | None,
    reason: str,
    message: str,
    generation: int,
    now: datetime,
) -> list[Condition]:
    """Sets one condition (``status`` None: Unknown); ``lastTransitionTime`` changes only when
    the status flips."""
    value = "Unknown" if status is None else "True" if status else "False"
    old = next((c for c in conditions if c.type == ctype), None)
    since = old.last_transition_time if old and old.status == value else rfc3339(now)
    new = Condition(
        type=ctype,
        status=value,
        reason=reason,
        message=message,
        observed_generation=generation,
        last_transition_time=since,
    )
    return [*(c for c in conditions if c.type != ctype), new]


def condition_event(
    conditions: list[Condition],
    ctype: str,
    status: bool,
    reason: str,
    message: str,
    generation: int,
    now: datetime,
) -> tuple[list[Condition], Event]:
    """Sets one condition and derives the Event that reports it: the same reason and message,
    Normal or Warning by the reason. Every transition a user sees goes through here."""
    conds = set_condition(conditions, ctype, status, reason, message, generation, now)
    return conds, Event(R.event_type(reason), reason, message)


def condition(status: TrainingRunStatus, ctype: str) -> Condition | None:
    return next((c for c in status.conditions if c.type == ctype), None)


def is_true(status: TrainingRunStatus, ctype: str) -> bool:
    c = condition(status, ctype)
    return c is not None and c.status == "True"


def is_false(status: TrainingRunStatus, ctype: str) -> bool:
    c = condition(status, ctype)
    return c is not None and c.status == "False"


def is_finished(status: TrainingRunStatus) -> bool:
    return is_true(status, R.SUCCEEDED) or is_true(status, R.FAILED)


def is_held(status: TrainingRunStatus) -> bool:
    """Paused by ``spec.suspend`` or not admitted by Kueue, as the status last recorded."""
    return is_true(status, R.SUSPENDED) or is_false(status, R.ADMITTED)


def phase_of(status: TrainingRunStatus) -> str:
    """The display phase, derived from the conditions."""
    if is_true(status, R.FAILED):
        return PHASE_FAILED
    if is_true(status, R.SUCCEEDED):
        return PHASE_SUCCEEDED
    if is_true(status, R.RUNNING):
        return PHASE_SUSPENDING if is_held(status) else PHASE_RUNNING
    if is_true(status, R.SUSPENDED):
        return PHASE_SUSPENDED
    if is_false(status, R.ADMITTED):
        return PHASE_QUEUED
    if status.next_attempt_time:
        return PHASE_BACKOFF
    return PHASE_PENDING


def with_status(status: TrainingRunStatus, generation: int, **changes: Any) -> TrainingRunStatus:
    """``status`` with ``changes``, observed at ``generation``, and its phase derived again."""
    new = status.model_copy(update={"observed_generation": generation, **changes})
    return new.model_copy(update={"phase": phase_of(new)})


def fail(
    status: TrainingRunStatus, generation: int, reason: str, message: str, now: datetime
) -> tuple[TrainingRunStatus, Event]:
    """A run that cannot go on (R.INVALID_SPEC, R.MISSING_SECRET): failed at once. The reason
    is the same in status.reason, the Failed condition and the Event."""
    conds, event = condition_event(
        status.conditions, R.FAILED, True, reason, message, generation, now
    )
    new = status.model_copy(
        update={
            "observed_generation": generation,
            "conditions": conds,
            "reason": reason,
            "message": message,
        }
    )
    return new.model_copy(update={"phase": phase_of(new)}), event
