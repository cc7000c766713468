"""Progress and ETA (issue 47, first slice): the trainer's figures from its progress file to
``status.progress``.

Covers:

- ``decide.progress.shown``: percent, rate and ETA from the record, the rate counted from the
  attempt's first step (a resume keeps the ETA), no total, no rate yet, a record of another
  attempt, a run past its total, an ETA beyond reason;
- ``decide.progress.marked``: the record read this pass replaces the status's progress, none
  read keeps it, a run not Running shows no rate or ETA;
- ``checkpoint.progress.decode``: the bounded reading of the record a pod wrote (garbage, too
  large, a step of 10^18, NaN and negative rates, times out of range, deep nesting);
- ``checkpoint.local.read_progress``: the trainer's file read no further than its cap, its rates;
- the sidecar's ``ProgressPublisher``: rank 0's record put once a minute at most and on change
  only, the first step of the attempt kept (also by a restarted sidecar, from the record its
  attempt published), a failed put costs the display only.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.unit.builders import make_run
from tests.unit.fakes import DictStore
from trainingrun.agent.progress import ProgressPublisher, start_publishing
from trainingrun.api import TrainingRunStatus
from trainingrun.checkpoint import local
from trainingrun.checkpoint.progress import (
    MAX_BYTES,
    PROGRESS_RECORD,
    ProgressError,
    ProgressRecord,
    decode,
    encode,
)
from trainingrun.contract import ENV_PROGRESS_SECONDS, SYNC_CONTAINER
from trainingrun.decide.pod import build_pod
from trainingrun.decide.progress import duration, marked, shown
from trainingrun.operator.settings import OperatorSettings
from trainingrun.storage.opener import Location, StorageUnavailable

T = 1_800_000_000.0  # the sidecar's clock, Unix seconds
NOW = datetime.fromtimestamp(T, UTC)


def record(**changes: object) -> ProgressRecord:
    fields: dict[str, object] = {
        "step": 600,
        "attempt": 2,
        "first_step": 400,
        "first_seen": T - 200,
        "observed": T,
        "total_steps": 1000,
    }
    fields.update(changes)
    return ProgressRecord(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rec", "percent", "rate", "eta", "summary"),
    [
        # 200 steps in 200 s since the attempt resumed at 400: 400 left, 400 s.
        pytest.param(record(), 60.0, 1.0, 400, "60%", id="resumed-rate-from-attempt-start"),
        # The same trainer, first attempt: 600 steps in 600 s, the same rate and ETA.
        pytest.param(
            record(attempt=2, first_step=0, first_seen=T - 600), 60.0, 1.0, 400, "60%", id="fresh"
        ),
        pytest.param(record(total_steps=None), None, 1.0, None, "step 600", id="no-total"),
        # 5 s after the first step seen: too soon for a rate.
        pytest.param(record(first_seen=T - 5), 60.0, None, None, "60%", id="too-soon-for-a-rate"),
        pytest.param(record(first_step=599), 60.0, None, None, "60%", id="one-step-no-rate"),
        # A record of attempt 1 while the run is at 2: the step, no rate measured on a gone pod.
        pytest.param(record(attempt=1), 60.0, None, None, "60%", id="other-attempt"),
        pytest.param(record(step=1200, first_step=1100), 100.0, 0.5, 0, "100%", id="past-total"),
        # A step a year: the ETA is beyond reason and not shown.
        pytest.param(
            record(step=3, first_step=1, first_seen=T - 2 * 365 * 86400, total_steps=10**9),
            0.0,
            0.0,
            None,
            "0%",
            id="eta-beyond-reason",
        ),
    ],
)
def test_shown_progress(
    rec: ProgressRecord, percent: float | None, rate: float | None, eta: int | None, summary: str
) -> None:
    p = shown(rec, attempt=2, now=NOW + timedelta(seconds=30))
    assert (p.step, p.percent, p.steps_per_second, p.eta_seconds, p.summary) == (
        rec.step,
        percent,
        rate,
        eta,
        summary,
    )
    assert p.observed_at == "2027-01-15T08:00:00Z"
    if eta:  # counted from observedAt; the display from the status write, 30 s later
        assert p.estimated_completion_time == "2027-01-15T08:06:40Z"
        assert p.eta == "6m10s"


def test_resume_does_not_collapse_the_eta() -> None:
    """The trainer ran 0 -> 500 at 1 step/s, was preempted, resumed from 400 and ran 100 steps
    in 100 s: a rate from the global step over the new process's time (500 in 100 s) would
    say 100 s left; the attempt's own steps say 500."""
    rec = record(step=500, first_step=400, first_seen=T - 100)
    assert shown(rec, attempt=2, now=NOW).eta_seconds == 500


@pytest.mark.parametrize(
    ("phase", "read", "eta_shown"),
    [
        pytest.param("Running", True, True, id="running-read"),
        pytest.param("Running", False, True, id="running-not-read-keeps"),
        pytest.param("Backoff", True, False, id="backoff-no-eta"),
        pytest.param("Succeeded", False, False, id="ended-drops-eta"),
    ],
)
def test_marked_status(phase: str, read: bool, eta_shown: bool) -> None:
    before = shown(record(step=500, observed=T - 60, first_seen=T - 160), 2, NOW)
    status = TrainingRunStatus(phase=phase, attempt=2, progress=before)
    after = marked(status, record() if read else None, NOW)
    assert after.progress is not None
    assert after.progress.step == (600 if read else 500)
    assert (after.progress.eta is not None) is eta_shown
    assert (after.progress.steps_per_second is not None) is eta_shown


def test_the_same_record_read_again_changes_nothing() -> None:
    """Read a minute later, an unchanged record would only move the ETA's text: no write."""
    status = marked(TrainingRunStatus(phase="Running", attempt=2), record(), NOW)
    assert marked(status, record(), NOW + timedelta(seconds=60)) is status
    assert marked(status, record(step=601), NOW + timedelta(seconds=60)) is not status


def test_marked_without_progress_changes_nothing() -> None:
    status = TrainingRunStatus(phase="Running", attempt=2)
    assert marked(status, None, NOW) is status


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45.9, "45s"), (330, "5m30s"), (4320, "1h12m"), (3 * 86400 + 4 * 3600, "3d4h")],
)
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_record_round_trip() -> None:
    rec = record(samples_per_second=12.5, tokens_per_second=None)
    assert decode(encode(rec)) == rec
    assert len(encode(rec)) < 400


def raw(**changes: object) -> bytes:
    fields = json.loads(encode(record()))
    fields.update(changes)
    return json.dumps(fields).encode()


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x00garbage", id="garbage"),
        pytest.param(b"[1, 2]", id="not-an-object"),
        pytest.param(b"[" * 100_000, id="deep-nesting"),
        pytest.param(raw(pad=" " * MAX_BYTES), id="over-the-cap"),
        pytest.param(raw(step=10**18), id="step-10e18"),
        pytest.param(raw(step=-1), id="negative-step"),
        pytest.param(raw(step=1.5), id="fractional-step"),
        pytest.param(raw(step=True), id="boolean-step"),
        pytest.param(raw(total_steps=0), id="zero-total"),
        pytest.param(raw(observed=float("nan")), id="nan-time"),
        pytest.param(raw(observed=10**400), id="huge-time"),
        pytest.param(raw(observed=T - 1000), id="observed-before-first-seen"),
        pytest.param(raw(version=2), id="newer-version"),
        pytest.param(b'{"step": ' + b"9" * 5000 + b"}", id="digits"),
    ],
)
def test_hostile_record_is_refused(data: bytes) -> None:
    with pytest.raises(ProgressError):
        decode(data)


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), -3.0, 0, 1e13, "12", True, 10**400],
    ids=["nan", "inf", "negative", "zero", "too-large", "string", "boolean", "huge-int"],
)
def test_hostile_rate_is_dropped(value: object) -> None:
    text = encode(record()).decode().replace('"samples_per_second": null', "SPS")
    data = text.replace("SPS", f'"samples_per_second": {json.dumps(value)}').encode()
    rec = decode(data)
    assert rec.samples_per_second is None
    assert rec.step == 600


def test_first_step_is_never_after_the_step() -> None:
    assert decode(raw(first_step=900)).first_step == 600


def write_file(folder: Path, text: str) -> None:
    path = local.control_path(folder, local.PROGRESS)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_local_progress_carries_rates_save_time_and_when(tmp_path: Path) -> None:
    local.write_progress(tmp_path, local.Progress(7, 100, samples_per_second=64.0))
    read = local.read_progress(tmp_path)
    assert read is not None
    mtime = local.control_path(tmp_path, local.PROGRESS).stat().st_mtime
    assert read == local.Progress(7, 100, 64.0) and read.written_at == mtime

    local.write_progress(tmp_path, local.Progress(8, 100, save_seconds=2.5))
    assert (read := local.read_progress(tmp_path)) is not None and read.save_seconds == 2.5


@pytest.mark.parametrize(
    ("written_at", "published_at"),
    [
        pytest.param(T - 30, T - 30, id="the-files-time"),
        pytest.param(None, T, id="no-time-read-now"),
        pytest.param(T + 60, T, id="a-time-to-come-read-now"),
        pytest.param(T - 7200, T, id="older-than-an-hour-read-now"),
    ],
)
def test_a_record_says_when_the_step_was_reached(
    written_at: float | None, published_at: float
) -> None:
    store = DictStore()
    pub = publisher(store, Ticking())
    assert pub.check(local.Progress(5, 100, written_at=written_at))

    record = decode(store.objects[pub.key])
    assert (record.first_seen, record.observed) == (published_at, published_at)


def test_a_save_at_the_same_step_is_published_with_its_time() -> None:
    store = DictStore()
    clock = Ticking()
    pub = publisher(store, clock)
    assert pub.check(local.Progress(5, 100, save_seconds=1.0))
    clock.t += 120
    assert pub.check(local.Progress(5, 100, save_seconds=4.0))
    assert decode(store.objects[pub.key]).save_seconds == 4.0


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"step": 5' + " " * 10_000 + "}", id="over-the-cap"),
        pytest.param('{"step": NaN}', id="nan-step"),
        pytest.param('{"step": 1e999}', id="infinite-step"),
        pytest.param("[1]", id="a-list"),
        pytest.param('{"step": 5, "max_steps": "x"}', id="bad-total"),
    ],
)
def test_local_progress_hostile_file(tmp_path: Path, text: str) -> None:
    write_file(tmp_path, text)
    assert local.read_progress(tmp_path) is None


class Ticking:
    def __init__(self) -> None:
        self.t = T

    def __call__(self) -> float:
        return self.t


class FailingStore(DictStore):
    def __init__(self) -> None:
        super().__init__()
        self.fail = True

    def put(self, key: str, data: bytes, **kwargs: object) -> str:
        if self.fail:
            raise StorageUnavailable("endpoint down")
        return super().put(key, data)


RUN = Location("s3", "bucket", "runs/ml/r1")
KEY = RUN.key(PROGRESS_RECORD)


def publisher(store: DictStore, clock: Ticking) -> ProgressPublisher:
    return ProgressPublisher(store, RUN, attempt=3, clock=clock, monotonic=clock)


def test_publisher_puts_once_a_minute_and_on_change() -> None:
    store, clock = DictStore(), Ticking()
    pub = publisher(store, clock)
    assert pub.check(local.Progress(40, 100))  # the first step seen: put at once
    first = decode(store.objects[KEY])
    assert (first.step, first.first_step, first.attempt, first.total_steps) == (40, 40, 3, 100)
    clock.t += 30
    assert not pub.check(local.Progress(45, 100))  # within the minute
    clock.t += 31
    assert not pub.check(local.Progress(40, 100))  # a minute on, but no change since the put
    assert pub.check(local.Progress(70, 100, samples_per_second=float("nan")))
    rec = decode(store.objects[KEY])
    assert (rec.step, rec.first_step, rec.first_seen, rec.observed) == (70, 40, T, T + 61)
    assert rec.samples_per_second is None


@pytest.mark.parametrize(
    ("progress", "total"),
    [
        pytest.param(local.Progress(10**18, 100), None, id="step-10e18-not-published"),
        pytest.param(local.Progress(-1, 100), None, id="negative-step-not-published"),
        pytest.param(local.Progress(5, 0), "none", id="zero-total-dropped"),
        pytest.param(local.Progress(5, 10**18), "none", id="huge-total-dropped"),
    ],
)
def test_publisher_bounds_what_it_puts(progress: local.Progress, total: str | None) -> None:
    store = DictStore()
    published = publisher(store, Ticking()).check(progress)
    assert published is (total is not None)
    if total is not None:
        assert decode(store.objects[KEY]).total_steps is None


@pytest.mark.parametrize(
    ("attempt", "first"),
    [pytest.param(3, (40, T - 600), id="same-attempt-kept"), pytest.param(2, (70, T), id="older")],
)
def test_a_restarted_sidecar_keeps_the_attempts_first_step(
    attempt: int, first: tuple[int, float]
) -> None:
    """The kubelet restarts a sidecar that exits: the new one counts the rate from the first
    step its attempt's record gives, not from its own start."""
    store, clock = DictStore(), Ticking()
    earlier = ProgressRecord(60, attempt, 40, T - 600, T - 300, total_steps=100)
    store.put(KEY, encode(earlier))
    publisher(store, clock).check(local.Progress(70, 100))
    rec = decode(store.objects[KEY])
    assert (rec.first_step, rec.first_seen) == first


def test_a_garbage_record_left_in_the_bucket_is_ignored() -> None:
    store, clock = DictStore(), Ticking()
    store.put(KEY, b"\x00" * 10_000)
    assert publisher(store, clock).check(local.Progress(70, 100))
    assert decode(store.objects[KEY]).first_step == 70


def test_step_going_back_restarts_the_measure() -> None:
    store, clock = DictStore(), Ticking()
    pub = publisher(store, clock)
    pub.check(local.Progress(500, 1000))
    clock.t += 120
    pub.check(local.Progress(400, 1000))  # the trainer restarted in the pod from step 400
    rec = decode(store.objects[KEY])
    assert (rec.first_step, rec.first_seen) == (400, T + 120)


def test_failed_put_costs_the_display_only(caplog: pytest.LogCaptureFixture) -> None:
    store, clock = FailingStore(), Ticking()
    pub = publisher(store, clock)
    assert not pub.check(local.Progress(1, 10))
    clock.t += 61
    assert not pub.check(local.Progress(2, 10))
    warnings = [r for r in caplog.records if "cannot publish" in r.getMessage()]
    assert len(warnings) == 1  # once per outage
    store.fail = False
    clock.t += 61
    assert pub.check(local.Progress(3, 10))
    assert decode(store.objects[KEY]).step == 3


def test_publishing_thread_reads_the_file_and_stops(tmp_path: Path) -> None:
    store, stopping = DictStore(), threading.Event()
    local.write_progress(tmp_path, local.Progress(9, 90))
    thread = start_publishing(publisher(store, Ticking()), tmp_path, stopping, poll_seconds=0.01)
    for _ in range(500):
        if KEY in store.objects:
            break
        stopping.wait(0.01)
    local.write_progress(tmp_path, local.Progress(11, 90))  # the trainer's last step
    stopping.set()  # the kubelet stops the sidecar: the trainer has exited
    thread.join(5)
    assert not thread.is_alive()
    last = decode(store.objects[KEY])
    assert (last.step, last.final) == (11, True)  # said at once, before the drain


def test_inactive_publisher_puts_nothing(tmp_path: Path) -> None:
    store, stopping = DictStore(), threading.Event()
    local.write_progress(tmp_path, local.Progress(9, 90))
    pub = publisher(store, Ticking())
    thread = start_publishing(pub, tmp_path, stopping, lambda: False, poll_seconds=0.01)
    stopping.wait(0.2)
    stopping.set()
    thread.join(5)
    assert KEY not in store.objects


@pytest.mark.parametrize(
    ("env", "shown"), [({}, "60"), ({"TRAININGRUN_PROGRESS_REFRESH_SECONDS": "5"}, "5")]
)
def test_the_sidecar_publishes_as_often_as_the_operator_reads(
    env: dict[str, str], shown: str
) -> None:
    agent = OperatorSettings.from_env(env).agent
    pod = build_pod(make_run("r1").ref(), 1, None, agent, epoch=1)

    sync = next(c for c in pod["spec"]["initContainers"] if c["name"] == SYNC_CONTAINER)
    assert {e["name"]: e.get("value") for e in sync["env"]}[ENV_PROGRESS_SECONDS] == shown


def test_the_last_word_is_put_whatever_the_interval() -> None:
    store = DictStore()
    clock = Ticking()
    pub = publisher(store, clock)
    assert pub.check(local.Progress(step=10, max_steps=None))
    clock.t += 5  # within the minute: a check puts nothing, the last word does
    assert not pub.check(local.Progress(step=12, max_steps=None))
    assert pub.final(local.Progress(step=13, max_steps=None))
    assert decode(store.objects[pub.key]).step == 13


def test_the_last_word_is_also_kept_where_the_next_attempt_does_not_write() -> None:
    store = DictStore()
    pub = publisher(store, Ticking())
    assert pub.check(local.Progress(10, 100))
    assert pub.last_key not in store.objects  # regular records go to progress.json only

    assert pub.final(local.Progress(12, 100))

    last = decode(store.objects[pub.last_key])
    assert (last.step, last.final) == (12, True)
    assert decode(store.objects[pub.key]) == last
