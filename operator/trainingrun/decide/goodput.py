"""The goodput ledger (``status.goodput``, ``status.attempts``): where a run's wall time went,
and the steps each preemption cost.

Display only: no decision reads it. Its facts are the operator's own (when an attempt's pod was
created, when and why the attempt ended, the newest committed step then) and the progress
records rank 0's sidecar published (the first and last step it saw the trainer at, and when; at
its end the sidecar publishes the trainer's last step whatever its interval). From them, each
attempt's time splits into:

- start-up: its pod's creation to the first step its sidecar saw (restore, image, framework);
- training, first step to last: the steps past its last commit are lost (``steps_lost``, at the
  attempt's own rate), the rest productive. A running attempt's steps count as productive until
  it ends;
- its end after its last step: checkpoint stall (the final save, the sidecar's upload), or lost
  when its node was lost (the pod went dark: nothing of that time is kept);

and the time with no pod (before an attempt's pod was created: queued, suspended, held, backoff)
is waiting. Goodput = productive / wall. Sums of ended attempts are kept in ``settled`` (the list
of attempts keeps the last ``MAX_ATTEMPTS``), so the totals stay whole over any number of them.

What it cannot see: a trainer without an integration publishes no step (its attempts are
start-up until their end, with no step lost); a node lost keeps its last publish (up to a
minute old) as the last step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import ValidationError

from trainingrun.api import (
    AttemptRecord,
    Goodput,
    LedgerTotals,
    StepsLost,
    TrainingRunStatus,
)
from trainingrun.checkpoint.progress import ProgressRecord
from trainingrun.contract import parse_time, rfc3339
from trainingrun.decide import reasons as R
from trainingrun.decide.classify import End, Outcome

MAX_ATTEMPTS = 20
# The ledger's copy in the run's prefix, written by the operator at each attempt's end and read
# back when the status has lost it; at most this big (20 attempts take about 8 KiB).
LEDGER_RECORD = "ledger.json"
LEDGER_MAX_BYTES = 64 * 1024
LEDGER_VERSION = 1
SIGKILL_EXIT = 137  # 128 + SIGKILL: the container runtime's exit code for a killed process
KIND_FIELDS = {"nodeLost": "node_lost"}  # a kind's field in StepsLost, where it differs
# How long after an attempt's end its sidecar's last word is looked for: its drain is bounded
# by the pod's grace period (60 s by default), its put by the call deadline.
LAST_WORD_WAIT_SECONDS = 180.0


# DisruptionTarget reasons of a node gone: the taint manager's for a node NotReady or
# unreachable, the pod garbage collector's for a node deleted.
NODE_GONE = frozenset({"DeletionByTaintManager", "DeletionByPodGC"})


def kind_of(outcome: Outcome) -> str | None:
    """The preemption kind an ending's lost steps count under; None for a success."""
    if outcome.end is End.SUCCEEDED:
        return None
    if outcome.reason == R.PREEMPTION_NOTICE:
        return "notice"
    if outcome.reason in (R.NODE_DELETED, R.NODE_NOT_READY) or outcome.reason in NODE_GONE:
        return "nodeLost"
    if outcome.end is End.PREEMPTED:  # the Eviction API, the scheduler, the kubelet, a delete
        return "eviction"
    if outcome.reason == R.OOM_KILLED or outcome.exit_code == SIGKILL_EXIT:
        return "sigkill"
    return "other"


def begun(status: TrainingRunStatus, resume_step: int | None, now: datetime) -> TrainingRunStatus:
    """``status`` with a record of its attempt, whose pod was created at ``now``. The attempt
    before it resumed from ``resume_step``: the step it had committed by its end, whatever the
    operator had seen of it when it ended (a notice's save commits after the trainer exited)."""
    status = _settle_open_end(status, committed=resume_step)
    attempts = [a for a in status.attempts if a.attempt != status.attempt]
    record = AttemptRecord(attempt=status.attempt, resume_step=resume_step, created=rfc3339(now))
    attempts = [*attempts, record][-MAX_ATTEMPTS:]
    return status.model_copy(update={"attempts": attempts})


def seen(status: TrainingRunStatus, record: ProgressRecord | None) -> TrainingRunStatus:
    """``status`` with an attempt's record updated from a progress record of that attempt: the
    running one's, or the last one that ended, whose sidecar publishes the trainer's last step
    after the attempt ended (its last word, once it has stopped). Another attempt's record, or
    none, changes nothing."""
    if record is None:
        return status
    current, last = _running(status), open_end(status)
    if current is not None and record.attempt == current.attempt:
        target = current
    elif (
        last is not None
        and record.attempt == last.attempt
        and not last.last_word
        and (record.final or record.step >= (last.last_step or 0))
    ):
        target = last
    else:
        return status
    updated = target.model_copy(
        update={
            "first_step": record.first_step,
            "first_step_time": rfc3339(_at(record.first_seen)),
            "last_step": record.step,
            "last_step_time": rfc3339(_at(record.observed)),
            "save_seconds": record.save_seconds,
            "last_word": record.final or None,
        }
    )
    if target.ended is not None:
        updated = _with_loss(updated, updated.committed_step)
    if updated == target:
        return status
    attempts = [updated if a is target else a for a in status.attempts]
    return status.model_copy(update={"attempts": attempts})


def awaits_last_word(status: TrainingRunStatus, now: datetime) -> bool:
    """Whether the last attempt that ended has not had its sidecar's last word yet, within
    ``LAST_WORD_WAIT_SECONDS`` of its end (a sidecar gone with its node never says it): the
    operator looks for it then (``checkpoint.progress.LAST_WORD_RECORD``), whatever its
    progress interval."""
    last = open_end(status)
    if last is None or last.last_word:
        return False
    end = parse_time(last.ended)
    return end is not None and (now - end).total_seconds() <= LAST_WORD_WAIT_SECONDS


def ended(
    status: TrainingRunStatus,
    outcome: Outcome,
    committed: int | None,
    created: datetime | None,
    now: datetime,
) -> TrainingRunStatus:
    """``status`` (still naming the attempt that ended) with that attempt closed: its ending,
    its kind, the steps it lost so far. It stays the ledger's open end (``seen`` and ``begun``
    may still correct it) until the next attempt ends; the one before goes into the settled
    totals."""
    current = _current(status)
    if current is None or current.ended is not None:
        return status
    status = _settle_open_end(status, committed=None, fold=True, created=created)
    now = parse_time(rfc3339(now)) or now  # whole seconds, as every time of the ledger
    closed = current.model_copy(
        update={"ended": rfc3339(now), "ending": outcome.reason, "kind": kind_of(outcome)}
    )
    closed = _with_loss(closed, committed)
    attempts = [*status.attempts[:-1], closed]
    return status.model_copy(update={"attempts": attempts})


def shown(
    status: TrainingRunStatus, created: datetime | None, now: datetime, finished: bool
) -> TrainingRunStatus:
    """``status`` with the ledger's figures made at ``now`` (at the last attempt's end for a
    finished run): the settled totals, the open end, then the running attempt, or the wait
    since the last one ended."""
    if created is None:
        return status
    ledger = status.goodput or _empty(created)
    since = parse_time(ledger.settled_at) or created
    totals = ledger.settled
    last = open_end(status)
    if last is not None:
        end = parse_time(last.ended) or since
        totals = _add(totals, _split(last, since, end, running=False))
        since = max(since, end)
    until = since if finished else max(now, since)
    current = _current(status)
    if not finished:
        if current is not None and current.ended is None:
            totals = _add(totals, _split(current, since, until, running=True))
        else:
            totals = _add(totals, LedgerTotals(waiting_seconds=_seconds(since, until)))
    wall = _seconds(created, until)
    percent = round(min(100.0, 100.0 * totals.productive_seconds / wall), 1) if wall else None
    figures = ledger.model_copy(
        update={
            **dict(totals),
            "wall_seconds": round(wall, 1),
            "percent": percent,
            "summary": None if percent is None else f"{percent:.0f}%",
            "observed_at": rfc3339(until),
        }
    )
    return status.model_copy(update={"goodput": figures})


def open_end(status: TrainingRunStatus) -> AttemptRecord | None:
    """The last attempt that ended, not yet in the settled totals."""
    through = status.goodput.settled_through if status.goodput else 0
    ended_ones = [a for a in status.attempts if a.ended is not None and a.attempt > through]
    return ended_ones[-1] if ended_ones else None


def _settle_open_end(
    status: TrainingRunStatus,
    committed: int | None,
    fold: bool = False,
    created: datetime | None = None,
) -> TrainingRunStatus:
    """The open end with the step the next attempt resumed from as its commit (``committed``),
    and, with ``fold``, moved into the settled totals."""
    last = open_end(status)
    if last is None:
        return status
    if committed is not None and committed > (last.committed_step or 0):
        fixed = _with_loss(last.model_copy(update={"committed_step": committed}), committed)
        attempts = [fixed if a is last else a for a in status.attempts]
        status = status.model_copy(update={"attempts": attempts})
        last = fixed
    if not fold:
        return status
    ledger = status.goodput or _empty(parse_time(last.ended) or _at(0))
    since = parse_time(ledger.settled_at) or created
    end = parse_time(last.ended)
    settled = _add(ledger.settled, _split(last, since, end or since or _at(0), running=False))
    ledger = ledger.model_copy(
        update={"settled": settled, "settled_at": last.ended, "settled_through": last.attempt}
    )
    return status.model_copy(update={"goodput": ledger})


def _with_loss(record: AttemptRecord, committed: int | None) -> AttemptRecord:
    lost = 0 if record.kind is None else lost_steps(record, committed)
    return record.model_copy(update={"committed_step": committed, "steps_lost": lost})


def encode_ledger(status: TrainingRunStatus, uid: str) -> bytes | None:
    """The ledger's copy for the run's prefix (``LEDGER_RECORD``): the run's uid, the goodput
    figures and the attempts; None while there is no ledger."""
    if status.goodput is None:
        return None
    record = {
        "version": LEDGER_VERSION,
        "uid": uid,
        "goodput": status.goodput.model_dump(mode="json", by_alias=True, exclude_none=True),
        "attempts": [
            a.model_dump(mode="json", by_alias=True, exclude_none=True) for a in status.attempts
        ],
    }
    return json.dumps(record, sort_keys=True).encode()


def decode_ledger(data: bytes, uid: str) -> tuple[Goodput, list[AttemptRecord]] | None:
    """The ledger in ``data`` when it is this run's (``uid``: a run created again under the
    same name starts its own); None when it is another's. Raises ValueError on anything that is
    not a ledger: over ``LEDGER_MAX_BYTES``, not JSON, of a newer version, figures out of range.
    """
    if len(data) > LEDGER_MAX_BYTES:
        raise ValueError(f"the ledger record is over {LEDGER_MAX_BYTES} bytes")
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ValueError("the ledger record is not valid JSON") from e
    if not isinstance(raw, dict) or raw.get("version") != LEDGER_VERSION:
        raise ValueError(f"the ledger record is not one of version {LEDGER_VERSION}")
    if raw.get("uid") != uid:
        return None
    attempts = raw.get("attempts")
    if not isinstance(attempts, list) or len(attempts) > MAX_ATTEMPTS:
        raise ValueError(f"the ledger record's attempts are not a list of {MAX_ATTEMPTS} at most")
    try:
        return Goodput.model_validate(raw.get("goodput")), [
            AttemptRecord.model_validate(a) for a in attempts
        ]
    except ValidationError as e:
        raise ValueError(
            f"the ledger record does not hold a ledger ({e.error_count()} errors)"
        ) from e


def restored(
    status: TrainingRunStatus, ledger: tuple[Goodput, list[AttemptRecord]] | None
) -> TrainingRunStatus:
    """``status`` with the ledger read back from the run's prefix when it has none of its own
    (the status was lost or wiped)."""
    if ledger is None or status.goodput is not None or status.attempts:
        return status
    figures, attempts = ledger
    return status.model_copy(update={"goodput": figures, "attempts": attempts})


def closed(status: TrainingRunStatus) -> list[AttemptRecord]:
    """The attempts of the list that ended: an end, or a correction of one (the sidecar's last
    word, the step the next attempt resumed from), changes them."""
    return [a for a in status.attempts if a.ended is not None]


def lost_steps(record: AttemptRecord, committed: int | None) -> int:
    """Steps ``record``'s attempt trained past the newest commit (or its resume step when it
    committed nothing newer); 0 when its sidecar published no step."""
    if record.last_step is None:
        return 0
    kept = max(committed or 0, record.resume_step or 0)
    return max(0, record.last_step - kept)


@dataclass(frozen=True)
class _Times:
    created: datetime
    first: datetime | None
    last: datetime | None


def _split(
    record: AttemptRecord, settled_at: datetime | None, end: datetime, running: bool
) -> LedgerTotals:
    """The time from the last settlement to ``end`` for the attempt of ``record``: waiting
    before its pod, start-up, training (productive and lost) and its end after its last step."""
    t = _times(record, end)
    waiting = _seconds(settled_at, t.created) if settled_at is not None else 0.0
    if t.first is None or t.last is None:  # no step seen: start-up all along
        return LedgerTotals(
            waiting_seconds=waiting,
            startup_seconds=_seconds(t.created, end),
            steps_lost=_by_kind(record),
        )
    made = (record.last_step or 0) - (record.first_step or 0)
    per_step = _seconds(t.first, t.last) / made if made > 0 else 0.0
    # The sidecar sees the trainer every few seconds: the steps made before it first saw one
    # (from the resume step) were training, at the attempt's rate, not start-up.
    unseen = max(0, (record.first_step or 0) - (record.resume_step or 0))
    early = min(_seconds(t.created, t.first), unseen * per_step)
    startup = _seconds(t.created, t.first) - early
    saves = record.save_seconds or 0.0  # within training: the trainer stood still for them
    if running:  # still training: its steps are kept until it ends
        training = early + _seconds(t.first, end)
        return LedgerTotals(
            waiting_seconds=waiting,
            startup_seconds=startup,
            productive_seconds=training - min(saves, training),
            stall_seconds=min(saves, training),
        )
    training = early + _seconds(t.first, t.last)
    made += unseen
    lost = record.steps_lost or 0
    lost_s = training if made <= 0 and lost else min(training, training * lost / max(made, 1))
    stalled = min(saves, training - lost_s)
    tail = _seconds(t.last, end)
    gone = record.kind == "nodeLost"
    return LedgerTotals(
        waiting_seconds=waiting,
        startup_seconds=startup,
        productive_seconds=training - lost_s - stalled,
        lost_seconds=lost_s + (tail if gone else 0.0),
        stall_seconds=stalled + (0.0 if gone else tail),
        steps_lost=_by_kind(record),
    )


def _by_kind(record: AttemptRecord) -> StepsLost:
    if record.kind is None or not record.steps_lost:
        return StepsLost()
    return StepsLost(**{KIND_FIELDS.get(record.kind, record.kind): record.steps_lost})


def _times(record: AttemptRecord, end: datetime) -> _Times:
    """The record's times, each within [created, end] (the sidecar's clock is another
    machine's)."""
    created = min(parse_time(record.created) or end, end)

    def within(value: str | None) -> datetime | None:
        t = parse_time(value)
        return None if t is None else min(max(t, created), end)

    first, last = within(record.first_step_time), within(record.last_step_time)
    if first is not None and last is not None and last < first:
        last = first
    return _Times(created, first, last)


def _current(status: TrainingRunStatus) -> AttemptRecord | None:
    if status.attempts and status.attempts[-1].attempt == status.attempt:
        return status.attempts[-1]
    return None


def _running(status: TrainingRunStatus) -> AttemptRecord | None:
    current = _current(status)
    return current if current is not None and current.ended is None else None


def _empty(at: datetime) -> Goodput:
    return Goodput(wall_seconds=0.0, observed_at=rfc3339(at))


def _add(a: LedgerTotals, b: LedgerTotals) -> LedgerTotals:
    steps = {k: getattr(a.steps_lost, k) + getattr(b.steps_lost, k) for k in StepsLost.model_fields}
    return LedgerTotals(
        productive_seconds=round(a.productive_seconds + b.productive_seconds, 3),
        lost_seconds=round(a.lost_seconds + b.lost_seconds, 3),
        startup_seconds=round(a.startup_seconds + b.startup_seconds, 3),
        waiting_seconds=round(a.waiting_seconds + b.waiting_seconds, 3),
        stall_seconds=round(a.stall_seconds + b.stall_seconds, 3),
        steps_lost=StepsLost(**steps),
    )


def _seconds(start: datetime | None, end: datetime | None) -> float:
    if start is None or end is None:
        return 0.0
    return max(0.0, (end - start).total_seconds())


def _at(unix: float) -> datetime:
    return datetime.fromtimestamp(unix, UTC)
