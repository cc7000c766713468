"""The operator's Events: posted from one thread of their own, in the order they were handed
over, so a pass never waits for them (the status write, the pod delete and the pod create that
follow an ending are what a resubmission waits for). A pass hands an Event over only after the
status write it reports has landed.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

from trainingrun.opmetrics import OperatorMetrics

log = logging.getLogger("trainingrun.operator")


class EventSink(Protocol):
    """Where a pass hands its Events (``EventPoster``; a list in unit tests)."""

    def post(self, run: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...


class EventWriter(Protocol):
    """The API call that creates one Event (``trainingrun.kube.Kube.event``)."""

    def event(self, run: dict[str, Any], type_: str, reason: str, message: str) -> None: ...


class EventPoster:
    """Queues Events and posts them from its own thread, started by ``start()``. When the API
    server falls far behind, Events beyond ``capacity`` are dropped (counted in the metrics and
    the log) rather than held in memory without bound."""

    def __init__(
        self, writer: EventWriter, metrics: OperatorMetrics | None = None, capacity: int = 2000
    ) -> None:
        self._writer = writer
        self._metrics = metrics
        self._queue: queue.Queue[tuple[dict[str, Any], str, str, str] | None] = queue.Queue(
            capacity
        )
        self._dropped = 0
        self._thread = threading.Thread(target=self._loop, name="trainingrun-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def post(self, run: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        meta = run["metadata"]
        target = {"metadata": {k: meta[k] for k in ("name", "namespace", "uid")}}
        if self._metrics:
            self._metrics.transitions.labels(reason=reason).inc()
        try:
            self._queue.put_nowait((target, type_, reason, message))
        except queue.Full:
            self._dropped += 1
            if self._metrics:
                self._metrics.events_dropped.inc()
            if self._dropped % 100 == 1:
                log.warning(
                    "%d Events dropped so far: the API server is not keeping up", self._dropped
                )

    def flush(self, timeout: float) -> bool:
        """Waits (at most ``timeout`` seconds) until every Event handed over was posted."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self._queue.unfinished_tasks

    def stop(self) -> None:
        with contextlib.suppress(queue.Full):  # a daemon thread: it dies with the process
            self._queue.put(None, timeout=1.0)

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            run, type_, reason, message = item
            try:
                self._writer.event(run, type_, reason, message)
            except Exception as e:  # Events are best effort; the status is the record
                log.warning(
                    "%s/%s: Event %s not posted: %s",
                    run["metadata"]["namespace"],
                    run["metadata"]["name"],
                    reason,
                    e,
                )
            finally:
                self._queue.task_done()
        self._queue.task_done()
