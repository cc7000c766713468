"""The unprotected-run warning: the ``Protected`` condition of a running attempt
(``decide/protection.py`` and ``_protect`` in ``decide/reconcile.py``), as plan() sets it.

Covers:

- before ``spec.checkpoint.unprotectedAfterSeconds`` have passed since the trainer started and
  with no commit since: Protected Unknown (AwaitingCheckpoint), no Event, and a requeue for the
  seconds left;
- at and after the deadline: Protected False (Unprotected) and one Warning Event whose message
  names the folder, the format, the sidecar's log and the fix; later passes neither repeat the
  Event nor move the condition's time (the planned status is a fixpoint);
- a checkpoint committed at or after the trainer's start: Protected True (CheckpointCommitted),
  before or after the deadline; one committed before the start (what the attempt resumed
  from) does not count; after a warning, the flip to True is one Normal Event;
- the next attempt is judged afresh: the condition of an earlier attempt is replaced, and the
  next attempt warns again;
- 0 turns the warning off: no condition, no Event, no requeue, and a condition set before the
  change is removed;
- nothing is judged before the trainer started (image pull, restore) nor once it stopped with
  no commit since its start; a commit seen while the sidecar finishes still counts; a finished
  run is left alone;
- the message for a named format and for a pattern;
- ``warns_unprotected()`` is True exactly for the pass that warns;
- a sync sidecar whose last run gave up on access denied (its termination message) turns the
  condition False at once (AccessDenied, one Warning Event, the message cut to a line and a
  bound), unless a checkpoint was committed since the trainer started; other endings of the
  sidecar do not.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from tests.unit.builders import T0, RunBuilder, make_node, make_run, pod_from
from trainingrun.api import CheckpointRef, Condition, TrainingRunStatus
from trainingrun.contract import SYNC_CONTAINER, TIME_FORMAT_MICRO, TRAINER_CONTAINER, rfc3339
from trainingrun.decide import reasons as R
from trainingrun.decide.observed import Plan
from trainingrun.decide.pod import AgentSettings, build_pod
from trainingrun.decide.protection import ACCESS_DENIED_MESSAGE, MAX_SIDECAR_MESSAGE
from trainingrun.decide.reconcile import plan, started
from trainingrun.decide.status import Event, fail, set_condition
from trainingrun.decide.unprotected import warns_unprotected

LIMIT = 600


def _run(limit: int = LIMIT, **checkpoint: Any) -> RunBuilder:
    return make_run("r1").with_checkpoint_fields(unprotectedAfterSeconds=limit, **checkpoint)


def _launched(
    run: RunBuilder, attempt: int = 1, status: TrainingRunStatus | None = None
) -> tuple[TrainingRunStatus, dict[str, Any]]:
    """The status after ``attempt``'s pod was created, and that pod as built."""
    status = status or plan(run.observe()).status
    status = status.model_copy(update={"attempt": attempt})
    pod = build_pod(run.ref(), attempt, None, AgentSettings(), epoch=attempt)
    status, _ = started(status, run.observe(status=status), pod)
    return status, pod


def _commit(step: int, seconds: float) -> CheckpointRef:
    """Checkpoint ``step``, committed ``seconds`` after T0 (the sidecar's time format)."""
    at = (T0 + timedelta(seconds=seconds)).strftime(TIME_FORMAT_MICRO)
    return CheckpointRef(step=step, uri=f"s3://b/ml/r1/checkpoints/checkpoint-{step}/", time=at)


def _pass(
    run: RunBuilder,
    status: TrainingRunStatus,
    pod: dict[str, Any] | None,
    at: float,
    latest: CheckpointRef | None = None,
) -> Plan:
    """plan() ``at`` seconds after T0, with ``latest`` read from the bucket manifest; a pod
    that was scheduled is on a Ready node."""
    node = make_node().build() if pod and pod["spec"].get("nodeName") else None
    obs = run.observe(pod, node=node, status=status, now=T0 + timedelta(seconds=at))
    return plan(replace(obs, latest=latest))


def _trainer_since(pod: dict[str, Any], seconds: float = 0) -> dict[str, Any]:
    """``pod`` with its trainer running since ``seconds`` after T0."""
    return pod_from(pod).running(since=rfc3339(T0 + timedelta(seconds=seconds))).build()


def _protected(status: TrainingRunStatus) -> Condition | None:
    return next((c for c in status.conditions if c.type == R.PROTECTED), None)


def _reasons(events: list[Event]) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in events]


# -- before and at the deadline ---------------------------------------------------------------


@pytest.mark.parametrize("elapsed", [0, 1, 300, LIMIT - 1], ids=lambda s: f"{s}s")
def test_before_the_deadline_it_waits_and_comes_back_at_it(elapsed: int) -> None:
    run = _run()
    status, pod = _launched(run)

    p = _pass(run, status, _trainer_since(pod), elapsed)

    cond = _protected(p.status)
    assert cond is not None
    assert (cond.status, cond.reason) == ("Unknown", R.AWAITING_CHECKPOINT)
    assert f"within {LIMIT} s" in cond.message
    assert p.events == []
    assert p.requeue_after == pytest.approx(LIMIT - elapsed)


@pytest.mark.parametrize("elapsed", [LIMIT, LIMIT + 1, 10 * LIMIT], ids=lambda s: f"{s}s")
def test_at_and_after_the_deadline_it_warns_once(elapsed: int) -> None:
    run = _run()
    status, pod = _launched(run)

    p = _pass(run, status, _trainer_since(pod), elapsed)

    cond = _protected(p.status)
    assert cond is not None
    assert (cond.status, cond.reason) == ("False", R.UNPROTECTED)
    assert _reasons(p.events) == [("Warning", R.UNPROTECTED)]
    assert p.events[0].message == cond.message
    assert cond.last_transition_time == rfc3339(T0 + timedelta(seconds=elapsed))
    assert p.requeue_after is None
    assert p.status.phase == "Running"  # a warning, not an ending


def test_the_warning_names_the_problem_and_the_fix() -> None:
    run = _run(localPath="/data/ckpt")
    status, pod = _launched(run)

    message = _pass(run, status, _trainer_since(pod), LIMIT).events[0].message

    assert message.startswith(f"attempt 1 (r1-1): no checkpoint committed in the {LIMIT} s")
    assert "recognised no checkpoint in /data/ckpt" in message
    assert "kubectl logs r1-1 -c trainingrun-sync" in message
    assert "spec.checkpoint.format" in message and "spec.checkpoint.pattern" in message
    assert "docs/checkpoints.md" in message


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"format": "lightning"}, "no complete lightning checkpoint in /checkpoints"),
        ({"format": "lightning"}, "spec.checkpoint.format (lightning) is its format"),
        (
            {"format": "pattern", "pattern": {"glob": "step_*"}},
            "no complete checkpoint matching step_* in /checkpoints",
        ),
    ],
    ids=["named-format", "named-format-fix", "pattern"],
)
def test_the_warning_speaks_of_the_format_the_run_names(
    fields: dict[str, Any], expected: str
) -> None:
    run = _run(**fields)
    status, pod = _launched(run)

    message = _pass(run, status, _trainer_since(pod), LIMIT).events[0].message

    assert expected in message


def test_later_passes_repeat_nothing() -> None:
    run = _run()
    status, pod = _launched(run)
    running = _trainer_since(pod)
    events: list[Event] = []
    for at in (0, LIMIT - 1, LIMIT, LIMIT + 60, LIMIT + 3600, LIMIT + 3600):
        p = _pass(run, status, running, at)
        status = p.status
        events.extend(p.events)

    assert _reasons(events) == [("Warning", R.UNPROTECTED)]
    cond = _protected(status)
    assert cond is not None
    assert cond.last_transition_time == rfc3339(T0 + timedelta(seconds=LIMIT))
    again = _pass(run, status, running, LIMIT + 3600)
    assert (again.status, again.events) == (status, [])


# -- a checkpoint committed -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("committed", "elapsed"),
    [(0, 10), (5, 10), (5, LIMIT + 10), (LIMIT + 5, LIMIT + 10)],
    ids=["at-the-start", "soon-after", "seen-after-the-deadline", "after-the-deadline"],
)
def test_a_checkpoint_committed_since_the_start_protects(committed: int, elapsed: int) -> None:
    run = _run()
    status, pod = _launched(run)

    p = _pass(run, status, _trainer_since(pod), elapsed, latest=_commit(40, committed))

    cond = _protected(p.status)
    assert cond is not None
    assert (cond.status, cond.reason) == ("True", R.CHECKPOINT_COMMITTED)
    assert cond.message.startswith("attempt 1 (r1-1): checkpoint 40 committed at ")
    assert p.events == []  # nothing was wrong: no news
    assert p.requeue_after is None


@pytest.mark.parametrize("committed", [-1, -3600], ids=["1s-before", "1h-before"])
@pytest.mark.parametrize(
    ("elapsed", "expected"), [(LIMIT - 1, "Unknown"), (LIMIT, "False")], ids=["before", "at"]
)
def test_a_checkpoint_committed_before_the_start_does_not_count(
    committed: int, elapsed: int, expected: str
) -> None:
    run = _run()
    status, pod = _launched(run)

    p = _pass(run, status, _trainer_since(pod), elapsed, latest=_commit(40, committed))

    cond = _protected(p.status)
    assert cond is not None and cond.status == expected
    assert len(p.events) == (1 if expected == "False" else 0)
    assert p.status.latest_checkpoint is not None and p.status.latest_checkpoint.step == 40


def test_a_commit_after_the_warning_is_told_once() -> None:
    run = _run()
    status, pod = _launched(run)
    running = _trainer_since(pod)
    warned = _pass(run, status, running, LIMIT)

    p = _pass(run, warned.status, running, LIMIT + 30, latest=_commit(50, LIMIT + 20))
    later = _pass(run, p.status, running, LIMIT + 90, latest=_commit(60, LIMIT + 80))

    assert _reasons(p.events) == [("Normal", R.CHECKPOINT_COMMITTED)]
    cond = _protected(later.status)
    assert cond is not None and (cond.status, cond.reason) == ("True", R.CHECKPOINT_COMMITTED)
    assert "checkpoint 60" in cond.message
    assert later.events == []


# -- one warning per attempt ------------------------------------------------------------------


def test_the_next_attempt_is_judged_afresh_and_warns_again() -> None:
    run = _run()
    status, pod = _launched(run)
    first = _pass(run, status, _trainer_since(pod), LIMIT).status
    restart = LIMIT + 100  # attempt 2's trainer starts here
    status2, pod2 = _launched(run, attempt=2, status=first)
    running2 = _trainer_since(pod2, restart)

    waiting = _pass(run, status2, running2, restart + 10)
    warned = _pass(run, waiting.status, running2, restart + LIMIT)

    cond = _protected(waiting.status)
    assert cond is not None and cond.status == "Unknown"
    assert waiting.events == []
    cond = _protected(warned.status)
    assert cond is not None and cond.status == "False"
    assert cond.message.startswith("attempt 2 (r1-2): ")
    assert cond.last_transition_time == rfc3339(T0 + timedelta(seconds=restart + LIMIT))
    assert _reasons(warned.events) == [("Warning", R.UNPROTECTED)]


def test_an_attempt_first_seen_after_its_deadline_still_warns() -> None:
    """The operator was away for the whole of attempt 2's grace: the earlier attempt's False is
    not taken for this one's."""
    run = _run()
    status, pod = _launched(run)
    first = _pass(run, status, _trainer_since(pod), LIMIT).status
    status2, pod2 = _launched(run, attempt=2, status=first)

    p = _pass(run, status2, _trainer_since(pod2, 2 * LIMIT), 5 * LIMIT)

    assert _reasons(p.events) == [("Warning", R.UNPROTECTED)]


def test_a_trainer_clock_ahead_of_the_operators_does_not_churn() -> None:
    """The node's clock runs ahead: the trainer's start is after the operator's now. The
    condition's time is never set before that start, so the next pass keeps it."""
    run = _run()
    status, pod = _launched(run)
    running = _trainer_since(pod, 20)

    first = _pass(run, status, running, 5)
    second = _pass(run, first.status, running, 6)

    assert second.status == first.status
    assert second.requeue_after == pytest.approx(LIMIT + 20 - 6)


# -- off, not started, stopped, finished ------------------------------------------------------


def test_0_turns_the_warning_off() -> None:
    run = _run(limit=0)
    status, pod = _launched(run)

    p = _pass(run, status, _trainer_since(pod), 100 * LIMIT)

    assert _protected(p.status) is None
    assert (p.events, p.requeue_after) == ([], None)


def test_turning_the_warning_off_removes_the_condition() -> None:
    run = _run()
    status, pod = _launched(run)
    warned = _pass(run, status, _trainer_since(pod), LIMIT).status
    assert _protected(warned) is not None

    off = _run(limit=0)
    p = _pass(off, warned, _trainer_since(pod), LIMIT + 10)

    assert _protected(p.status) is None
    assert p.events == []


def _trainer_stopped(pod: dict[str, Any], exit_code: int) -> dict[str, Any]:
    """The trainer exited; the pod still runs (the sidecar commits the last save)."""
    stopped = pod_from(pod).running().trainer_exited(exit_code, phase="Running").build()
    trainer = next(
        c for c in stopped["status"]["containerStatuses"] if c["name"] == TRAINER_CONTAINER
    )
    trainer["state"]["terminated"]["startedAt"] = rfc3339(T0)
    return stopped


@pytest.mark.parametrize(
    "pod_state",
    [
        lambda pod: pod,  # created, not scheduled
        lambda pod: pod_from(pod).on_node().waiting("ContainerCreating").build(),
        lambda pod: _trainer_stopped(pod, 0),
    ],
    ids=["pending", "trainer-waiting", "trainer-exited"],
)
def test_nothing_is_judged_while_the_trainer_does_not_run(pod_state: Any) -> None:
    run = _run()
    status, pod = _launched(run)

    p = _pass(run, status, pod_state(pod), 10 * LIMIT)

    # As the attempt's start left it: waiting, and never turned False past the deadline.
    assert _protected(p.status) == _protected(status)
    cond = _protected(status)
    assert cond is not None and (cond.status, cond.reason) == ("Unknown", R.AWAITING_CHECKPOINT)
    assert p.events == []


@pytest.mark.parametrize("elapsed", [0, 5, LIMIT - 1], ids=lambda s: f"{s}s")
def test_the_trainers_start_writes_nothing(elapsed: int) -> None:
    """The attempt's start sets what the first look at its running trainer says (Unknown,
    with the same words): the status does not change, so no status write when it starts."""
    run = _run()
    status, pod = _launched(run)

    p = _pass(run, status, _trainer_since(pod, 2), 2 + elapsed)

    assert p.status == status
    assert p.events == []
    assert p.requeue_after == pytest.approx(LIMIT - elapsed)


def test_the_start_replaces_the_last_attempts_verdict() -> None:
    run = _run()
    status, pod = _launched(run)
    warned = _pass(run, status, _trainer_since(pod), LIMIT).status
    assert (_protected(warned) or Condition(type="x", status="x")).status == "False"

    status2, _ = _launched(run, attempt=2, status=warned)

    cond = _protected(status2)
    assert cond is not None and (cond.status, cond.reason) == ("Unknown", R.AWAITING_CHECKPOINT)
    assert cond.message.startswith("attempt 2 (r1-2): ")


def test_a_commit_seen_while_the_sidecar_finishes_still_counts() -> None:
    run = _run()
    status, pod = _launched(run)

    p = _pass(run, status, _trainer_stopped(pod, 0), 10 * LIMIT, latest=_commit(60, 100))

    cond = _protected(p.status)
    assert cond is not None and cond.status == "True"


@pytest.mark.parametrize("ending", [R.SUCCEEDED, R.FAILED])
def test_a_finished_run_is_left_alone(ending: str) -> None:
    run = _run()
    status, pod = _launched(run)
    if ending == R.FAILED:
        status, _ = fail(status, 1, R.INVALID_SPEC, "bad", T0)
    else:
        conds = set_condition(status.conditions, R.SUCCEEDED, True, R.SUCCEEDED, "done", 1, T0)
        status = status.model_copy(update={"conditions": conds})

    p = _pass(run, status, _trainer_since(pod), 10 * LIMIT)

    assert _protected(p.status) == _protected(status)  # never judged again, never False
    assert (p.events, p.requeue_after) == ([], None)


# -- the reconciler's question ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("elapsed", "latest", "warned_before", "expected"),
    [
        (LIMIT - 1, None, False, False),
        (LIMIT, None, False, True),
        (LIMIT, _commit(40, 5), False, False),
        (LIMIT + 60, None, True, False),
    ],
    ids=["before", "at", "committed", "already-warned"],
)
def test_warns_unprotected_is_true_for_the_pass_that_warns(
    elapsed: int, latest: CheckpointRef | None, warned_before: bool, expected: bool
) -> None:
    run = _run()
    status, pod = _launched(run)
    running = _trainer_since(pod)
    if warned_before:
        status = _pass(run, status, running, LIMIT).status
    obs = replace(
        run.observe(running, status=status, now=T0 + timedelta(seconds=elapsed)), latest=latest
    )

    assert warns_unprotected(obs) is expected
    assert warns_unprotected(obs) == any(e.reason == R.UNPROTECTED for e in plan(obs).events)


# -- the sync sidecar gave up on access denied ------------------------------------------------


def _sidecar_gave_up(
    pod: dict[str, Any], message: str, where: str = "lastState", at: float | None = None
) -> None:
    """The sync sidecar's status after it exited with ``message`` (``at`` seconds after T0, when
    given) and was restarted."""
    sync = next(s for s in pod["status"]["initContainerStatuses"] if s["name"] == SYNC_CONTAINER)
    ended: dict[str, Any] = {"exitCode": 1, "reason": "Error", "message": message}
    if at is not None:
        ended["finishedAt"] = rfc3339(T0 + timedelta(seconds=at))
    sync[where] = {"terminated": ended}


DENIED = f"{ACCESS_DENIED_MESSAGE} for 300 s (s3://b/ml/r1/manifest.json: access denied)"


@pytest.mark.parametrize("elapsed", [1, LIMIT - 1, LIMIT + 1], ids=lambda s: f"{s}s")
def test_a_sidecar_that_gave_up_on_access_denied_warns_at_once(elapsed: int) -> None:
    run = _run()
    status, pod = _launched(run)
    pod = _trainer_since(pod)
    _sidecar_gave_up(pod, DENIED)

    p = _pass(run, status, pod, elapsed)

    cond = _protected(p.status)
    assert cond is not None
    assert (cond.status, cond.reason) == ("False", R.ACCESS_DENIED)
    assert DENIED in cond.message and "credentialsSecret" in cond.message
    assert _reasons(p.events) == [("Warning", R.ACCESS_DENIED)]
    again = _pass(run, p.status, pod, elapsed + 30)
    assert again.events == [] and _protected(again.status) == cond


@pytest.mark.parametrize(
    ("gave_up_at", "expected"),
    [
        (20, R.CHECKPOINT_COMMITTED),  # restarted with keys that work, then committed at 30
        (40, R.ACCESS_DENIED),  # committed at 30, then the keys were revoked
        (30, R.ACCESS_DENIED),  # the same second: the newer news is the denial
        (None, R.ACCESS_DENIED),  # no finishedAt: nothing shows a commit came after
    ],
    ids=["commit-after", "denied-after", "same-second", "no-time"],
)
def test_access_denied_counts_only_when_no_commit_came_after_it(
    gave_up_at: float | None, expected: str
) -> None:
    run = _run()
    status, pod = _launched(run)
    pod = _trainer_since(pod)
    _sidecar_gave_up(pod, DENIED, at=gave_up_at)

    p = _pass(run, status, pod, 60, latest=_commit(10, 30))

    cond = _protected(p.status)
    assert cond is not None and cond.reason == expected


@pytest.mark.parametrize(
    "message",
    ["sync: StorageUnavailable: the endpoint did not answer", "", "Error: OOM"],
    ids=["other-failure", "empty", "oom"],
)
def test_other_sidecar_endings_do_not_say_access_denied(message: str) -> None:
    run = _run()
    status, pod = _launched(run)
    pod = _trainer_since(pod)
    _sidecar_gave_up(pod, message)

    p = _pass(run, status, pod, 10)

    cond = _protected(p.status)
    assert cond is not None and cond.reason == R.AWAITING_CHECKPOINT


def test_the_sidecar_message_is_cut_to_its_first_line_and_a_bound() -> None:
    run = _run()
    status, pod = _launched(run)
    pod = _trainer_since(pod)
    _sidecar_gave_up(pod, DENIED + "x" * 5000 + "\nsecond line", where="state")

    p = _pass(run, status, pod, 10)

    cond = _protected(p.status)
    assert cond is not None and cond.reason == R.ACCESS_DENIED
    assert "second line" not in cond.message
    assert len(cond.message) < MAX_SIDECAR_MESSAGE + 400
