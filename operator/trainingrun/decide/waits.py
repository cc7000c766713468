"""Why a run waits before its next attempt can start, in its status: the ``Waiting`` condition.

An attempt's start can be held back by something outside the spec: the credentials Secret is
missing, the bucket cannot be read, the pod's name is another object's, the API server refuses
the pod. The pass then retries later; until the start succeeds, ``Waiting`` is True with the
reason and message of the newest hold (also ``status.reason`` and ``status.message``, which
``kubectl get trainingruns -o wide`` shows), and an Event says it once per reason. The start
sets it False again.

A missing Secret is waited out for ``secret_wait_seconds`` (a rotation tool may delete and
re-create it): retried sooner at first and less often as the wait grows, then the run fails
with MissingSecret.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from trainingrun.api import TrainingRunStatus
from trainingrun.contract import parse_time
from trainingrun.decide import reasons as R
from trainingrun.decide.status import Event, condition, set_condition, with_status

# The pauses between two tries of a start held back: the first tries come soon (a Secret being
# re-created, an old pod going), and a wait of an hour is still tried once a minute, so the run
# goes on soon after the cause is fixed.
MIN_RETRY_SECONDS = 2.0
MAX_RETRY_SECONDS = 60.0


@dataclass(frozen=True)
class Wait:
    status: TrainingRunStatus
    event: Event | None  # said when the reason is new, not at every retry
    retry_after: float


def waited_seconds(status: TrainingRunStatus, reason: str, now: datetime) -> float:
    """How long the run has been waiting for ``reason`` (0 when it is not)."""
    c = condition(status, R.WAITING)
    since = parse_time(c.last_transition_time) if c is not None else None
    if c is None or c.status != "True" or c.reason != reason or since is None:
        return 0.0
    return max(0.0, (now - since).total_seconds())


def retry_seconds(waited: float) -> float:
    """A quarter of the time waited so far, from 2 s up to a minute: the tries thin out as a
    wait grows (a quarter: each try comes 25% later than the last)."""
    return max(MIN_RETRY_SECONDS, min(MAX_RETRY_SECONDS, waited / 4))


def wait(
    status: TrainingRunStatus,
    generation: int,
    reason: str,
    message: str,
    now: datetime,
) -> Wait:
    """The status of a run whose next attempt's start is held back by ``reason``."""
    old = condition(status, R.WAITING)
    same = old is not None and old.status == "True" and old.reason == reason
    waited = waited_seconds(status, reason, now)
    # A new reason starts a new wait: the time waited is the time waited for this one.
    conds = [c for c in status.conditions if same or c.type != R.WAITING]
    conds = set_condition(conds, R.WAITING, True, reason, message, generation, now)
    new = with_status(status, generation, conditions=conds, reason=reason, message=message)
    event = None if same else Event(R.event_type(reason), reason, message)
    return Wait(new, event, retry_seconds(waited))


def wait_over(status: TrainingRunStatus, generation: int, now: datetime) -> TrainingRunStatus:
    """``status`` with ``Waiting`` False once the start went through (unchanged if it never
    waited)."""
    old = condition(status, R.WAITING)
    if old is None or old.status != "True":
        return status
    message = f"the attempt started after waiting: {old.message}"
    conds = set_condition(
        status.conditions, R.WAITING, False, R.WAIT_OVER, message, generation, now
    )
    return status.model_copy(update={"conditions": conds})


def secret_wait(
    status: TrainingRunStatus,
    generation: int,
    message: str,
    now: datetime,
    limit_seconds: float,
) -> Wait | None:
    """The wait for a missing credentials Secret; None once it lasted ``limit_seconds``: the
    run then fails with MissingSecret."""
    if waited_seconds(status, R.MISSING_SECRET, now) >= limit_seconds:
        return None
    told = f"{message}; retrying for up to {limit_seconds:.0f} s before the run fails"
    return wait(status, generation, R.MISSING_SECRET, told, now)
