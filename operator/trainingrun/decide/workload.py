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

An admission is the run's and its template's alone (``answer``): a Workload of the run's name
whose controller owner is not the run (a deleted run's, anyone's) is never adopted, and one made
for another pod template (its ``ANNOTATION_ADMISSION``, the hash of what Kueue admits by, is not
the current template's) admits no new attempt: the run is re-queued, the Workload finished as
``OutOfSync`` (``replaced``) and deleted, and a new one created for the template.
"""

from __future__ import annotations

import hashlib
import json
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
# The hash of the template fields Kueue admits by (``admission_hash``) the Workload was made for.
ANNOTATION_ADMISSION = "trainingrun.dev/admission-hash"
# What of the pod template decides an admission: quota (resources), flavours (placement),
# priority; not the images, commands or environment, whose change needs no new admission.
ADMITTED_BY = (
    "nodeSelector",
    "tolerations",
    "affinity",
    "priorityClassName",
    "runtimeClassName",
    "overhead",
    "resources",
)


def workload_name(run: str) -> str:
    return f"trainingrun-{run}"


def queue_name(labels: Mapping[str, str] | None) -> str | None:
    """The LocalQueue a run names (its ``kueue.x-k8s.io/queue-name`` label), or None."""
    return (labels or {}).get(LABEL_QUEUE) or None


def admission_hash(template: Mapping[str, Any], replicas: int) -> str:
    """The hash of what Kueue admits a run by: ``replicas`` and, of the pod template, each
    container's and init container's name, resources and restartPolicy, and the pod's
    placement, priority and pod-level resources (``ADMITTED_BY``)."""
    spec = template.get("spec") or {}

    def sized(containers: Any) -> list[dict[str, Any]]:
        keys = ("name", "resources", "restartPolicy")
        return [{k: c[k] for k in keys if k in c} for c in containers or [] if isinstance(c, dict)]

    shape = {
        "replicas": replicas,
        "containers": sized(spec.get("containers")),
        "initContainers": sized(spec.get("initContainers")),
        **{k: spec[k] for k in ADMITTED_BY if spec.get(k)},
    }
    raw = json.dumps(shape, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def build_workload(
    run: Mapping[str, Any],
    pod: Mapping[str, Any],
    replicas: int,
    priority: tuple[str, int] | None,
    admission: str = "",
) -> dict[str, Any]:
    """The run's Workload: owned by the run (it goes with it), one pod set of ``replicas``
    pods shaped like ``pod`` (an attempt's pod as the operator builds it, with the sync
    sidecar and the restore container, whose requests count too), the priority of the
    run's WorkloadPriorityClass (name, value) when it names one, and ``admission``, the
    ``admission_hash`` of the template it is made for."""
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
            **({"annotations": {ANNOTATION_ADMISSION: admission}} if admission else {}),
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


def owner_of(workload: Mapping[str, Any]) -> str:
    """The Workload's controller owner in words, for a message."""
    refs = (workload.get("metadata") or {}).get("ownerReferences") or []
    ref = next((r for r in refs if r.get("controller")), None)
    if ref is None:
        return "no controller owner"
    return f"owned by {ref.get('kind')}/{ref.get('name')} uid {ref.get('uid')}"


def owned_by(workload: Mapping[str, Any], run_uid: str) -> bool:
    """The Workload is the run's own: its controller owner reference names the run's UID."""
    refs = (workload.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == run_uid and r.get("controller") for r in refs)


def out_of_sync(workload: Mapping[str, Any], admission: str) -> bool:
    """Made for another pod template than the one whose hash is ``admission`` (or, made before
    the hash was recorded, for an unknown one)."""
    annotations = (workload.get("metadata") or {}).get("annotations") or {}
    return annotations.get(ANNOTATION_ADMISSION) != admission


def answer(
    workload: Mapping[str, Any], queue: str, run_uid: str, admission: str, running: bool
) -> Queue:
    """What an existing Workload of the run's name means for the run whose UID is ``run_uid``
    and whose template's ``admission_hash`` is ``admission``. Another's Workload: the run
    waits, the Workload is left alone. One being deleted: the run waits for it to go. One made
    for another template: re-queued, unless an attempt is ``running`` (started under that
    admission, for the template it then had: it goes on, and the next attempt waits)."""
    meta = workload.get("metadata") or {}
    name = meta.get("name", "")
    if not owned_by(workload, run_uid):
        return Queue(
            False,
            R.WORKLOAD_FAILED,
            f"the Workload {name} exists and is not this run's ({owner_of(workload)}): its "
            "admission is not this run's; waiting for it to go (a deleted run's Workload goes "
            "with that run), or delete it",
        )
    if meta.get("deletionTimestamp"):
        return Queue(
            False, R.QUEUED, f"the Workload {name} is being deleted: a new one follows once gone"
        )
    if out_of_sync(workload, admission) and not running:
        return Queue(
            False,
            R.QUEUED,
            f"re-queued: the pod template changed since Kueue admitted the Workload {name} "
            "(resources, placement or replicas): it is replaced by a new one for the current "
            f"template once the run has no pod left, in LocalQueue {queue!r}",
        )
    return queue_of(workload, queue, installed=True)


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
    workload: Mapping[str, Any], succeeded: bool, message: str, now: datetime, reason: str = ""
) -> dict[str, Any] | None:
    """The workload's status once the run ended (its quota goes back for good); None when it
    says so already. ``reason``: Kueue's Finished reason, else Succeeded or Failed."""
    if _true(workload, "Finished"):
        return None
    status = dict(workload.get("status") or {})
    reason = reason or ("Succeeded" if succeeded else "Failed")
    status["conditions"] = _with_condition(workload, "Finished", "True", reason, message, now)
    return status


def replaced(workload: Mapping[str, Any], now: datetime) -> dict[str, Any] | None:
    """The status of a Workload made for another pod template, before it is deleted: Finished
    as ``OutOfSync`` (Kueue's own reason for a Workload out of sync with its job), which gives
    its quota back; None when it is finished already."""
    message = "the TrainingRun's pod template changed: replaced by a new Workload"
    return finished(workload, False, message, now, reason="OutOfSync")
