"""What to do after an attempt ended: resubmit (now or after a backoff), finish, or fail.

Preemptions spend ``maxPreemptions`` and never the failure budget; failures spend
``maxRestarts``; ``crashLoopLimit`` failures in a row without a new committed checkpoint end the
run as a crash loop; a corrupt checkpoint spends neither and is recorded as bad; a pause
(``spec.suspend``) spends nothing. An eviction by Kueue is a preemption.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from trainingrun.api import RestartPolicySpec
from trainingrun.decide import reasons as R
from trainingrun.decide.classify import End, Outcome


class Action(Enum):
    RESUBMIT = "Resubmit"
    FINISH = "Finish"
    FAIL = "Fail"


@dataclass(frozen=True)
class Counters:
    restarts: int = 0
    preemptions: int = 0
    consecutive_failures: int = 0
    bad_checkpoints: tuple[int, ...] = ()


@dataclass(frozen=True)
class Decision:
    action: Action
    counters: Counters
    reason: str
    message: str
    delay_seconds: int = 0


def backoff_seconds(policy: RestartPolicySpec, consecutive_failures: int) -> int:
    """Wait before the next attempt after ``consecutive_failures`` failures in a row (>= 1)."""
    if consecutive_failures <= 0:
        return 0
    b = policy.backoff
    delay = b.initial_seconds * b.factor ** (consecutive_failures - 1)
    return int(min(delay, b.max_seconds))


def decide(
    outcome: Outcome,
    counters: Counters,
    policy: RestartPolicySpec,
    *,
    resume_step: int | None,
    latest_step: int | None,
) -> Decision:
    """The next step after ``outcome``.

    ``resume_step`` is the checkpoint step the ended attempt started from (None: fresh start);
    ``latest_step`` is the newest committed step now. A failure with no newer checkpoint than
    the attempt started from continues a crash-loop streak.
    """
    if outcome.end is End.SUCCEEDED:
        return Decision(Action.FINISH, counters, R.SUCCEEDED, outcome.message)
    if outcome.end is End.PERMANENT:
        return Decision(Action.FAIL, counters, outcome.reason, outcome.message)
    if outcome.end is End.PAUSED:
        return Decision(Action.RESUBMIT, counters, R.PAUSED, outcome.message)
    if outcome.end is End.CHECKPOINT_BAD:
        return _checkpoint_bad(outcome, counters, resume_step)
    if outcome.end is End.PREEMPTED:
        return _preempted(outcome, counters, policy)
    if outcome.end is End.FAILED:
        return _failed(outcome, counters, policy, resume_step, latest_step)
    raise ValueError(f"decide() needs an ended attempt, got {outcome.end}")


def _checkpoint_bad(outcome: Outcome, counters: Counters, resume_step: int | None) -> Decision:
    """The restore refused the checkpoint: record it as bad and resume from the one before,
    spending no budget."""
    bad = counters.bad_checkpoints
    if resume_step is not None and resume_step not in bad:
        bad = (*bad, resume_step)
    return Decision(
        Action.RESUBMIT,
        Counters(counters.restarts, counters.preemptions, counters.consecutive_failures, bad),
        R.CHECKPOINT_BAD,
        f"checkpoint {resume_step} failed verification; falling back: {outcome.message}",
    )


def _preempted(outcome: Outcome, counters: Counters, policy: RestartPolicySpec) -> Decision:
    """A preemption spends ``maxPreemptions`` (unlimited by default), never the restarts."""
    preemptions = counters.preemptions + 1
    new = Counters(
        counters.restarts, preemptions, counters.consecutive_failures, counters.bad_checkpoints
    )
    limit = policy.max_preemptions
    if limit is not None and preemptions > limit:
        return Decision(
            Action.FAIL,
            new,
            R.PREEMPTIONS_EXHAUSTED,
            f"preempted {preemptions} times, more than maxPreemptions={limit}",
        )
    return Decision(Action.RESUBMIT, new, R.PREEMPTED, f"{outcome.reason}: {outcome.message}")


def _failed(
    outcome: Outcome,
    counters: Counters,
    policy: RestartPolicySpec,
    resume_step: int | None,
    latest_step: int | None,
) -> Decision:
    """A failure spends ``maxRestarts``; without progress it continues a crash-loop streak,
    and the next attempt waits out the backoff."""
    restarts = counters.restarts + 1
    # Progress: a checkpoint newer than the one the attempt started from, and not one that
    # failed verification (it cannot be resumed from, so it does not end a crash loop).
    progressed = (
        latest_step is not None
        and latest_step not in counters.bad_checkpoints
        and (resume_step is None or latest_step > resume_step)
    )
    streak = 0 if progressed else counters.consecutive_failures + 1
    new = Counters(restarts, counters.preemptions, streak, counters.bad_checkpoints)
    if restarts > policy.max_restarts:
        return Decision(
            Action.FAIL,
            new,
            R.RESTARTS_EXHAUSTED,
            f"failed {restarts} times, more than maxRestarts={policy.max_restarts}; "
            f"last: {outcome.message}",
        )
    if streak >= policy.crash_loop_limit:
        return Decision(
            Action.FAIL,
            new,
            R.CRASH_LOOP,
            f"{streak} failures in a row with no new checkpoint; last: {outcome.message}",
        )
    return Decision(
        Action.RESUBMIT,
        new,
        R.FAILED_ATTEMPT,
        f"{outcome.reason}: {outcome.message}",
        delay_seconds=backoff_seconds(policy, max(streak, 1)),
    )
