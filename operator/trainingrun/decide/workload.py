"""A run queued with Kueue, as pure functions: the ``Workload`` that stands for it, what Kueue's
answer means for the run (``decide.hold.Queue``), and the status writes Kueue expects from the
owner of a workload it does not manage itself.

Route: Kueue's documented way for a workload type it has no built-in integration for is an
"external framework" (Kueue's ``integrations.externalFrameworks``): the type's own controller
creates one ``Workload`` per job, owned by the job, with the job's pod sets, and then follows
Kueue's answer: start the pods once the workload is ``Admitted``; when Kueue ``Evicted`` it,
stop the pods, then give the quota back (``QuotaReserved`` False, ``admission`` cleared), after
which Kueue requeues the workload with its own backoff and counts; mark it ``Finished`` when
the job ends. A run is admitted before any of its pods exists; plain-pod groups would create
the pods first, gated.

One Workload per run (not per attempt): it keeps its place in the queue, its requeue state and
its priority across attempts; its pod sets are those of one attempt (with replicas, the gang).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from trainingrun.contract import LABEL_RUN, rfc3339
from trainingrun.decide import reasons as R
from trainingrun.decide.hold import Queue

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta1"
WORKLOADS = "workloads"
PRIORITY_CLASSES = "workloadpriorityclasses"
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"  # on the TrainingRun: queue it with Kueue
LABEL_PRIORITY = "kueue.x-k8s.io/priority-class"  # a WorkloadPriorityClass name
PRIORITY_SOURCE = "kueue.x-k8s.io/workloadpriorityclass"
POD_SET = "main"


def workload_name(run: str) -> str:
    return f"trainingrun-{run}"


def queue_name(labels: Mapping[str, str] | None) -> str | None:
    """The LocalQueue a run names (its ``kueue.x-k8s.io/queue-name`` label), or None."""
    return (labels or {}).get(LABEL_QUEUE) or None


def build_workload(
    run: Mapping[str, Any],
    pod: Mapping[str, Any],
    replicas: int,
    priority: tuple[str, int] | None,
) -> dict[str, Any]:
    """The run's Workload: owned by the run (it goes with it), one pod set of ``replicas``
    pods shaped like ``pod`` (an attempt's pod as the operator builds it, with the sync
    sidecar and the restore container, whose requests count too), and the priority of the
    run's WorkloadPriorityClass (name, value) when it names one."""
    meta = run["metadata"]
    spec = pod.get("spec") or {}
    template_spec: dict[str, Any] = {
        "containers": [_sized(c) for c in spec.get("containers") or []],
        "restartPolicy": "Never",
    }
    if spec.get("initContainers"):
        template_spec["initContainers"] = [_sized(c) for c in spec["initContainers"]]
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName"):
        if spec.get(key):
            template_spec[key] = spec[key]
    body: dict[str, Any] = {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": workload_name(meta["name"]),
            "namespace": meta["namespace"],
            # The job UID label names the run in Kueue's preemption messages.
            "labels": {LABEL_RUN: meta["name"], "kueue.x-k8s.io/job-uid": meta["uid"]},
            "ownerReferences": [
                {
                    "apiVersion": run["apiVersion"],
                    "kind": run["kind"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "queueName": queue_name(meta.get("labels")),
            "podSets": [{"name": POD_SET, "count": replicas, "template": {"spec": template_spec}}],
        },
    }
    if priority is not None:
        body["spec"]["priorityClassName"] = priority[0]
        body["spec"]["priorityClassSource"] = PRIORITY_SOURCE
        body["spec"]["priority"] = priority[1]
    return body


def _sized(container: Mapping[str, Any]) -> dict[str, Any]:
    """What Kueue needs of a container: its name, image and resources (and a sidecar's
    restartPolicy, which makes its requests add to the pod's)."""
    kept = {k: container[k] for k in ("name", "image", "resources") if k in container}
    if container.get("restartPolicy"):
        kept["restartPolicy"] = container["restartPolicy"]
    return kept


def _condition(workload: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    for c in (workload.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return None


def _true(workload: Mapping[str, Any], ctype: str) -> bool:
    c = _condition(workload, ctype)
    return c is not None and c.get("status") == "True"


def queue_of(workload: Mapping[str, Any] | None, queue: str, installed: bool) -> Queue:
    """What Kueue's answer means for the run: admitted (its pods may run), evicted (they must
    stop), or waiting (no pod), in Kueue's own words."""
    if not installed:
        return Queue(
            False,
            R.KUEUE_NOT_INSTALLED,
            f"the run names the Kueue queue {queue!r} (label {LABEL_QUEUE}), but Kueue is not "
            "installed (no workloads.kueue.x-k8s.io API): install Kueue, or remove the label "
            "to run without a queue",
        )
    if workload is None:
        return Queue(False, R.QUEUED, f"waiting for its Workload in LocalQueue {queue!r}")
    evicted = _condition(workload, "Evicted")
    if evicted is not None and evicted.get("status") == "True":
        why = evicted.get("reason") or "Evicted"
        return Queue(False, R.EVICTED, f"evicted by Kueue ({why}): {evicted.get('message', '')}")
    if _true(workload, "Admitted") and not _true(workload, "Finished"):
        cq = ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue", "")
        return Queue(True, R.ADMITTED_BY_KUEUE, f"admitted by Kueue in ClusterQueue {cq!r}")
    pending = _condition(workload, "QuotaReserved")
    detail = (pending or {}).get("message") or "waiting for quota"
    return Queue(False, R.QUEUED, f"queued in LocalQueue {queue!r}: {detail}")


def _with_condition(
    workload: Mapping[str, Any], ctype: str, status: str, reason: str, message: str, now: datetime
) -> list[dict[str, Any]]:
    conds = [dict(c) for c in (workload.get("status") or {}).get("conditions") or []]
    old = next((c for c in conds if c.get("type") == ctype), None)
    since = old["lastTransitionTime"] if old and old.get("status") == status else rfc3339(now)
    new = {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "observedGeneration": (workload.get("metadata") or {}).get("generation", 0),
    }
    return [*(c for c in conds if c.get("type") != ctype), new]


def released(workload: Mapping[str, Any], now: datetime) -> dict[str, Any] | None:
    """The workload's status once its pods are gone after an eviction, as Kueue's own job
    controllers write it: the quota given back (``QuotaReserved`` False, ``Admitted`` False,
    no ``admission``) and ``Requeued`` True, so that Kueue queues it again (with its own
    backoff and counts). None: nothing to give back (not evicted, or given back already)."""
    evicted = _condition(workload, "Evicted")
    if evicted is None or evicted.get("status") != "True" or not _true(workload, "QuotaReserved"):
        return None
    message = str(evicted.get("message") or "evicted")
    why = str(evicted.get("reason") or "Evicted")
    status: dict[str, Any] = dict(workload.get("status") or {})
    for ctype, value, reason, text in (
        ("QuotaReserved", "False", "Pending", message),
        ("Admitted", "False", "NoReservation", "The workload has no reservation"),
        ("Requeued", "True", why, message),
    ):
        status["conditions"] = _with_condition(
            {**workload, "status": status}, ctype, value, reason, text, now
        )
    status["admission"] = None
    return status


def finished(
    workload: Mapping[str, Any], succeeded: bool, message: str, now: datetime
) -> dict[str, Any] | None:
    """The workload's status once the run ended (its quota goes back for good); None when it
    says so already."""
    if _true(workload, "Finished"):
        return None
    status = dict(workload.get("status") or {})
    reason = "Succeeded" if succeeded else "Failed"
    status["conditions"] = _with_condition(workload, "Finished", "True", reason, message, now)
    return status
