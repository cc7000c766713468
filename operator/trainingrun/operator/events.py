"""The operator's Events: posted from one thread of their own, so a pass never waits for them
(the status write, the pod delete and the pod create that follow an ending are what a
resubmission waits for). A pass hands an Event over only after the status write it reports has
landed. The queue is shared by every tenant and fair between namespaces (``FairQueue``): each
namespace's Events are posted in the order they were handed over, the namespaces in turns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import Any, Protocol

from trainingrun.operator.metrics import OperatorMetrics

log = logging.getLogger("trainingrun.operator")

# Events held while the API server falls behind: in all (a few MB at most), and per namespace,
# so that one tenant's flood neither drops nor delays another's Events.
CAPACITY = 2000
NAMESPACE_SHARE = 500
MESSAGE_MAX = 1024  # characters of a message kept (the API server's Event takes as many)


class EventSink(Protocol):
    """Where a pass hands its Events (``EventPoster``; a list in unit tests)."""

    def post(self, run: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...


class EventWriter(Protocol):
    """The API call that creates one Event (``trainingrun.operator.kube.Kube.event``)."""

    def event(self, run: dict[str, Any], type_: str, reason: str, message: str) -> None: ...


Item = tuple[dict[str, Any], str, str, str]  # (run's name, namespace and uid; type; reason; text)


class FairQueue:
    """Events waiting to be posted: one first-in-first-out lane per namespace, taken in turns, so
    a namespace that floods the queue delays and drops only its own Events. At most
    ``capacity`` Events in all and ``share`` per namespace: an Event beyond its namespace's
    share drops that namespace's oldest; one beyond the capacity drops the oldest of the
    namespace with the most waiting (the flooding one, never a quieter one)."""

    def __init__(self, capacity: int, share: int) -> None:
        self.capacity, self.share = capacity, max(1, min(share, capacity))
        self._lanes: OrderedDict[str, deque[Item]] = OrderedDict()
        self._size = 0
        self._taken = 0  # handed to the poster, not yet done
        self._closed = False
        self._cond = threading.Condition()

    def put(self, namespace: str, item: Item) -> str | None:
        """Queues ``item``; returns the namespace whose oldest Event it dropped, if any."""
        with self._cond:
            lane = self._lanes.get(namespace)
            dropped = None
            if lane is not None and len(lane) >= self.share:
                dropped = self._drop(namespace)
            elif self._size >= self.capacity:
                dropped = self._drop(max(self._lanes, key=lambda ns: len(self._lanes[ns])))
            self._lanes.setdefault(namespace, deque()).append(item)
            self._size += 1
            self._cond.notify()
            return dropped

    def _drop(self, namespace: str) -> str:
        lane = self._lanes[namespace]
        lane.popleft()
        self._size -= 1
        if not lane:
            del self._lanes[namespace]
        return namespace

    def take(self) -> Item | None:
        """The oldest Event of the namespace whose turn it is (waits for one); None once closed
        and empty. Each Event taken is ``done()`` after."""
        with self._cond:
            while not self._lanes and not self._closed:
                self._cond.wait()
            if not self._lanes:
                return None
            namespace, lane = next(iter(self._lanes.items()))
            item = lane.popleft()
            self._size -= 1
            self._taken += 1
            if lane:
                self._lanes.move_to_end(namespace)  # the next namespace's turn
            else:
                del self._lanes[namespace]
            return item

    def done(self) -> None:
        with self._cond:
            self._taken -= 1
            self._cond.notify_all()

    def wait_empty(self, timeout: float) -> bool:
        """Waits (at most ``timeout`` seconds) until every Event queued was posted."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._size or self._taken:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self) -> None:
        """No more Events: the poster posts what is queued, then stops."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class EventPoster:
    """Queues Events and posts them from its own thread, started by ``start()``. When the API
    server falls far behind, Events are dropped (counted in the metrics and the log) rather
    than held in memory without bound: at most ``capacity`` in all and ``namespace_share`` per
    namespace, a flooding namespace's oldest first (``FairQueue``), each message cut to
    ``MESSAGE_MAX`` characters."""

    def __init__(
        self,
        writer: EventWriter,
        metrics: OperatorMetrics | None = None,
        capacity: int = CAPACITY,
        namespace_share: int = NAMESPACE_SHARE,
    ) -> None:
        self._writer = writer
        self._metrics = metrics
        self._queue = FairQueue(capacity, namespace_share)
        self._dropped = 0
        self._thread = threading.Thread(target=self._loop, name="trainingrun-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def post(self, run: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        meta = run["metadata"]
        target = {"metadata": {k: meta[k] for k in ("name", "namespace", "uid")}}
        if self._metrics:
            self._metrics.transitions.labels(reason=reason).inc()
        item = (target, type_, reason, message[:MESSAGE_MAX])
        dropped = self._queue.put(str(meta["namespace"]), item)
        if dropped is None:
            return
        self._dropped += 1
        if self._metrics:
            self._metrics.events_dropped.inc()
        if self._dropped % 100 == 1:
            log.warning(
                "%d Events dropped so far (the last of namespace %s): the API server is not "
                "keeping up",
                self._dropped,
                dropped,
            )

    def flush(self, timeout: float) -> bool:
        """Waits (at most ``timeout`` seconds) until every Event handed over was posted."""
        return self._queue.wait_empty(timeout)

    def stop(self) -> None:
        self._queue.close()

    def _loop(self) -> None:
        while (item := self._queue.take()) is not None:
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
                self._queue.done()
