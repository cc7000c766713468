"""The goodput ledger (``decide.goodput``): an attempt's record from its start, its progress
records and its end; the kinds steps are lost under; the wall time split so that the parts add
up to it; the totals kept whole past the last 20 attempts; and the ledger through ``plan()``.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from tests.unit.builders import NAMESPACE, PodBuilder, make_node
from tests.unit.test_reconciler import RUN, World, _trainer_saved_on_notice_and_exited
from trainingrun.api import AttemptRecord, TrainingRunStatus
from trainingrun.checkpoint.progress import (
    LAST_WORD_RECORD,
    PROGRESS_RECORD,
    ProgressRecord,
    decode,
    encode,
)
from trainingrun.contract import rfc3339
from trainingrun.decide import goodput
from trainingrun.decide import reasons as R
from trainingrun.decide.classify import End, Outcome

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def progress(attempt: int, first: int, first_s: float, step: int, step_s: float) -> ProgressRecord:
    return ProgressRecord(
        step=step,
        attempt=attempt,
        first_step=first,
        first_seen=at(first_s).timestamp(),
        observed=at(step_s).timestamp(),
    )


EVICTED = Outcome(End.PREEMPTED, R.DISRUPTION_TARGET, "evicted")
SUCCEEDED = Outcome(End.SUCCEEDED, R.SUCCEEDED, "the trainer exited 0")


@pytest.mark.parametrize(
    ("outcome", "kind"),
    [
        pytest.param(SUCCEEDED, None, id="success"),
        pytest.param(EVICTED, "eviction", id="eviction-api"),
        pytest.param(Outcome(End.PREEMPTED, R.POD_DELETED, ""), "eviction", id="pod-deleted"),
        pytest.param(
            Outcome(End.PREEMPTED, "EvictionByEvictionAPI", ""), "eviction", id="eviction-api-r"
        ),
        pytest.param(
            Outcome(End.PREEMPTED, "PreemptionByScheduler", ""), "eviction", id="scheduler"
        ),
        pytest.param(
            Outcome(End.PREEMPTED, "DeletionByTaintManager", ""), "nodeLost", id="taint-manager"
        ),
        pytest.param(Outcome(End.PREEMPTED, "DeletionByPodGC", ""), "nodeLost", id="pod-gc"),
        pytest.param(Outcome(End.PREEMPTED, R.PREEMPTION_NOTICE, ""), "notice", id="notice"),
        pytest.param(Outcome(End.PREEMPTED, R.NODE_DELETED, ""), "nodeLost", id="node-deleted"),
        pytest.param(Outcome(End.PREEMPTED, R.NODE_NOT_READY, ""), "nodeLost", id="not-ready"),
        pytest.param(
            Outcome(End.FAILED, R.TRAINER_ERROR, "", exit_code=137), "sigkill", id="exit-137"
        ),
        pytest.param(Outcome(End.FAILED, R.OOM_KILLED, "", exit_code=137), "sigkill", id="oom"),
        pytest.param(Outcome(End.FAILED, R.TRAINER_ERROR, "", exit_code=1), "other", id="exit-1"),
        pytest.param(Outcome(End.PAUSED, R.PAUSED, ""), "other", id="paused"),
    ],
)
def test_kind_of(outcome: Outcome, kind: str | None) -> None:
    assert goodput.kind_of(outcome) == kind


@pytest.mark.parametrize(
    ("last", "committed", "resume", "lost"),
    [
        pytest.param(30, 20, None, 10, id="past-the-last-commit"),
        pytest.param(20, 20, None, 0, id="saved-at-its-last-step"),
        pytest.param(25, None, None, 25, id="nothing-committed-from-scratch"),
        pytest.param(25, 10, 20, 5, id="nothing-newer-than-its-resume"),
        pytest.param(None, 20, None, 0, id="no-step-published"),
        pytest.param(15, 20, None, 0, id="last-publish-older-than-the-commit"),
    ],
)
def test_lost_steps(last: int | None, committed: int | None, resume: int | None, lost: int) -> None:
    record = AttemptRecord(attempt=1, resume_step=resume, created="2026-11-29T12:00:00Z")
    record = record.model_copy(update={"last_step": last})
    assert goodput.lost_steps(record, committed) == lost


def run_two_attempts(kind: Outcome) -> TrainingRunStatus:
    """Created at 0; attempt 1's pod at 10, steps 1..31 seen from 20 to 80, ended at 85 with 20
    committed; attempt 2's pod at 95 resuming 20, steps 21..61 from 100 to 160, success at 165."""
    s = TrainingRunStatus(attempt=1)
    s = goodput.begun(s, None, at(10))
    s = goodput.seen(s, progress(1, 1, 20, 31, 80))
    s = goodput.ended(s, kind, 20, T0, at(85))
    s = s.model_copy(update={"attempt": 2})
    s = goodput.begun(s, 20, at(95))
    s = goodput.seen(s, progress(2, 21, 100, 61, 160))
    s = goodput.ended(s, SUCCEEDED, 61, T0, at(165))
    return goodput.shown(s, T0, at(170), finished=True)


def test_the_parts_add_up_to_the_wall_time() -> None:
    s = run_two_attempts(EVICTED)

    g = s.goodput
    assert g is not None
    assert g.wall_seconds == 165.0  # to the last attempt's end, not to "now" (170)
    parts = [
        g.productive_seconds,
        g.lost_seconds,
        g.startup_seconds,
        g.waiting_seconds,
        g.stall_seconds,
    ]
    assert sum(parts) == pytest.approx(165.0, abs=0.01)
    assert g.waiting_seconds == pytest.approx(20.0)  # 0-10 and 85-95
    # 10-20 and 95-100, less the first step of each, made before its sidecar first saw one
    assert g.startup_seconds == pytest.approx(8.0 + 3.5)
    assert g.stall_seconds == pytest.approx(10.0)  # 80-85 and 160-165
    # attempt 1: 2 s a step (60 s for steps 2..31), 11 of its 31 steps past the commit at 20
    assert g.lost_seconds == pytest.approx(62.0 * 11 / 31, abs=0.01)
    assert g.percent == pytest.approx(100 * g.productive_seconds / 165.0, abs=0.1)
    assert g.steps_lost.eviction == 11
    assert [a.steps_lost for a in s.attempts] == [11, 0]
    assert [a.kind for a in s.attempts] == ["eviction", None]


def test_a_lost_node_loses_its_end_too() -> None:
    s = run_two_attempts(Outcome(End.PREEMPTED, R.NODE_NOT_READY, "gone"))

    g = s.goodput
    assert g is not None
    assert g.steps_lost.node_lost == 11 and g.steps_lost.eviction == 0
    assert g.stall_seconds == pytest.approx(5.0)  # the success's end only
    assert g.lost_seconds == pytest.approx(62.0 * 11 / 31 + 5.0, abs=0.01)


def test_a_running_attempt_counts_as_productive_until_it_ends() -> None:
    s = TrainingRunStatus(attempt=1)
    s = goodput.begun(s, None, at(10))
    s = goodput.seen(s, progress(1, 1, 20, 31, 80))

    g = goodput.shown(s, T0, at(100), finished=False).goodput

    assert g is not None
    assert (g.wall_seconds, g.waiting_seconds, g.startup_seconds) == (100.0, 10.0, 8.0)
    assert g.productive_seconds == pytest.approx(82.0)  # step 1 (2 s) before it was seen
    assert g.lost_seconds == 0.0 and g.steps_lost.eviction == 0


def test_between_attempts_the_time_is_waiting() -> None:
    s = TrainingRunStatus(attempt=1)
    s = goodput.begun(s, None, at(10))
    s = goodput.seen(s, progress(1, 1, 20, 31, 80))
    s = goodput.ended(s, EVICTED, 20, T0, at(85))
    s = s.model_copy(update={"attempt": 2})  # backoff: no pod yet

    g = goodput.shown(s, T0, at(145), finished=False).goodput

    assert g is not None
    assert g.waiting_seconds == pytest.approx(10.0 + 60.0)


def test_another_attempts_record_changes_nothing() -> None:
    s = goodput.begun(TrainingRunStatus(attempt=2), 20, at(10))

    assert goodput.seen(s, progress(1, 1, 20, 31, 80)) == s
    assert goodput.seen(s, None) == s


def test_an_attempt_ends_once() -> None:
    s = goodput.begun(TrainingRunStatus(attempt=1), None, at(10))
    s = goodput.seen(s, progress(1, 1, 20, 31, 80))
    once = goodput.ended(s, EVICTED, 20, T0, at(85))

    assert goodput.ended(once, EVICTED, 20, T0, at(99)) == once


def test_a_sidecar_clock_ahead_or_behind_never_gives_negative_time() -> None:
    s = goodput.begun(TrainingRunStatus(attempt=1), None, at(10))
    s = goodput.seen(s, progress(1, 1, -50, 31, 500))  # before the pod, after the end
    s = goodput.ended(s, EVICTED, 20, T0, at(85))
    g = goodput.shown(s, T0, at(85), finished=True).goodput

    assert g is not None
    parts = [g.productive_seconds, g.lost_seconds, g.startup_seconds, g.waiting_seconds]
    assert min([*parts, g.stall_seconds]) >= 0.0
    assert sum(parts) + g.stall_seconds == pytest.approx(85.0, abs=0.01)


def test_the_totals_stay_whole_past_the_last_20_attempts() -> None:
    s = TrainingRunStatus(attempt=1)
    for n in range(1, 31):  # 30 attempts of 10 s each, 5 steps lost each
        s = s.model_copy(update={"attempt": n})
        start = (n - 1) * 10
        s = goodput.begun(s, None, at(start))
        s = goodput.seen(s, progress(n, 1, start + 1, 11, start + 9))
        s = goodput.ended(s, EVICTED, 6, T0, at(start + 10))
    g = goodput.shown(s, T0, at(300), finished=True).goodput

    assert [a.attempt for a in s.attempts] == list(range(11, 31))
    assert g is not None
    assert g.steps_lost.eviction == 30 * 5
    assert g.wall_seconds == 300.0
    assert g.startup_seconds == pytest.approx(30 * 0.2)  # 1 s each, less step 1's 0.8 s


# -- through the reconciler ----------------------------------------------------------------------


def test_the_ledger_through_the_reconciler_an_eviction_then_the_resume() -> None:
    w = World()
    run = w.kube.runs[(NAMESPACE, RUN)]
    run["metadata"]["creationTimestamp"] = rfc3339(w.clock.now())
    w.reconciler.view.runs.put((NAMESPACE, RUN), copy.deepcopy(run))
    created = w.clock.now()
    key = w.location.key(PROGRESS_RECORD)

    def publish(step: int, first_at: float) -> None:
        t = w.clock.now().timestamp()
        record = ProgressRecord(step, 1, 1, created.timestamp() + first_at, t, total_steps=100)
        w.bucket.put(key, encode(record))

    w.clock.advance(5)
    w.reconcile()  # attempt 1's pod, 5 s after the run was created
    w.kube.nodes["n1"] = make_node("n1").build()
    w.report(PodBuilder.of(w.pod("r1-1")).running(since=rfc3339(w.clock.now())))
    w.clock.advance(60)
    publish(25, first_at=15)
    w.reconcile()
    first = w.status()["attempts"][0]
    assert (first["attempt"], first["firstStep"], first["lastStep"]) == (1, 1, 25)
    assert w.status()["goodput"]["waitingSeconds"] == 5.0

    w.bucket.commit(w.location, 10, 20)
    w.clock.advance(10)  # within the minute: only the attempt's end reads the record again
    publish(31, first_at=15)  # the sidecar's last word: the trainer reached step 31
    w.report(
        PodBuilder.of(w.pod("r1-1"))
        .phase("Failed")
        .condition("DisruptionTarget", reason="EvictionByEvictionAPI")
    )
    w.reconcile()

    status = w.status()
    assert w.kube.creates == ["r1-1", "r1-2"]
    ended, resumed = status["attempts"]
    assert (ended["kind"], ended["committedStep"], ended["lastStep"]) == ("eviction", 20, 31)
    assert ended["stepsLost"] == 11
    assert (resumed["attempt"], resumed["resumeStep"], resumed.get("ended")) == (2, 20, None)
    g = status["goodput"]
    assert g["stepsLost"]["eviction"] == 11
    parts = ("productive", "lost", "startup", "waiting", "stall")
    assert sum(g[f"{k}Seconds"] for k in parts) == pytest.approx(g["wallSeconds"], abs=1.0)
    assert g["wallSeconds"] == 75.0
    assert w.bucket.gets.count(key) == 2


def test_an_end_at_a_fraction_of_a_second_still_adds_up() -> None:
    s = goodput.begun(TrainingRunStatus(attempt=1), None, at(10))
    s = goodput.seen(s, progress(1, 1, 20, 31, 80))
    s = goodput.ended(s, SUCCEEDED, 31, T0, at(85.7))
    g = goodput.shown(s, T0, at(86.2), finished=True).goodput

    assert g is not None
    parts = [g.productive_seconds, g.lost_seconds, g.startup_seconds, g.waiting_seconds]
    assert sum(parts) + g.stall_seconds == pytest.approx(g.wall_seconds, abs=0.001)


# -- the ledger's copy in the run's prefix -----------------------------------------------------


def test_the_ledgers_copy_round_trips_for_its_run_only() -> None:
    status = run_two_attempts(EVICTED)
    data = goodput.encode_ledger(status, "uid-1")
    assert data is not None and len(data) < goodput.LEDGER_MAX_BYTES

    assert goodput.decode_ledger(data, "uid-1") == (status.goodput, status.attempts)
    assert goodput.decode_ledger(data, "uid-of-a-run-made-again") is None
    assert goodput.encode_ledger(TrainingRunStatus(), "uid-1") is None


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"{" * 100_000, id="over-the-cap"),
        pytest.param(b"\x00garbage", id="not-json"),
        pytest.param(b'[{"version": 1}]', id="not-an-object"),
        pytest.param(b'{"version": 2, "uid": "u"}', id="newer-version"),
        pytest.param(b'{"version": 1, "uid": "u", "goodput": {}, "attempts": []}', id="no-goodput"),
        pytest.param(
            b'{"version": 1, "uid": "u", "attempts": "x", "goodput": {}}', id="attempts-not-a-list"
        ),
        pytest.param(
            json.dumps(
                {
                    "version": 1,
                    "uid": "u",
                    "goodput": {"wallSeconds": -5, "observedAt": "2026-11-29T12:00:00Z"},
                    "attempts": [],
                }
            ).encode(),
            id="negative-seconds",
        ),
        pytest.param(
            json.dumps(
                {
                    "version": 1,
                    "uid": "u",
                    "goodput": {"wallSeconds": 5, "observedAt": "2026-11-29T12:00:00Z"},
                    "attempts": [{"attempt": 1, "created": "x"}] * 21,
                }
            ).encode(),
            id="more-than-20-attempts",
        ),
    ],
)
def test_a_hostile_copy_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="ledger record"):
        goodput.decode_ledger(data, "u")


def test_the_copy_is_restored_only_into_a_status_without_a_ledger() -> None:
    status = run_two_attempts(EVICTED)
    copy_ = (status.goodput, status.attempts)
    assert status.goodput is not None

    wiped = status.model_copy(update={"goodput": None, "attempts": []})
    assert goodput.restored(wiped, copy_) == status
    assert goodput.restored(status, (status.goodput, [])) is status
    assert goodput.restored(wiped, None) is wiped


def test_the_copy_follows_each_end_and_comes_back_after_a_wipe_and_a_restart() -> None:
    w = World()
    run = w.kube.runs[(NAMESPACE, RUN)]
    run["metadata"]["creationTimestamp"] = rfc3339(w.clock.now())
    w.reconciler.view.runs.put((NAMESPACE, RUN), copy.deepcopy(run))
    ledger_key = w.location.key(goodput.LEDGER_RECORD)
    w.clock.advance(5)
    w.reconcile()
    w.kube.nodes["n1"] = make_node("n1").build()
    w.report(PodBuilder.of(w.pod("r1-1")).running(since=rfc3339(w.clock.now())))
    w.clock.advance(30)
    w.reconcile()
    assert ledger_key not in w.bucket.objects  # no attempt ended yet

    w.bucket.commit(w.location, 10)
    w.report(
        PodBuilder.of(w.pod("r1-1"))
        .phase("Failed")
        .condition("DisruptionTarget", reason="EvictionByEvictionAPI")
    )
    w.reconcile()
    w.report(PodBuilder.of(w.pod("r1-2")).on_node().trainer_exited(0))
    w.clock.advance(30)
    w.reconcile()
    done = w.status()
    assert done["phase"] == "Succeeded" and len(done["attempts"]) == 2
    shown = TrainingRunStatus.model_validate(done)
    copied = goodput.decode_ledger(w.bucket.objects[ledger_key], w.builder.uid)
    assert copied == (shown.goodput, shown.attempts)

    # The status loses its ledger, the operator restarts: the next pass puts it back.
    wiped = {k: v for k, v in done.items() if k not in ("goodput", "attempts")}
    w.kube.runs[(NAMESPACE, RUN)]["status"] = wiped
    w.restart()
    w.reconciler.view.runs.put((NAMESPACE, RUN), copy.deepcopy(w.kube.runs[(NAMESPACE, RUN)]))
    w.reconcile()
    assert w.status() == done


def test_saves_the_integration_timed_are_checkpoint_stall() -> None:
    s = goodput.begun(TrainingRunStatus(attempt=1), None, at(10))
    record = replace(progress(1, 1, 20, 31, 80), save_seconds=6.0)
    s = goodput.seen(s, record)
    assert s.attempts[-1].save_seconds == 6.0
    running = goodput.shown(s, T0, at(80), finished=False).goodput
    assert running is not None
    assert (running.productive_seconds, running.stall_seconds) == (56.0, 6.0)

    s = goodput.ended(s, SUCCEEDED, 31, T0, at(85))
    g = goodput.shown(s, T0, at(85), finished=True).goodput

    assert g is not None
    assert g.productive_seconds == pytest.approx(62.0 - 6.0)  # step 1's 2 s, then 60 s
    assert g.stall_seconds == pytest.approx(6.0 + 5.0)  # the saves, and its end after step 31
    parts = [g.productive_seconds, g.lost_seconds, g.startup_seconds, g.waiting_seconds]
    assert sum(parts) + g.stall_seconds == pytest.approx(85.0)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 1e18, "7", True])
def test_a_hostile_save_time_is_dropped(value: object) -> None:
    raw = json.loads(encode(progress(1, 1, 20, 31, 80)))
    raw["save_seconds"] = value
    assert decode(json.dumps(raw).encode()).save_seconds is None


# -- the last word, after the attempt ended --------------------------------------------------

NOTICE = Outcome(End.PREEMPTED, R.PREEMPTION_NOTICE, "ended after preemption notice")


def noticed_at_25() -> TrainingRunStatus:
    """Attempt 1 ends on a notice, the operator having seen step 25 with 20 committed; its
    sidecar has not said its last word yet."""
    s = goodput.begun(TrainingRunStatus(attempt=1), None, at(10))
    s = goodput.seen(s, progress(1, 1, 20, 25, 68))
    return goodput.ended(s, NOTICE, 20, T0, at(85))


def test_the_last_word_after_the_end_corrects_the_attempt() -> None:
    s = noticed_at_25()
    assert goodput.awaits_last_word(s, at(85))
    assert s.attempts[-1].steps_lost == 5

    last = replace(progress(1, 1, 20, 31, 80), final=True)
    s = goodput.seen(s, last)

    closed = s.attempts[-1]
    assert (closed.last_step, closed.steps_lost, closed.last_word) == (31, 11, True)
    assert not goodput.awaits_last_word(s, at(86))
    g = goodput.shown(s, T0, at(85), finished=False).goodput
    assert g is not None and g.steps_lost.notice == 11
    # Seen once: a later record of that attempt changes nothing more.
    assert goodput.seen(s, replace(last, step=99)) == s


def test_the_resume_step_is_what_the_ended_attempt_committed() -> None:
    s = goodput.seen(noticed_at_25(), replace(progress(1, 1, 20, 31, 80), final=True))
    s = s.model_copy(update={"attempt": 2})

    s = goodput.begun(s, 31, at(90))  # its save at the notice committed after it ended

    first = s.attempts[0]
    assert (first.committed_step, first.steps_lost) == (31, 0)
    g = goodput.shown(s, T0, at(90), finished=False).goodput
    assert g is not None and g.steps_lost.notice == 0


def test_a_last_word_read_after_the_next_attempt_reported_still_counts() -> None:
    s = noticed_at_25().model_copy(update={"attempt": 2})
    s = goodput.begun(s, 20, at(90))
    s = goodput.seen(s, progress(2, 21, 100, 22, 101))
    assert goodput.awaits_last_word(s, at(101))

    s = goodput.seen(s, replace(progress(1, 1, 20, 31, 80), final=True))

    first, second = s.attempts
    assert (first.last_step, first.steps_lost, second.last_step) == (31, 11, 22)


@pytest.mark.parametrize(("after", "awaits"), [(179, True), (181, False)])
def test_the_last_word_is_awaited_for_a_while_only(after: float, awaits: bool) -> None:
    assert goodput.awaits_last_word(noticed_at_25(), at(85 + after)) is awaits


def test_an_older_record_of_the_ended_attempt_changes_nothing() -> None:
    s = goodput.seen(noticed_at_25(), progress(1, 1, 20, 31, 80))  # not final: step 31
    assert s.attempts[-1].last_step == 31
    assert goodput.seen(s, progress(1, 1, 20, 28, 75)) == s


def test_the_open_end_is_settled_when_the_next_attempt_ends() -> None:
    s = goodput.seen(noticed_at_25(), replace(progress(1, 1, 20, 31, 80), final=True))
    s = s.model_copy(update={"attempt": 2})
    s = goodput.begun(s, 20, at(90))
    s = goodput.seen(s, progress(2, 21, 100, 40, 140))
    s = goodput.ended(s, SUCCEEDED, 40, T0, at(145))

    assert s.goodput is not None and s.goodput.settled_through == 1
    assert s.goodput.settled.steps_lost.notice == 11
    g = goodput.shown(s, T0, at(150), finished=True).goodput
    assert g is not None and g.steps_lost.notice == 11 and g.wall_seconds == 145.0


def test_the_sidecars_last_word_after_a_notice_reaches_the_ledger() -> None:
    """A notice: the attempt ends as the trainer exits, its sidecar still uploads; the sidecar's
    last word (the trainer's last step) and the step the next attempt resumes from come after
    the end, and both correct the ended attempt."""

    w = World()
    run = w.kube.runs[(NAMESPACE, RUN)]
    run["metadata"]["creationTimestamp"] = rfc3339(w.clock.now())
    w.reconciler.view.runs.put((NAMESPACE, RUN), copy.deepcopy(run))
    key = w.location.key(PROGRESS_RECORD)

    def publish(step: int, final: bool = False) -> None:
        t = w.clock.now().timestamp()
        data = encode(ProgressRecord(step, 1, 1, t - step, t, final=final))
        w.bucket.put(key, data)
        if final:  # as the sidecar does: the last word also where the next attempt won't write
            w.bucket.put(w.location.key(LAST_WORD_RECORD), data)

    w.reconcile()
    w.kube.nodes["n1"] = make_node("n1").build()
    w.report(PodBuilder.of(w.pod("r1-1")).running(since=rfc3339(w.clock.now())))
    w.clock.advance(60)
    publish(30)
    w.bucket.commit(w.location, 30)
    w.reconcile()
    w.clock.advance(2)
    w.report(_trainer_saved_on_notice_and_exited(w, rfc3339(w.clock.now())))
    w.reconcile()  # ended: the record read is step 30, the sidecar still uploads the save
    ended = w.status()["attempts"][0]
    assert (ended["kind"], ended["lastStep"], ended.get("lastWord")) == ("notice", 30, None)

    publish(33, final=True)  # its last word: the trainer saved at step 33
    w.bucket.commit(w.location, 33)
    w.report(PodBuilder.of(w.pod("r1-1")).phase("Failed"))  # the sidecar stopped
    w.clock.advance(5)
    w.reconcile()

    assert w.kube.creates == ["r1-1", "r1-2"]
    first, second = w.status()["attempts"]
    assert (first["lastStep"], first["lastWord"], first["committedStep"]) == (33, True, 33)
    assert (first["stepsLost"], second["resumeStep"]) == (0, 33)
    assert w.status()["goodput"]["stepsLost"]["notice"] == 0


def test_a_ledger_wiped_twice_under_one_operator_comes_back_twice() -> None:
    w = World()
    run = w.kube.runs[(NAMESPACE, RUN)]
    run["metadata"]["creationTimestamp"] = rfc3339(w.clock.now())
    w.reconciler.view.runs.put((NAMESPACE, RUN), copy.deepcopy(run))
    w.reconcile()
    w.kube.nodes["n1"] = make_node("n1").build()
    w.report(PodBuilder.of(w.pod("r1-1")).on_node().trainer_exited(0))
    w.clock.advance(30)
    w.reconcile()
    done = w.status()
    assert done["phase"] == "Succeeded"

    for _ in range(2):
        wiped = {k: v for k, v in done.items() if k not in ("goodput", "attempts")}
        w.kube.runs[(NAMESPACE, RUN)]["status"] = wiped
        w.reconciler.view.runs.put((NAMESPACE, RUN), copy.deepcopy(w.kube.runs[(NAMESPACE, RUN)]))
        w.reconcile()
        restored = TrainingRunStatus.model_validate(w.status())
        assert restored == TrainingRunStatus.model_validate(done)


def test_the_next_attempts_progress_shows_while_the_last_word_is_awaited() -> None:
    """No last word comes from the ended attempt: the running one's progress still shows (the
    demo waited for attempt 2's ETA that never came when the wait replaced the regular reads)."""
    w = World()
    key = w.location.key(PROGRESS_RECORD)
    w.reconcile()
    w.kube.nodes["n1"] = make_node("n1").build()
    w.report(PodBuilder.of(w.pod("r1-1")).running(since=rfc3339(w.clock.now())))
    w.bucket.commit(w.location, 30)
    w.report(_trainer_saved_on_notice_and_exited(w, rfc3339(w.clock.now())))
    w.reconcile()
    w.report(PodBuilder.of(w.pod("r1-1")).phase("Failed"))  # its sidecar stopped, said nothing
    w.clock.advance(5)
    w.reconcile()
    w.report(PodBuilder.of(w.pod("r1-2")).running(since=rfc3339(w.clock.now())))
    w.clock.advance(60)
    t = w.clock.now().timestamp()
    w.bucket.put(key, encode(ProgressRecord(40, 2, 31, t - 20, t, total_steps=100)))
    w.reconcile()

    assert (w.status()["progress"]["attempt"], w.status()["progress"]["step"]) == (2, 40)
