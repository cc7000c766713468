"""How a gang's attempt ended, from each member's ending: the attempt is one, whatever the number
of its pods.

Rules, for an attempt of R > 1 pods (R = 1 is its pod's own ending, unchanged):

- G1 every member succeeded: the attempt succeeded. A member that succeeded waits for the others
  (ranks of one job finish together; one that finished first is not a reason to stop the rest).
- G2 a member is still saving after a disruption (``Terminating``) while another has ended: not
  ended yet. The others' ending is most often that member's doing (a collective that lost a
  rank), and resubmitting before its save is committed would resume from an older checkpoint.
- G3 a member ended otherwise than succeeding: the attempt ended, classified once by the gravest
  of the members' endings: a preemption (one member's lost node or eviction makes the others
  fail: a preemption, never a spent restart), then a corrupt checkpoint, then a permanent end,
  then a failure. The message names the member.
- G4 no member ended, but one is not scheduled ``start_timeout`` after its creation while another
  one is: the attempt ended as a failure (``GangNotScheduled``), so a partial gang never holds
  its nodes longer than that. A gang none of whose members is scheduled is queued, not failed.
- G5 otherwise not ended; the pass looks again at the earliest time a member's outcome or G4
  would change (``decide_at``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from trainingrun.decide import reasons as R
from trainingrun.decide.classify import End, Outcome
from trainingrun.decide.podview import parse_instant

# The gravest first (G3).
GRAVITY = (End.PREEMPTED, End.CHECKPOINT_BAD, End.PERMANENT, End.FAILED)


@dataclass(frozen=True)
class Member:
    """One pod of the attempt as observed: None when absent (deleted, or not created yet)."""

    name: str
    pod: Mapping[str, Any] | None
    node: Mapping[str, Any] | None = None
    node_deleted: bool = False


def _created(pod: Mapping[str, Any]) -> datetime | None:
    return parse_instant((pod.get("metadata") or {}).get("creationTimestamp"))


def _unscheduled(pod: Mapping[str, Any] | None) -> bool:
    return pod is not None and not (pod.get("spec") or {}).get("nodeName")


def _why_unscheduled(pod: Mapping[str, Any]) -> str:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") != "True":
            return str(cond.get("message") or cond.get("reason") or "")
    return ""


def _not_scheduled(
    members: Sequence[Member], start_timeout: float, now: datetime
) -> tuple[Outcome | None, datetime | None]:
    """G4: (the failure, or None; when it would be due, while members wait)."""
    if not any(m.pod is not None and not _unscheduled(m.pod) for m in members):
        return None, None  # none scheduled: queued
    due: datetime | None = None
    for m in members:
        created = _created(m.pod) if m.pod is not None and _unscheduled(m.pod) else None
        if created is None:
            continue
        deadline = created + timedelta(seconds=start_timeout)
        if now >= deadline:
            why = _why_unscheduled(m.pod or {})
            message = (
                f"{m.name} not scheduled {int(start_timeout)}s after its creation while other "
                f"pods of the attempt run" + (f": {why}" if why else "")
            )
            return Outcome(End.FAILED, R.GANG_NOT_SCHEDULED, message), None
        due = deadline if due is None else min(due, deadline)
    return None, due


def gang_outcome(
    members: Sequence[Member],
    outcomes: Sequence[Outcome],
    *,
    start_timeout: float,
    now: datetime,
) -> Outcome:
    """The attempt's ending from its members' (same order); rules G1-G5 of the module."""
    if len(outcomes) == 1:
        return outcomes[0]
    named = list(zip(members, outcomes, strict=True))
    if all(o.end is End.SUCCEEDED for o in outcomes):
        return Outcome(End.SUCCEEDED, R.SUCCEEDED, f"all {len(outcomes)} pods succeeded")  # G1
    ended = [(m, o) for m, o in named if o.ended and o.end is not End.SUCCEEDED]
    saving = [(m, o) for m, o in named if not o.ended and o.reason == R.TERMINATING]
    if ended and saving:  # G2
        m, o = saving[0]
        return Outcome(End.NOT_ENDED, R.TERMINATING, f"{m.name}: {o.message}")
    if ended:  # G3
        m, o = min(ended, key=lambda mo: GRAVITY.index(mo[1].end))
        return Outcome(o.end, o.reason, f"{m.name}: {o.message}")
    failed, due = _not_scheduled(members, start_timeout, now)
    if failed is not None:  # G4
        return failed
    waiting = [(m, o) for m, o in named if o.decide_at is not None]  # G5
    if waiting:
        m, o = min(waiting, key=lambda mo: mo[1].decide_at or now)
        if due is None or (o.decide_at is not None and o.decide_at <= due):
            return Outcome(End.NOT_ENDED, o.reason, f"{m.name}: {o.message}", o.decide_at)
    if due is not None:
        pending = sum(1 for m in members if _unscheduled(m.pod))
        message = f"{pending} of {len(members)} pods not scheduled yet"
        return Outcome(End.NOT_ENDED, R.GANG_SCHEDULING, message, decide_at=due)
    return next((o for o in outcomes if not o.ended), outcomes[0])
