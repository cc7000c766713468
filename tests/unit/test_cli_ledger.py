"""``trainingrun status``'s goodput line and attempts timeline (``cli.ledger``), from a ledger
``decide.goodput`` made: an eviction that lost 11 steps, then a resume that succeeded."""

from __future__ import annotations

from tests.unit.test_goodput import EVICTED, run_two_attempts
from trainingrun.cli import ledger


def test_the_goodput_line_says_where_the_time_went() -> None:
    status = run_two_attempts(EVICTED).model_dump(by_alias=True, exclude_none=True)

    line = ledger.goodput_line(status["goodput"])

    assert line.startswith("62% of 2m45s: productive 1m41s, lost 22s, start-up 11s, waiting 20s,")
    assert "checkpoint stall 10s; steps lost: eviction 11 (at 2026-11-29T12:02:45Z)" in line
    assert ledger.goodput_line({}) == ""


def test_the_timeline_has_a_row_per_attempt_from_the_runs_creation() -> None:
    status = run_two_attempts(EVICTED).model_dump(by_alias=True, exclude_none=True)

    rows = ledger.attempt_rows(status["attempts"], "2026-11-29T12:00:00Z")

    assert rows == [
        [
            "  1",
            "+10s",
            "1 at +20s",
            "31 at +1m20s",
            "20",
            "+1m25s",
            "DisruptionTarget (eviction)",
            "11",
        ],
        ["  2", "+1m35s", "21 at +1m40s", "61 at +2m40s", "61", "+2m45s", "Succeeded", "0"],
    ]


def test_a_running_attempt_and_an_unknown_creation_time() -> None:
    attempts = [{"attempt": 3, "created": "2026-11-29T12:00:10Z"}]

    assert ledger.attempt_rows(attempts, None) == [
        ["  3", "2026-11-29T12:00:10Z", "-", "-", "", "-", "running", ""]
    ]
