"""Runs queued with Kueue (the run's ``kueue.x-k8s.io/queue-name`` label): gather and apply
around the pure ``trainingrun.decide.workload``. A queued run's Workload is read at each of its
passes, which come back every ``POLL_SECONDS`` while it is queued.

At each pass of such a run: whether Kueue is installed (asked of the API server, remembered for
a while), its Workload (created when missing, shaped like the attempt's pods), and what Kueue's
answer means for the run (``decide.hold.Queue``, which ``plan()`` follows). After the pass: a
Workload Kueue evicted gets its quota back once the run has no pod left, and one whose run
ended is marked Finished.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

from trainingrun.api import TrainingRunStatus
from trainingrun.decide import reasons as R
from trainingrun.decide import workload as W
from trainingrun.decide.hold import Queue
from trainingrun.decide.pod import AgentSettings, RunRef, build_pod
from trainingrun.decide.status import is_finished, is_true
from trainingrun.kube import Forbidden, Invalid, NotServed

log = logging.getLogger("trainingrun.operator")

INSTALLED_TTL_SECONDS = 30.0  # how long the answer "is Kueue installed" is trusted
# A queued run's pass comes back this often to read its Workload: admission, eviction and
# requeueing are seen within this time. (Polled, not watched: the operator's watch of a CRD
# that is deleted, as when Kueue is uninstalled, ends the operator's watching altogether.)
POLL_SECONDS = 2.0


class ObjectApi(Protocol):
    """The calls of ``trainingrun.kube.Kube`` this module makes."""

    def has_api(self, group: str, version: str, plural: str) -> bool: ...
    def get_object(
        self, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None: ...
    def create_object(
        self, group: str, version: str, plural: str, body: dict[str, Any]
    ) -> dict[str, Any] | None: ...
    def replace_object_status(
        self, group: str, version: str, plural: str, body: dict[str, Any]
    ) -> None: ...


class RunPods(Protocol):
    """The read of ``trainingrun.cache.ClusterView`` ``settle`` needs."""

    def run_pods(self, namespace: str, run: str) -> list[dict[str, Any]]: ...


class Queues:
    def __init__(self, api: ObjectApi, monotonic: Callable[[], float]) -> None:
        self._api = api
        self._monotonic = monotonic
        self._installed: tuple[float, bool] | None = None
        self._lock = threading.Lock()

    def installed(self) -> bool:
        with self._lock:
            known = self._installed
        if known is not None and self._monotonic() - known[0] < INSTALLED_TTL_SECONDS:
            return known[1]
        answer = self._api.has_api(W.KUEUE_GROUP, W.KUEUE_VERSION, W.WORKLOADS)
        with self._lock:
            self._installed = (self._monotonic(), answer)
        return answer

    def observe(
        self,
        run: Mapping[str, Any],
        ref: RunRef,
        status: TrainingRunStatus,
        agent: AgentSettings,
    ) -> tuple[Queue | None, dict[str, Any] | None]:
        """Kueue's answer for the run (None: it names no queue) and its Workload, created when
        missing with the shape of an attempt's pods. A Workload the API server refuses holds
        the run with the reason (WorkloadFailed)."""
        meta = run["metadata"]
        queue = W.queue_name(meta.get("labels"))
        if queue is None:
            return None, None
        if not self.installed():
            return W.queue_of(None, queue, installed=False), None
        namespace, name = meta["namespace"], W.workload_name(meta["name"])
        found = self._get(namespace, name)
        if found is None and not is_finished(status):
            pod = build_pod(ref, max(status.attempt, 1), None, agent, 0, 0)
            body = W.build_workload(run, pod, ref.spec.replicas, self._priority(meta))
            try:
                created = self._api.create_object(W.KUEUE_GROUP, W.KUEUE_VERSION, W.WORKLOADS, body)
            except (Invalid, Forbidden) as e:
                message = f"cannot create the run's Kueue Workload {name}: {e}"
                return Queue(False, R.WORKLOAD_FAILED, message), None
            except NotServed:  # uninstalled since the last look
                with self._lock:
                    self._installed = (self._monotonic(), False)
                return W.queue_of(None, queue, installed=False), None
            log.info("%s/%s: Workload %s created in queue %s", namespace, meta["name"], name, queue)
            found = created if created is not None else self._get(namespace, name)
        return W.queue_of(found, queue, installed=True), found

    def settle(
        self,
        run: Mapping[str, Any],
        status: TrainingRunStatus,
        workload: Mapping[str, Any] | None,
        pods: RunPods,
        now: datetime,
    ) -> None:
        """After the pass: the quota of an evicted Workload goes back once no pod of the run is
        left; the Workload of a run that ended is Finished (read here when the pass did not)."""
        meta = run["metadata"]
        if W.queue_name(meta.get("labels")) is None:
            return
        if workload is None and is_finished(status) and self.installed():
            workload = self._get(meta["namespace"], W.workload_name(meta["name"]))
        if workload is None:
            return
        if is_finished(status):
            ok = is_true(status, R.SUCCEEDED)
            new = W.finished(workload, ok, status.message or "", now)
        elif not pods.run_pods(meta["namespace"], meta["name"]):
            new = W.released(workload, now)
        else:
            new = None
        if new is not None:
            body = {**workload, "status": new}
            self._api.replace_object_status(W.KUEUE_GROUP, W.KUEUE_VERSION, W.WORKLOADS, body)

    @staticmethod
    def poll_after(queue: Queue | None, status: TrainingRunStatus) -> float | None:
        """Seconds until the next look at a queued run's Workload; None: not queued, or ended."""
        return None if queue is None or is_finished(status) else POLL_SECONDS

    def _get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._api.get_object(
            W.KUEUE_GROUP, W.KUEUE_VERSION, W.WORKLOADS, name, namespace=namespace
        )

    def _priority(self, meta: Mapping[str, Any]) -> tuple[str, int] | None:
        """The run's WorkloadPriorityClass (its ``kueue.x-k8s.io/priority-class`` label) and
        its value; None without one. A class that does not exist is Kueue's to refuse."""
        name = (meta.get("labels") or {}).get(W.LABEL_PRIORITY)
        if not name:
            return None
        found = self._api.get_object(W.KUEUE_GROUP, W.KUEUE_VERSION, W.PRIORITY_CLASSES, name)
        return name, int((found or {}).get("value") or 0)
