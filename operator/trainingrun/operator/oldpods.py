"""Old pods go away for sure: at each pass of a run, its pods of attempts before the current one
that still exist are deleted until they are gone, and one that will not go is reported.

Gather: the run's pods from the pod cache (its run label, its owner reference: a pod that is not
the run's is never touched), each one's node, and what this operator remembers of its DELETEs.
Decide: the pure ``trainingrun.decide.oldpods.sweep``. Apply: each DELETE carries the pod's UID
as a precondition; a refused one (any API error) is logged, counted and tried again at a later
pass, and never raised, so it cannot stop the next attempt's pod. A pod that will not go gets
an ``OldPodLingers`` Event and is counted by the lingering gauge (``lingering()``).

What the operator remembers of its DELETEs is kept per run, only while the run has old pods.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

from trainingrun.decide import reasons as R
from trainingrun.decide.naming import owned_by
from trainingrun.decide.oldpods import (
    Asked,
    Delete,
    OldPod,
    Timing,
    draining_until,
    lingers_message,
    old_pod,
    sweep,
)
from trainingrun.operator.kube import ApiError
from trainingrun.operator.metrics import OperatorMetrics

log = logging.getLogger("trainingrun.operator")


class PodView(Protocol):
    """The reads and the one write of ``trainingrun.operator.cache.ClusterView`` a sweep needs."""

    def run_pods(self, namespace: str, run: str) -> list[dict[str, Any]]: ...
    def node(self, name: str) -> tuple[dict[str, Any] | None, bool]: ...
    def pod_gone(self, namespace: str, name: str) -> None: ...


class EventSink(Protocol):
    """Where the OldPodLingers Events go (``trainingrun.operator.events.EventSink``)."""

    def post(self, run: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...


class PodDeleter(Protocol):
    """The call of ``trainingrun.operator.kube.Kube`` a sweep makes."""

    def delete_pod_by_uid(
        self, namespace: str, name: str, uid: str | None, grace_seconds: int | None = None
    ) -> bool: ...


@dataclass
class OldPodMemory:
    """One run's: the operator's DELETEs of each old pod, and how many linger."""

    asked: dict[str, Asked] = field(default_factory=dict)
    lingering: int = 0


class OldPods:
    """Passes of one run are serialised (``Reconciler.reconcile``); passes of different runs
    share only the dict of memories, under a lock."""

    def __init__(
        self,
        api: PodDeleter,
        view: PodView,
        events: EventSink,
        metrics: OperatorMetrics,
        timing: Timing | None = None,
    ) -> None:
        self._api = api
        self._view = view
        self._events = events
        self._metrics = metrics
        self.timing = timing or Timing()
        self._memory: dict[tuple[str, str], OldPodMemory] = {}
        self._lock = threading.Lock()

    def lingering(self) -> int:
        """Pods of older attempts that do not go, over every run (the lingering gauge)."""
        with self._lock:
            return sum(memory.lingering for memory in self._memory.values())

    def forget(self, namespace: str, name: str) -> None:
        """The run is gone: its pods go with it (owner references)."""
        with self._lock:
            self._memory.pop((namespace, name), None)

    def sweep(
        self, run: Mapping[str, Any], below: int, now: datetime, also: Collection[str] = ()
    ) -> float | None:
        """Deletes the run's pods of attempts before ``below`` (and ``also``, pods the plan
        ends, and every pod asked to go before) that are still there, and posts OldPodLingers
        for one that will not go. Returns seconds until the next look while some remain."""
        meta = run["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        with self._lock:
            memory = self._memory.get((namespace, name)) or OldPodMemory()
        found = self._old_pods(namespace, name, meta["uid"], below, also, memory)
        for forgotten in set(memory.asked) - set(found):
            del memory.asked[forgotten]  # gone
        for ended_by_plan in set(also) & set(found) - set(memory.asked):
            memory.asked[ended_by_plan] = Asked(first=now)  # asked to go, even if it stopped
        decided = sweep((pod for pod, _ in found.values()), memory.asked, now, self.timing)
        uids = {pod_name: uid for pod_name, (_, uid) in found.items()}
        gone = self._delete(namespace, name, decided.deletes, uids, memory, now)
        lingering = [linger for linger in decided.lingering if linger.pod.name not in gone]
        for linger in (linger for linger in lingering if linger.say):
            message = lingers_message(linger, namespace)
            log.warning("%s/%s: %s", namespace, name, message)
            self._events.post(run, R.event_type(R.OLD_POD_LINGERS), R.OLD_POD_LINGERS, message)
            asked = memory.asked.get(linger.pod.name) or Asked(first=now)
            memory.asked[linger.pod.name] = replace(asked, said=now)
        memory.lingering = len(lingering)
        with self._lock:
            if memory.asked or memory.lingering:
                self._memory[(namespace, name)] = memory
            else:
                self._memory.pop((namespace, name), None)
        return decided.requeue_after if set(found) - gone else None

    def drain_wait(
        self, namespace: str, run: str, run_uid: str, below: int, now: datetime
    ) -> float | None:
        """Seconds to wait before taking the fence for attempt ``below``: a pod of an older
        attempt is still uploading its trainer's last save (``draining_until``). None: go."""
        wait: float | None = None
        for pod in self._view.run_pods(namespace, run):
            seen = old_pod(pod, None, False)
            if seen is None or seen.attempt >= below or not owned_by(pod, run_uid):
                continue
            node_name = (pod.get("spec") or {}).get("nodeName")
            node, node_deleted = self._view.node(node_name) if node_name else (None, False)
            until = draining_until(pod, node, node_deleted)
            if until is not None and until > now:
                left = min((until - now).total_seconds(), self.timing.retry_seconds)
                wait = left if wait is None else min(wait, left)
        return wait

    def _old_pods(
        self,
        namespace: str,
        run: str,
        run_uid: str,
        below: int,
        also: Collection[str],
        memory: OldPodMemory,
    ) -> dict[str, tuple[OldPod, str | None]]:
        """The run's own pods to look at, by name: (the decision's view, the pod's UID)."""
        found: dict[str, tuple[OldPod, str | None]] = {}
        for pod in self._view.run_pods(namespace, run):
            if not owned_by(pod, run_uid):
                continue  # another owner's pod with the run's label: never deleted
            node_name = (pod.get("spec") or {}).get("nodeName")
            node, node_deleted = self._view.node(node_name) if node_name else (None, False)
            seen = old_pod(pod, node, node_deleted)
            if seen is None:
                continue
            if seen.attempt < below or seen.name in also or seen.name in memory.asked:
                found[seen.name] = (seen, (pod.get("metadata") or {}).get("uid"))
        return found

    def _delete(
        self,
        namespace: str,
        run: str,
        deletes: list[Delete],
        uids: Mapping[str, str | None],
        memory: OldPodMemory,
        now: datetime,
    ) -> set[str]:
        """Sends the DELETEs and remembers them; returns the pods found gone."""
        gone: set[str] = set()
        for delete in deletes:
            asked = memory.asked.get(delete.name) or Asked(first=now)
            try:
                accepted = self._api.delete_pod_by_uid(
                    namespace, delete.name, uids[delete.name], delete.grace
                )
            except ApiError as e:
                log.warning(
                    "%s/%s: pod %s not deleted, retrying: %s", namespace, run, delete.name, e
                )
                self._metrics.old_pod_deletes.labels(result="failed").inc()
                memory.asked[delete.name] = replace(asked, error=str(e))
                continue
            if not accepted:  # gone already, or the name is another pod's now
                self._metrics.old_pod_deletes.labels(result="gone").inc()
                self._view.pod_gone(namespace, delete.name)
                memory.asked.pop(delete.name, None)
                gone.add(delete.name)
                continue
            self._metrics.old_pod_deletes.labels(result="accepted").inc()
            memory.asked[delete.name] = replace(asked, accepted=now, grace=delete.grace, error="")
        return gone
