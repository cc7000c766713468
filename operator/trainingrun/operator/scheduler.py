"""When passes run: at once on an event, later for a backoff or a retry, and every run once per
resync interval. One thread keeps a heap of due times; passes run on a small worker pool. No
finalizer, and no thread per waiting run.

The periodic passes are a safety net and the refresh of each run's latest checkpoint; every
timed step (a backoff, a deadline) asks for its own pass. So their rate is bounded: at most
``resync_rate`` a second whatever the number of runs, the interval stretching past
``resync_seconds`` for a large fleet. Without the bound they grow with the fleet (5,000 runs
every 10 s is 500 passes a second) and every event's pass waits behind them.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

Key = tuple[str, str]  # (namespace, run name)


class Scheduler:
    """``run_pass(namespace, name)`` runs on the workers; ``known_runs()`` lists the runs the
    periodic resync visits (spread over the interval, not all at once)."""

    def __init__(
        self,
        run_pass: Callable[[str, str], None],
        known_runs: Callable[[], Iterable[Key]],
        resync_seconds: float,
        workers: int = 4,
        resync_rate: float = float("inf"),
    ) -> None:
        self._run_pass = run_pass
        self._known_runs = known_runs
        self._resync = resync_seconds
        self._resync_rate = resync_rate
        self._heap: list[tuple[float, Key]] = []
        self._due: dict[Key, float] = {}
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="trainingrun-pass")
        self._thread = threading.Thread(
            target=self._loop, name="trainingrun-scheduler", daemon=True
        )
        self._next_resync = time.monotonic() + resync_seconds

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def resync_interval(self, runs: int) -> float:
        """Seconds between two periodic passes of each run: the resync interval, or longer
        when ``runs`` passes in it would exceed ``resync_rate`` a second."""
        return max(self._resync, runs / self._resync_rate)

    def later(self, delay: float, key: Key) -> None:
        """A pass of ``key`` in ``delay`` seconds, unless an earlier one is already planned."""
        when = time.monotonic() + max(delay, 0.0)
        with self._cv:
            if key in self._due and self._due[key] <= when:
                return
            self._due[key] = when
            heapq.heappush(self._heap, (when, key))
            self._cv.notify()

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= self._next_resync:
                keys = list(self._known_runs())
                interval = self.resync_interval(len(keys))
                self._next_resync = now + interval
                for n, key in enumerate(keys):
                    self.later(interval * n / max(len(keys), 1), key)
            with self._cv:
                while self._heap and self._heap[0][0] <= time.monotonic():
                    when, key = heapq.heappop(self._heap)
                    if self._due.get(key) == when:
                        del self._due[key]
                        self._pool.submit(self._run_pass, *key)
                until_resync = self._next_resync - time.monotonic()
                wait = self._heap[0][0] - time.monotonic() if self._heap else until_resync
                self._cv.wait(timeout=max(0.01, min(wait, until_resync)))
