"""Runs queued with Kueue (the run's ``kueue.x-k8s.io/queue-name`` label): gather and apply
around the pure ``trainingrun.decide.workload``. A queued run's Workload is read at each of its
passes, which come back every ``POLL_SECONDS`` while it is queued.

At each pass of such a run, in gather: whether Kueue is installed (asked of the API server,
remembered for a while), its Workload (when missing, the body the apply step creates: shaped
like the attempt's pods, with the hash of the template it is made for; a refused create holds
the run with its reason at the next pass), and what Kueue's answer means for the run
(``decide.hold.Queue``, which ``plan()`` follows; ``decide.workload.answer``: another's
Workload of that name is never adopted, one made for another template admits no new attempt).
After the pass: a Workload Kueue evicted gets its quota back once the run has no pod left, one
made for another template is finished and deleted then (the next pass creates the new one),
and one whose run ended is marked Finished. The operator writes and deletes only Workloads whose
controller owner is the run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from trainingrun.api import TrainingRunStatus
from trainingrun.decide import reasons as R
from trainingrun.decide import workload as W
from trainingrun.decide.hold import Queue
from trainingrun.decide.naming import RunRef
from trainingrun.decide.pod import AgentSettings, build_pod
from trainingrun.decide.status import is_finished, is_true
from trainingrun.operator.kube import Forbidden, Invalid, NotServed

log = logging.getLogger("trainingrun.operator")

INSTALLED_TTL_SECONDS = 30.0  # how long the answer "is Kueue installed" is trusted
# A queued run's pass comes back this often to read its Workload: admission, eviction and
# requeueing are seen within this time. (Polled, not watched: the operator's watch of a CRD
# that is deleted, as when Kueue is uninstalled, ends the operator's watching altogether.)
POLL_SECONDS = 2.0


class ObjectApi(Protocol):
    """The reads of ``trainingrun.operator.kube.Kube`` this module makes."""

    def has_api(self, group: str, version: str, plural: str) -> bool: ...
    def get_object(
        self, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None: ...


class ObjectWriter(Protocol):
    """The writes this module makes (``trainingrun.operator.applier.Applier``)."""

    def create_object(
        self, group: str, version: str, plural: str, body: dict[str, Any]
    ) -> dict[str, Any] | None: ...
    def replace_object_status(
        self, group: str, version: str, plural: str, body: dict[str, Any]
    ) -> None: ...
    def delete_object(
        self,
        group: str,
        version: str,
        plural: str,
        name: str,
        namespace: str,
        uid: str | None = None,
    ) -> bool: ...


@dataclass(frozen=True)
class Seen:
    """A queued run's Workload as a pass saw it."""

    queue: Queue | None = None  # Kueue's answer for the run; None: it names no queue
    workload: dict[str, Any] | None = None  # the run's own Workload, if any
    stale: bool = False  # made for another pod template, and no attempt runs under it
    create: dict[str, Any] | None = None  # the Workload to create (the run's is missing)


class RunPods(Protocol):
    """The read of ``trainingrun.operator.cache.ClusterView`` ``settle`` needs."""

    def run_pods(self, namespace: str, run: str) -> list[dict[str, Any]]: ...


def _runs(pod: Mapping[str, Any]) -> bool:
    """The pod may still hold its node's resources: not ended (Succeeded or Failed)."""
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


class Queues:
    def __init__(
        self, api: ObjectApi, writer: ObjectWriter, monotonic: Callable[[], float]
    ) -> None:
        self._api = api
        self._writer = writer
        self._monotonic = monotonic
        self._installed: tuple[float, bool] | None = None
        # Workloads made for an older template whose DELETE was refused: why, for the status.
        self._refused: dict[tuple[str, str], str] = {}
        # Workloads whose create was refused: why, for the status of the next pass.
        self._create_refused: dict[tuple[str, str], str] = {}
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
        running: bool = False,
    ) -> Seen:
        """Kueue's answer for the run and its Workload, created when missing with the shape of
        an attempt's pods. A Workload the API server refuses holds the run with the reason
        (WorkloadFailed); so does another's Workload of that name (never adopted, never
        touched). ``running``: an attempt runs, started under the Workload's admission."""
        meta = run["metadata"]
        queue = W.queue_name(meta.get("labels"))
        if queue is None:
            return Seen()
        if not self.installed():
            return Seen(W.queue_of(None, queue, installed=False))
        namespace, name = meta["namespace"], W.workload_name(meta["name"])
        admission = W.admission_hash(ref.spec.template, ref.spec.replicas)
        found = self._get(namespace, name)
        if found is not None:
            if not W.owned_by(found, meta["uid"]):
                return Seen(W.answer(found, queue, meta["uid"], admission, running))
            with self._lock:
                refused = self._refused.get((namespace, name))
            if refused is not None:
                return Seen(Queue(False, R.WORKLOAD_FAILED, refused), found, stale=True)
            answer = W.answer(found, queue, meta["uid"], admission, running)
            going = bool(found["metadata"].get("deletionTimestamp"))
            stale = W.out_of_sync(found, admission) and not running and not going
            return Seen(answer, found, stale)
        if is_finished(status):
            return Seen(W.queue_of(None, queue, installed=True))
        pod = build_pod(ref, max(status.attempt, 1), None, agent, 0, 0)
        body = W.build_workload(run, pod, ref.spec.replicas, self._priority(meta), admission)
        with self._lock:
            refused = self._create_refused.get((namespace, name))
        if refused is not None:  # the last create was refused: said, and tried again
            return Seen(Queue(False, R.WORKLOAD_FAILED, refused), create=body)
        return Seen(W.queue_of(None, queue, installed=True), create=body)

    def create(self, run: Mapping[str, Any], seen: Seen) -> None:
        """Creates the run's missing Workload (the apply step); a refusal is remembered and
        holds the run with its reason at the next pass, which tries again."""
        if seen.create is None:
            return
        meta = run["metadata"]
        namespace, name = meta["namespace"], seen.create["metadata"]["name"]
        try:
            self._writer.create_object(W.KUEUE_GROUP, W.KUEUE_VERSION, W.WORKLOADS, seen.create)
        except (Invalid, Forbidden) as e:
            with self._lock:
                self._create_refused[(namespace, name)] = (
                    f"cannot create the run's Kueue Workload {name}: {e}"
                )
            return
        except NotServed:  # uninstalled since the last look
            with self._lock:
                self._installed = (self._monotonic(), False)
            return
        with self._lock:
            self._create_refused.pop((namespace, name), None)
        queue = W.queue_name(meta.get("labels"))
        log.info("%s/%s: Workload %s created in queue %s", namespace, meta["name"], name, queue)

    def settle(
        self,
        run: Mapping[str, Any],
        status: TrainingRunStatus,
        seen: Seen,
        pods: RunPods,
        now: datetime,
    ) -> None:
        """After the pass: once no pod of the run is left, the quota of an evicted Workload
        goes back; once none runs (each ended, or gone), one made for another template is
        finished and deleted; the Workload of a run that ended is Finished (read here when the
        pass did not). Only the run's own Workload is ever written."""
        meta = run["metadata"]
        if W.queue_name(meta.get("labels")) is None:
            return
        workload = seen.workload
        if workload is None and is_finished(status) and self.installed():
            workload = self._get(meta["namespace"], W.workload_name(meta["name"]))
        if workload is None or not W.owned_by(workload, meta["uid"]):
            return
        left = pods.run_pods(meta["namespace"], meta["name"])
        if is_finished(status):
            ok = is_true(status, R.SUCCEEDED)
            new = W.finished(workload, ok, status.message or "", now)
        elif seen.stale and not any(_runs(pod) for pod in left):
            self._replace(workload, now)
            return
        elif left:
            new = None
        else:
            new = W.released(workload, now)
        if new is not None:
            body = {**workload, "status": new}
            self._writer.replace_object_status(W.KUEUE_GROUP, W.KUEUE_VERSION, W.WORKLOADS, body)

    def _replace(self, workload: dict[str, Any], now: datetime) -> None:
        """Finishes (``OutOfSync``: its quota goes back) and deletes a Workload made for
        another pod template; the next pass creates the new one. A DELETE the API server
        refuses holds the run with the reason."""
        meta = workload["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        new = W.replaced(workload, now)
        if new is not None:
            body = {**workload, "status": new}
            self._writer.replace_object_status(W.KUEUE_GROUP, W.KUEUE_VERSION, W.WORKLOADS, body)
        try:
            self._writer.delete_object(
                W.KUEUE_GROUP, W.KUEUE_VERSION, W.WORKLOADS, name, namespace, meta.get("uid")
            )
        except Forbidden as e:
            with self._lock:
                self._refused[(namespace, name)] = (
                    f"cannot delete the Workload {name}, made for an older pod template: {e}; "
                    "grant the operator delete on workloads.kueue.x-k8s.io (the chart's RBAC)"
                )
            return
        with self._lock:
            self._refused.pop((namespace, name), None)
        log.info("%s/%s: Workload replaced: the pod template changed", namespace, name)

    def forget(self, namespace: str, run: str) -> None:
        """The run is gone: nothing of its Workload is remembered."""
        with self._lock:
            self._refused.pop((namespace, W.workload_name(run)), None)
            self._create_refused.pop((namespace, W.workload_name(run)), None)

    @staticmethod
    def poll_after(seen: Seen, status: TrainingRunStatus) -> float | None:
        """Seconds until the next look at a queued run's Workload; None: not queued, or ended."""
        return None if seen.queue is None or is_finished(status) else POLL_SECONDS

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
