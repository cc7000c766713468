"""What to do after an attempt ended: resubmit (now or after a backoff), finish, or fail.

Budgets: preemptions spend ``maxPreemptions`` and never the failure budget; failures spend
``maxRestarts``; ``crashLoopLimit`` failures in a row without a new committed checkpoint end the
run as a crash loop; a corrupt checkpoint spends neither and is recorded as bad; a pause
(``spec.suspend``) spends nothing. An eviction by Kueue is a preemption.

Pace: no class of ending may make pods in a hot loop. Every ending (preempted, checkpoint-bad or
failed) that brought no new committed checkpoint since its attempt started adds one to the
``stalled`` streak; one that did resets it. After a preemption or a bad checkpoint the next
attempt waits ``backoff_seconds(stalled - 1)``: at once after progress and for the first such
ending in a row (a spot reclaim before the first save), then 10 s, 20 s, 40 s... with the
default backoff. After a failure it waits ``backoff_seconds`` of the longer of the stalled and
crash-loop streaks, at least the first step, as before. A bad checkpoint is never progress (its
attempt never trained). The streak paces, it spends no budget; a pause neither grows nor resets
it and never waits. (An eviction by Kueue counts as a preemption here too: its reason,
``Evicted``, is also the kubelet's for a node-pressure eviction, which can repeat fast.)

A restore that found the node's disk short for the checkpoint (``NodeDiskFull``: it would fit
``spec.checkpoint.sizeLimit``, or there is none) is a failure: another node, or this one after
the backoff, may have room, and ``maxRestarts`` bounds the tries where none ever has (a
preemption's budget is unlimited by default). One larger than the size limit ends the run.

A checkpoint-bad ending with nothing to fall back from (the attempt resumed from no checkpoint,
so the operator added no restore to refuse one) cannot mark anything bad and would only retry
the same start: it counts as a failure of the attempt (maxRestarts, the crash-loop streak, the
backoff).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
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
    consecutive_failures: int = 0  # the crash-loop streak: failures only
    bad_checkpoints: tuple[int, ...] = ()
    # Endings in a row, whatever their class, with no new committed checkpoint: the backoff
    # streak (module docstring).
    stalled: int = 0


@dataclass(frozen=True)
class Decision:
    action: Action
    counters: Counters
    reason: str
    message: str
    delay_seconds: int = 0


def backoff_seconds(policy: RestartPolicySpec, streak: int) -> int:
    """Wait before the next attempt after ``streak`` endings in a row without progress (0: none,
    no wait)."""
    if streak <= 0:
        return 0
    b = policy.backoff
    delay = b.initial_seconds * b.factor ** (streak - 1)
    return int(min(delay, b.max_seconds))


def progressed(counters: Counters, resume_step: int | None, latest_step: int | None) -> bool:
    """The attempt made progress: the newest committed checkpoint is newer than the one it
    started from (or exists, for a fresh start), and did not fail verification (it cannot be
    resumed from)."""
    return (
        latest_step is not None
        and latest_step not in counters.bad_checkpoints
        and (resume_step is None or latest_step > resume_step)
    )


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
    ``latest_step`` is the newest committed step now. An ending with no newer checkpoint than
    the attempt started from continues the stalled streak (a failure, the crash-loop one too).
    """
    if outcome.end is End.SUCCEEDED:
        return Decision(Action.FINISH, counters, R.SUCCEEDED, outcome.message)
    if outcome.end is End.PERMANENT:
        return Decision(Action.FAIL, counters, outcome.reason, outcome.message)
    if outcome.end is End.PAUSED:
        return Decision(Action.RESUBMIT, counters, R.PAUSED, outcome.message)
    moved = progressed(counters, resume_step, latest_step)
    if outcome.end is End.CHECKPOINT_BAD:
        return _checkpoint_bad(outcome, counters, policy, resume_step, moved)
    if outcome.end is End.PREEMPTED:
        return _preempted(outcome, counters, policy, moved)
    if outcome.end is End.FAILED:
        return _failed(outcome, counters, policy, moved)
    raise ValueError(f"decide() needs an ended attempt, got {outcome.end}")


def _checkpoint_bad(
    outcome: Outcome,
    counters: Counters,
    policy: RestartPolicySpec,
    resume_step: int | None,
    moved: bool,
) -> Decision:
    """The restore refused the checkpoint: record it as bad and resume from the one before,
    spending no budget; a bad checkpoint is no progress, so one after other endings without
    progress waits. With no checkpoint to mark (a fresh start), a failure."""
    if resume_step is None:
        failure = Outcome(
            End.FAILED,
            R.INIT_FAILED,
            "the restore reported a bad checkpoint, but the attempt resumed from none; "
            f"counted as a failure: {outcome.message}",
        )
        return _failed(failure, counters, policy, moved)
    bad = counters.bad_checkpoints
    if resume_step not in bad:
        bad = (*bad, resume_step)
    stalled = counters.stalled + 1
    return Decision(
        Action.RESUBMIT,
        replace(counters, bad_checkpoints=bad, stalled=stalled),
        R.CHECKPOINT_BAD,
        f"checkpoint {resume_step} failed verification; falling back: {outcome.message}",
        delay_seconds=backoff_seconds(policy, stalled - 1),
    )


def _preempted(
    outcome: Outcome, counters: Counters, policy: RestartPolicySpec, moved: bool
) -> Decision:
    """A preemption spends ``maxPreemptions`` (unlimited by default), never the restarts. The
    next attempt starts at once after progress or the first time in a row without, else after
    the backoff."""
    preemptions = counters.preemptions + 1
    stalled = 0 if moved else counters.stalled + 1
    new = replace(counters, preemptions=preemptions, stalled=stalled)
    limit = policy.max_preemptions
    if limit is not None and preemptions > limit:
        return Decision(
            Action.FAIL,
            new,
            R.PREEMPTIONS_EXHAUSTED,
            f"preempted {preemptions} times, more than maxPreemptions={limit}",
        )
    return Decision(
        Action.RESUBMIT,
        new,
        R.PREEMPTED,
        f"{outcome.reason}: {outcome.message}",
        delay_seconds=backoff_seconds(policy, stalled - 1),
    )


def _failed(
    outcome: Outcome, counters: Counters, policy: RestartPolicySpec, moved: bool
) -> Decision:
    """A failure spends ``maxRestarts``; without progress it continues the crash-loop streak
    (and the stalled one), and the next attempt waits out the backoff of the longer one."""
    restarts = counters.restarts + 1
    streak = 0 if moved else counters.consecutive_failures + 1
    stalled = 0 if moved else counters.stalled + 1
    new = replace(counters, restarts=restarts, consecutive_failures=streak, stalled=stalled)
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
        delay_seconds=backoff_seconds(policy, max(streak, stalled, 1)),
    )
