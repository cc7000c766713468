"""decide() and backoff_seconds(): what follows an ended attempt.

Covers:

- success finishes and a permanent error fails at once, spending nothing;
- maxRestarts: failures within the budget resubmit, the one past it fails with
  RestartBudgetExhausted (parametrized over budgets, including 0);
- maxPreemptions: None is unlimited, a limit fails with PreemptionBudgetExhausted past it;
- preemptions never spend restarts and never touch the crash-loop streak; the first one in a
  row without progress, and any after progress, resubmit at once (whatever streak came before);
- crash loop: crashLoopLimit failures in a row with no checkpoint newer than the one the attempt
  resumed from end the run; a newer checkpoint resets the streak, and a failure that committed
  one does not count toward the limit;
- backoff: exponential growth by ``factor`` from ``initialSeconds``, capped at ``maxSeconds``
  (parametrized), and the delay decide() asks for follows it;
- a bad checkpoint records the step the attempt resumed from (once) and spends nothing; one
  with nothing to fall back from (a fresh start) is a failure: it backs off and ends as a crash
  loop instead of resubmitting at once forever;
- pace: repeated endings without progress back off whatever their class (preemptions, bad
  checkpoints, failures, mixed, evictions by the kubelet or Kueue), by the stalled streak;
  progress resets it; a pause neither grows nor resets it and never waits;
- decide() refuses an attempt that has not ended.
"""

from __future__ import annotations

import pytest

from tests.unit.builders import restart_policy
from trainingrun.api import RestartPolicySpec
from trainingrun.decide.classify import End, Outcome
from trainingrun.decide.policy import (
    Action,
    Counters,
    Decision,
    backoff_seconds,
    decide,
)
from trainingrun.decide.reasons import CRASH_LOOP as REASON_CRASH_LOOP
from trainingrun.decide.reasons import EVICTED as REASON_EVICTED
from trainingrun.decide.reasons import FAILED_ATTEMPT as REASON_FAILED_ATTEMPT
from trainingrun.decide.reasons import PAUSED as REASON_PAUSED
from trainingrun.decide.reasons import PREEMPTIONS_EXHAUSTED as REASON_PREEMPTIONS_EXHAUSTED
from trainingrun.decide.reasons import RESTARTS_EXHAUSTED as REASON_RESTARTS_EXHAUSTED

SUCCEEDED = Outcome(End.SUCCEEDED, "Succeeded", "the trainer exited 0")
FAILED = Outcome(End.FAILED, "Error", "the trainer exited 1")
OOM = Outcome(End.FAILED, "OOMKilled", "the trainer ran out of memory (exit 137)")
PREEMPTED = Outcome(End.PREEMPTED, "PreemptionByScheduler", "preempted by a higher priority pod")
CHECKPOINT_BAD = Outcome(End.CHECKPOINT_BAD, "CheckpointBad", "model.safetensors: size 0")
PERMANENT = Outcome(End.PERMANENT, "ErrImagePull", "container trainer: not found")
EVICTED = Outcome(End.PREEMPTED, REASON_EVICTED, "The node was low on resource: ephemeral-storage")
PAUSED = Outcome(End.PAUSED, REASON_PAUSED, "stopped: spec.suspend is true")
NOT_ENDED = Outcome(End.NOT_ENDED, "Running", "")

# Progress: the attempt resumed from 100 and the bucket now has 200.
PROGRESS = {"resume_step": 100, "latest_step": 200}
# No progress: the attempt resumed from 100 and 100 is still the newest checkpoint.
NO_PROGRESS = {"resume_step": 100, "latest_step": 100}


def test_success_finishes_and_spends_nothing() -> None:
    counters = Counters(restarts=2, preemptions=5, consecutive_failures=1)

    d = decide(SUCCEEDED, counters, restart_policy(), **NO_PROGRESS)

    assert d.action is Action.FINISH
    assert d.counters == counters
    assert d.reason == "Succeeded"


def test_permanent_error_fails_at_once_with_its_reason() -> None:
    counters = Counters()

    d = decide(PERMANENT, counters, restart_policy(max_restarts=100), **PROGRESS)

    assert d.action is Action.FAIL
    assert d.counters == counters
    assert (d.reason, d.message) == ("ErrImagePull", "container trainer: not found")


# -- maxRestarts --------------------------------------------------------------------------


@pytest.mark.parametrize("max_restarts", [0, 1, 3, 10], ids=lambda n: f"max-restarts-{n}")
def test_failure_within_the_restart_budget_resubmits(max_restarts: int) -> None:
    policy = restart_policy(max_restarts=max_restarts, crash_loop_limit=1000)
    counters = Counters()
    decisions = []
    for _ in range(max_restarts):
        d = decide(FAILED, counters, policy, **PROGRESS)
        decisions.append(d.action)
        counters = d.counters

    assert decisions == [Action.RESUBMIT] * max_restarts
    assert counters.restarts == max_restarts


@pytest.mark.parametrize("max_restarts", [0, 1, 3, 10], ids=lambda n: f"max-restarts-{n}")
def test_failure_past_the_restart_budget_fails_the_run(max_restarts: int) -> None:
    policy = restart_policy(max_restarts=max_restarts, crash_loop_limit=1000)

    d = decide(OOM, Counters(restarts=max_restarts), policy, **PROGRESS)

    assert d.action is Action.FAIL
    assert d.reason == REASON_RESTARTS_EXHAUSTED
    assert d.counters.restarts == max_restarts + 1
    assert f"maxRestarts={max_restarts}" in d.message
    assert "out of memory" in d.message


# -- maxPreemptions -----------------------------------------------------------------------


def test_unlimited_preemptions_always_resubmit() -> None:
    policy = restart_policy(max_preemptions=None)

    d = decide(PREEMPTED, Counters(preemptions=99_999), policy, **NO_PROGRESS)

    assert d.action is Action.RESUBMIT
    assert d.counters.preemptions == 100_000


@pytest.mark.parametrize(
    ("limit", "already", "action"),
    [
        pytest.param(0, 0, Action.FAIL, id="limit-0-first-preemption-fails"),
        pytest.param(2, 0, Action.RESUBMIT, id="limit-2-first-preemption-resubmits"),
        pytest.param(2, 1, Action.RESUBMIT, id="limit-2-second-preemption-resubmits"),
        pytest.param(2, 2, Action.FAIL, id="limit-2-third-preemption-fails"),
    ],
)
def test_preemption_limit(limit: int, already: int, action: Action) -> None:
    policy = restart_policy(max_preemptions=limit)

    d = decide(PREEMPTED, Counters(preemptions=already), policy, **NO_PROGRESS)

    assert d.action is action
    assert d.counters.preemptions == already + 1
    if action is Action.FAIL:
        assert d.reason == REASON_PREEMPTIONS_EXHAUSTED
        assert f"maxPreemptions={limit}" in d.message


def test_a_first_preemption_spends_neither_restarts_nor_the_streak_and_does_not_wait() -> None:
    policy = restart_policy(max_restarts=3, crash_loop_limit=3)
    counters = Counters(restarts=3, consecutive_failures=2, bad_checkpoints=(7,))

    d = decide(PREEMPTED, counters, policy, **NO_PROGRESS)

    assert d.action is Action.RESUBMIT
    assert d.counters == Counters(
        restarts=3, preemptions=1, consecutive_failures=2, bad_checkpoints=(7,), stalled=1
    )
    assert d.delay_seconds == 0
    assert d.reason == "Preempted"
    assert "PreemptionByScheduler" in d.message


def test_many_preemptions_do_not_end_a_run_whose_restart_budget_is_zero() -> None:
    policy = restart_policy(max_restarts=0)
    counters = Counters()
    for _ in range(50):
        d = decide(PREEMPTED, counters, policy, **NO_PROGRESS)
        assert d.action is Action.RESUBMIT
        counters = d.counters

    assert (counters.restarts, counters.preemptions) == (0, 50)


# -- crash loop ---------------------------------------------------------------------------


def _fail_in_a_row(
    policy: RestartPolicySpec, n: int, resume_step: int | None, latest_step: int | None
) -> list[Decision]:
    counters, decisions = Counters(), []
    for _ in range(n):
        d = decide(FAILED, counters, policy, resume_step=resume_step, latest_step=latest_step)
        decisions.append(d)
        counters = d.counters
    return decisions


@pytest.mark.parametrize(
    ("resume_step", "latest_step"),
    [
        pytest.param(100, 100, id="resumed-from-the-newest-checkpoint"),
        pytest.param(None, None, id="fresh-start-and-still-no-checkpoint"),
    ],
)
def test_failures_in_a_row_without_a_newer_checkpoint_end_as_crash_loop(
    resume_step: int | None, latest_step: int | None
) -> None:
    policy = restart_policy(max_restarts=100, crash_loop_limit=3)

    decisions = _fail_in_a_row(policy, 3, resume_step, latest_step)

    assert [d.action for d in decisions] == [Action.RESUBMIT, Action.RESUBMIT, Action.FAIL]
    assert [d.counters.consecutive_failures for d in decisions] == [1, 2, 3]
    assert decisions[-1].reason == REASON_CRASH_LOOP
    assert decisions[-1].counters.restarts == 3


def test_streak_resets_when_a_newer_checkpoint_was_committed() -> None:
    policy = restart_policy(max_restarts=100, crash_loop_limit=3)
    counters = Counters(restarts=2, consecutive_failures=2)

    d = decide(FAILED, counters, policy, **PROGRESS)

    assert d.action is Action.RESUBMIT
    assert d.counters.consecutive_failures < counters.consecutive_failures
    assert d.counters.restarts == 3
    assert d.delay_seconds == policy.backoff.initial_seconds


def test_fresh_start_that_committed_a_checkpoint_made_progress() -> None:
    policy = restart_policy(max_restarts=100, crash_loop_limit=2)

    d = decide(FAILED, Counters(consecutive_failures=1), policy, resume_step=None, latest_step=50)

    assert d.action is Action.RESUBMIT
    assert d.counters.consecutive_failures < 2


@pytest.mark.parametrize("limit", [1, 2, 3], ids=lambda n: f"crash-loop-limit-{n}")
def test_failure_that_committed_a_new_checkpoint_does_not_count_toward_crash_loop(
    limit: int,
) -> None:
    # crashLoopLimit is "failures in a row with no new committed checkpoint": after an attempt
    # that made progress and then failed, it takes `limit` failures without progress to end the
    # run, not `limit - 1`.
    policy = restart_policy(max_restarts=100, crash_loop_limit=limit)

    d = decide(FAILED, Counters(), policy, **PROGRESS)
    actions = [d.action]
    counters = d.counters
    for _ in range(limit):
        d = decide(FAILED, counters, policy, resume_step=200, latest_step=200)
        actions.append(d.action)
        counters = d.counters

    assert actions == [Action.RESUBMIT] * limit + [Action.FAIL], (
        f"a progressing failure then {limit} failures without progress gave {actions}"
    )
    assert d.reason == REASON_CRASH_LOOP


# -- backoff ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("initial", "factor", "cap", "failures", "expected"),
    [
        pytest.param(10, 2, 300, 0, 0, id="no-failure-no-wait"),
        pytest.param(10, 2, 300, 1, 10, id="first-failure-waits-initial"),
        pytest.param(10, 2, 300, 2, 20, id="second-failure-doubles"),
        pytest.param(10, 2, 300, 3, 40, id="third-failure-doubles-again"),
        pytest.param(10, 2, 300, 5, 160, id="fifth-failure-below-cap"),
        pytest.param(10, 2, 300, 6, 300, id="sixth-failure-capped"),
        pytest.param(10, 2, 300, 60, 300, id="sixtieth-failure-capped"),
        pytest.param(5, 3, 1000, 4, 135, id="factor-3-grows-by-three"),
        pytest.param(30, 1, 300, 7, 30, id="factor-1-stays-flat"),
        pytest.param(0, 2, 300, 4, 0, id="zero-initial-never-waits"),
        pytest.param(100, 2, 50, 1, 50, id="cap-below-initial-wins"),
        pytest.param(10, 10, 86400, 1000, 86400, id="huge-streak-capped-without-overflow"),
    ],
)
def test_backoff_growth_and_cap(
    initial: int, factor: int, cap: int, failures: int, expected: int
) -> None:
    policy = restart_policy(
        backoff={"initial_seconds": initial, "factor": factor, "max_seconds": cap}
    )

    assert backoff_seconds(policy, failures) == expected


def test_failure_delay_follows_the_backoff_of_the_streak() -> None:
    policy = restart_policy(
        max_restarts=100,
        crash_loop_limit=100,
        backoff={"initial_seconds": 10, "factor": 2, "max_seconds": 60},
    )

    decisions = _fail_in_a_row(policy, 6, resume_step=100, latest_step=100)

    assert [d.delay_seconds for d in decisions] == [10, 20, 40, 60, 60, 60]


# -- bad checkpoints ----------------------------------------------------------------------


def test_bad_checkpoint_records_the_step_and_spends_nothing() -> None:
    policy = restart_policy(max_restarts=0, max_preemptions=0, crash_loop_limit=1)
    counters = Counters(restarts=0, preemptions=0, consecutive_failures=0, bad_checkpoints=(300,))

    d = decide(CHECKPOINT_BAD, counters, policy, resume_step=200, latest_step=200)

    assert d.action is Action.RESUBMIT
    assert d.counters == Counters(bad_checkpoints=(300, 200), stalled=1)
    assert d.delay_seconds == 0
    assert d.reason == "CheckpointBad"
    assert "200" in d.message
    assert "model.safetensors: size 0" in d.message


def test_bad_checkpoint_already_recorded_is_not_recorded_twice() -> None:
    counters = Counters(bad_checkpoints=(200,))

    d = decide(CHECKPOINT_BAD, counters, restart_policy(), resume_step=200, latest_step=200)

    assert d.counters.bad_checkpoints == (200,)


def test_bad_checkpoint_with_nothing_to_fall_back_from_does_not_loop() -> None:
    # The attempt resumed from no checkpoint: nothing to mark bad, and the next attempt would
    # start the same way. Resubmitting at once, spending nothing, was a hot loop.
    policy = restart_policy(max_restarts=10, crash_loop_limit=3)
    counters, decisions = Counters(), []
    for _ in range(3):
        d = decide(CHECKPOINT_BAD, counters, policy, resume_step=None, latest_step=None)
        decisions.append(d)
        counters = d.counters

    assert [d.action for d in decisions] == [Action.RESUBMIT, Action.RESUBMIT, Action.FAIL]
    assert [d.delay_seconds for d in decisions[:2]] == [10, 20]
    assert [d.reason for d in decisions] == [REASON_FAILED_ATTEMPT] * 2 + [REASON_CRASH_LOOP]
    assert "resumed from none" in decisions[0].message
    assert (counters.restarts, counters.bad_checkpoints) == (3, ())


# -- pace: no hot loop, whatever the class --------------------------------------------------


def _in_a_row(policy: RestartPolicySpec, outcomes: list[Outcome]) -> list[Decision]:
    """Each outcome ends an attempt that resumed from 100 with 100 still the newest: no
    progress."""
    counters, decisions = Counters(), []
    for outcome in outcomes:
        d = decide(outcome, counters, policy, **NO_PROGRESS)
        decisions.append(d)
        counters = d.counters
    return decisions


@pytest.mark.parametrize(
    ("outcomes", "delays"),
    [
        pytest.param([PREEMPTED] * 7, [0, 10, 20, 40, 80, 160, 300], id="preemptions"),
        pytest.param([CHECKPOINT_BAD] * 4, [0, 10, 20, 40], id="bad-checkpoints"),
        pytest.param([FAILED] * 4, [10, 20, 40, 80], id="failures-as-before"),
        pytest.param(
            [PREEMPTED, FAILED, CHECKPOINT_BAD, PREEMPTED, FAILED, CHECKPOINT_BAD],
            [0, 20, 20, 40, 160, 160],
            id="mixed-classes-share-one-streak",
        ),
    ],
)
def test_repeated_endings_without_progress_back_off(
    outcomes: list[Outcome], delays: list[int]
) -> None:
    policy = restart_policy(max_restarts=100, crash_loop_limit=100)

    decisions = _in_a_row(policy, outcomes)

    assert [d.action for d in decisions] == [Action.RESUBMIT] * len(outcomes)
    assert [d.delay_seconds for d in decisions] == delays
    assert [d.counters.stalled for d in decisions] == list(range(1, len(outcomes) + 1))


def test_repeated_preemptions_spend_only_their_own_budget() -> None:
    policy = restart_policy(max_restarts=0, crash_loop_limit=1)

    decisions = _in_a_row(policy, [PREEMPTED] * 20)

    assert all(d.action is Action.RESUBMIT for d in decisions)
    last = decisions[-1].counters
    assert (last.restarts, last.consecutive_failures, last.preemptions) == (0, 0, 20)


@pytest.mark.parametrize("stalled", [0, 1, 5, 50], ids=lambda n: f"after-{n}-stalled")
def test_a_preemption_after_progress_resubmits_at_once(stalled: int) -> None:
    counters = Counters(restarts=2, consecutive_failures=2, stalled=stalled)

    d = decide(PREEMPTED, counters, restart_policy(), **PROGRESS)

    assert (d.action, d.delay_seconds) == (Action.RESUBMIT, 0)
    assert d.counters.stalled == 0
    assert d.counters.consecutive_failures == 2  # preemptions never reset the crash-loop streak


def test_a_failure_after_a_streak_of_preemptions_waits_the_streaks_backoff() -> None:
    d = decide(FAILED, Counters(stalled=3), restart_policy(), **NO_PROGRESS)

    assert (d.counters.consecutive_failures, d.counters.stalled) == (1, 4)
    assert d.delay_seconds == 80


@pytest.mark.parametrize("given", [NO_PROGRESS, PROGRESS], ids=["no-progress", "progress"])
def test_a_pause_neither_grows_nor_resets_the_streak_and_never_waits(given: dict[str, int]) -> None:
    d = decide(PAUSED, Counters(stalled=4), restart_policy(), **given)

    assert (d.action, d.delay_seconds, d.counters.stalled) == (Action.RESUBMIT, 0, 4)


def test_repeated_evictions_without_progress_back_off() -> None:
    # "Evicted" is Kueue's reason and the kubelet's (node pressure: a trainer filling its disk
    # is evicted again in every attempt).
    decisions = _in_a_row(restart_policy(), [EVICTED] * 3)

    assert [d.delay_seconds for d in decisions] == [0, 10, 20]


def test_decide_refuses_an_attempt_that_has_not_ended() -> None:
    with pytest.raises(ValueError, match="needs an ended attempt"):
        decide(NOT_ENDED, Counters(), restart_policy(), **NO_PROGRESS)
