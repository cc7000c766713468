"""The Waiting condition (decide.waits): why a start is held back, how often it is retried, when
a missing Secret fails the run, and that a started attempt ends the wait."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from trainingrun.api import TrainingRunStatus
from trainingrun.decide import reasons as R
from trainingrun.decide.status import condition
from trainingrun.decide.waits import (
    MAX_RETRY_SECONDS,
    MIN_RETRY_SECONDS,
    retry_seconds,
    secret_wait,
    wait,
    wait_over,
    waited_seconds,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("waited", "expected"),
    [
        (0, MIN_RETRY_SECONDS),  # a fresh wait: soon
        (7, MIN_RETRY_SECONDS),
        (100, 25),  # a quarter of the time waited
        (240, 60),
        (3600, MAX_RETRY_SECONDS),  # never less than once a minute
    ],
)
def test_retries_thin_out_as_a_wait_grows(waited: float, expected: float) -> None:
    assert retry_seconds(waited) == expected


def test_a_wait_sets_the_condition_reason_and_message_and_says_it_once() -> None:
    first = wait(TrainingRunStatus(), 3, R.STORAGE_UNAVAILABLE, "bucket down", at(0))

    c = condition(first.status, R.WAITING)
    assert c is not None
    assert (c.status, c.reason, c.message, c.observed_generation) == (
        "True",
        R.STORAGE_UNAVAILABLE,
        "bucket down",
        3,
    )
    assert (first.status.reason, first.status.message) == (R.STORAGE_UNAVAILABLE, "bucket down")
    assert first.status.phase == "Pending"
    assert first.event is not None and first.event.type == "Warning"

    again = wait(first.status, 3, R.STORAGE_UNAVAILABLE, "still down", at(100))
    assert again.event is None  # the same reason: not said again
    assert again.retry_after == 25
    assert waited_seconds(again.status, R.STORAGE_UNAVAILABLE, at(100)) == 100


def test_a_new_reason_starts_a_new_wait() -> None:
    first = wait(TrainingRunStatus(), 1, R.STORAGE_UNAVAILABLE, "down", at(0))
    other = wait(first.status, 1, R.POD_NAME_TAKEN, "taken", at(500))

    assert other.event is not None and other.event.reason == R.POD_NAME_TAKEN
    assert waited_seconds(other.status, R.POD_NAME_TAKEN, at(510)) == 10
    assert waited_seconds(other.status, R.STORAGE_UNAVAILABLE, at(510)) == 0
    assert [c.type for c in other.status.conditions] == [R.WAITING]


@pytest.mark.parametrize(
    ("waited", "fails"),
    [(0, False), (599, False), (600, True), (5000, True)],
)
def test_a_missing_secret_is_waited_for_up_to_the_limit(waited: float, fails: bool) -> None:
    first = secret_wait(TrainingRunStatus(), 1, "Secret ns/c does not exist", at(0), 600)
    assert first is not None and first.event is not None
    assert "retrying for up to 600 s" in first.status.message  # type: ignore[operator]

    later = secret_wait(first.status, 1, "Secret ns/c does not exist", at(waited), 600)

    assert (later is None) is fails


def test_a_limit_of_zero_fails_at_once() -> None:
    assert secret_wait(TrainingRunStatus(), 1, "missing", at(0), 0) is None


def test_the_start_ends_the_wait_and_a_run_that_never_waited_is_unchanged() -> None:
    never = TrainingRunStatus(reason=R.STARTED)
    assert wait_over(never, 1, at(0)) is never

    held = wait(TrainingRunStatus(), 1, R.POD_FORBIDDEN, "quota", at(0)).status
    over = wait_over(held, 2, at(30))

    c = condition(over, R.WAITING)
    assert c is not None
    assert (c.status, c.reason, c.observed_generation) == ("False", R.WAIT_OVER, 2)
    assert c.message is not None and "quota" in c.message
    assert waited_seconds(over, R.POD_FORBIDDEN, at(40)) == 0
