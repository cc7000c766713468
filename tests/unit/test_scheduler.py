"""The pass scheduler's periodic passes are bounded in rate, whatever the number of runs.

Covers:

- ``resync_interval``: the resync interval for a small fleet, stretched to runs / rate past
  rate x interval runs; no bound by default;
- a real Scheduler on its threads: 40 runs with a 0.2 s interval and a rate of 40 a second are
  each passed about once a second, not five times; an event's pass (``later(0)``) runs at once
  while the periodic ones are spread out.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from trainingrun.operator.scheduler import Scheduler


def _noop(namespace: str, name: str) -> None:
    del namespace, name


@pytest.mark.parametrize(
    ("runs", "seconds", "rate", "expected"),
    [
        pytest.param(0, 10.0, 20.0, 10.0, id="no-runs"),
        pytest.param(100, 10.0, 20.0, 10.0, id="small-fleet-keeps-the-interval"),
        pytest.param(200, 10.0, 20.0, 10.0, id="at-the-bound"),
        pytest.param(1000, 10.0, 20.0, 50.0, id="1000-runs-stretch"),
        pytest.param(5000, 10.0, 20.0, 250.0, id="5000-runs-stretch"),
        pytest.param(5000, 10.0, float("inf"), 10.0, id="unbounded-by-default"),
    ],
)
def test_resync_interval(runs: int, seconds: float, rate: float, expected: float) -> None:
    scheduler = Scheduler(_noop, list, seconds, workers=1, resync_rate=rate)
    assert scheduler.resync_interval(runs) == pytest.approx(expected)


def test_periodic_passes_keep_to_the_rate_and_events_go_first() -> None:
    runs = [("ns", f"r{i}") for i in range(40)]
    passes: Counter[tuple[str, str]] = Counter()
    event_done = threading.Event()
    lock = threading.Lock()

    def run_pass(namespace: str, name: str) -> None:
        with lock:
            passes[(namespace, name)] += 1
        if name == "event":
            event_done.set()

    # 40 runs at 40 a second: one round a second, where the 0.2 s interval alone makes five.
    scheduler = Scheduler(run_pass, lambda: runs, 0.2, workers=2, resync_rate=40.0)
    scheduler.start()
    try:
        time.sleep(0.5)  # the first round has begun, spread over a second
        asked = time.monotonic()
        scheduler.later(0.0, ("ns", "event"))
        assert event_done.wait(5.0)
        event_wait = time.monotonic() - asked
        time.sleep(2.0)
    finally:
        scheduler.stop()

    periodic = sum(n for key, n in passes.items() if key[1] != "event")
    # 2.5 s after the first round began at 0.2 s: at most three rounds of 40 (unbounded, the
    # same time holds about twelve).
    assert 40 <= periodic <= 3 * 40
    assert event_wait < 0.5
