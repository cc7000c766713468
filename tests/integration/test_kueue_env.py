"""Kueue on the local environment (tests.kueue), with Workloads created directly, the way the
operator will create and own them (Kueue's route for external controllers).

Covers: a Workload within quota gets QuotaReserved, Admitted and ``status.admission``; one over
quota stays pending with QuotaReserved=False, reason Pending; a higher-priority Workload makes
Kueue evict the admitted one (Evicted/Preempted conditions, quota still held) until its owner
releases the quota the way Kueue's job framework does, then the preemptor is admitted, and a
Finished one hands its quota back; a Workload controlled by a TrainingRun is admitted, and one
whose TrainingRun is gone is finished by Kueue (OwnerNotFound).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from tests import kueue as kueue_mod
from tests.integration.support import trainingrun, wait_for
from tests.localenv import LocalEnv
from trainingrun import api

TIMEOUT_S = 30
# The ``queue`` fixture's: quota for one cpu, a priority class of the queue's name (1000).
QUEUE_QUOTA = kueue_mod.QueueQuota("1", "1Gi", {"": 1000})


def workload(
    name: str, queue: str, *, priority_class: str | None = None, owner: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A Workload of one pod asking for one cpu."""
    spec: dict[str, Any] = {
        "queueName": queue,
        "podSets": [
            {
                "name": "main",
                "count": 1,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "trainer",
                                "image": "example.invalid/trainer:1",
                                "resources": {"requests": {"cpu": "1"}},
                            }
                        ],
                    }
                },
            }
        ],
    }
    if priority_class:
        # The WorkloadPriorityClass controller writes spec.priority only when the class changes:
        # the creator sets it, as Kueue's job framework does.
        spec["priorityClassRef"] = {
            "group": "kueue.x-k8s.io",
            "kind": "WorkloadPriorityClass",
            "name": priority_class,
        }
        spec["priority"] = 1000
    metadata: dict[str, Any] = {"name": name}
    if owner:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": kueue_mod.API_VERSION,
        "kind": "Workload",
        "metadata": metadata,
        "spec": spec,
    }


def create(env: LocalEnv, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    out = env.kubectl("create", "-n", namespace, "-o", "json", "-f", "-", stdin=json.dumps(obj))
    created: dict[str, Any] = json.loads(out)
    return created


def get(env: LocalEnv, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(
        env.kubectl("get", "-n", namespace, "workload.kueue.x-k8s.io", name, "-o", "json")
    )
    return obj


def condition(wl: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in wl.get("status", {}).get("conditions", []):
        if cond["type"] == kind:
            found: dict[str, Any] = cond
            return found
    return None


def cond(wl: dict[str, Any], kind: str) -> dict[str, Any]:
    """The Workload's condition ``kind``, which must be there."""
    found = condition(wl, kind)
    assert found is not None, f"{wl['metadata']['name']} has no {kind} condition"
    return found


def wait_condition(
    env: LocalEnv, namespace: str, name: str, kind: str, status: str, reason: str | None = None
) -> dict[str, Any]:
    """Waits until the Workload has condition ``kind`` with this status (and reason); returns
    the Workload."""

    def met() -> dict[str, Any] | None:
        wl = get(env, namespace, name)
        cond = condition(wl, kind)
        if cond and cond["status"] == status and reason in (None, cond["reason"]):
            return wl
        return None

    return wait_for(met, TIMEOUT_S, f"{name}: {kind}={status} {reason or ''}")


def patch_status(env: LocalEnv, namespace: str, name: str, status: dict[str, Any]) -> None:
    """A merge patch of the Workload's status subresource, as its owner writes it."""
    body = json.dumps({"status": status})
    resource = f"workload.kueue.x-k8s.io/{name}"
    env.kubectl(
        "patch", "-n", namespace, resource, "--subresource=status", "--type=merge", "-p", body
    )


def release_quota_after_eviction(env: LocalEnv, namespace: str, name: str) -> None:
    """What the owner does once its pods are gone after Evicted=True (Kueue's job framework,
    pkg/controller/jobframework/reconciler.go, step 6): QuotaReserved=False reason Pending,
    ``status.admission`` cleared, Admitted=False, and Requeued=True for a preemption. Admitted
    must go too: left True, Kueue still counts the Workload as admitted and never requeues it."""
    wl = get(env, namespace, name)
    evicted = cond(wl, "Evicted")
    assert evicted["status"] == "True"
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    gen = wl["metadata"]["generation"]
    replaced = {"QuotaReserved", "Admitted", "Requeued"}
    conditions = [c for c in wl["status"]["conditions"] if c["type"] not in replaced]
    for kind, status, reason, message in (
        ("QuotaReserved", "False", "Pending", evicted["message"]),
        ("Admitted", "False", "NoReservation", "The workload has no reservation"),
        ("Requeued", "True", evicted["reason"], evicted["message"]),
    ):
        conditions.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": now,
                "observedGeneration": gen,
            }
        )
    patch_status(env, namespace, name, {"admission": None, "conditions": conditions})


def finish(env: LocalEnv, namespace: str, name: str, reason: str = "Succeeded") -> None:
    """Finished=True: terminal; Kueue drops the Workload from its queues and cache."""
    wl = get(env, namespace, name)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [c for c in wl["status"]["conditions"] if c["type"] != "Finished"]
    conditions.append(
        {
            "type": "Finished",
            "status": "True",
            "reason": reason,
            "message": "the run ended",
            "lastTransitionTime": now,
            "observedGeneration": wl["metadata"]["generation"],
        }
    )
    patch_status(env, namespace, name, {"conditions": conditions})


def test_within_quota_admitted_over_quota_pending(
    localenv: LocalEnv, namespace: str, queue: str
) -> None:
    create(localenv, namespace, workload("first", queue))
    first = wait_condition(localenv, namespace, "first", "Admitted", "True", "Admitted")
    assert cond(first, "QuotaReserved")["status"] == "True"
    admission = first["status"]["admission"]
    assert admission["clusterQueue"] == queue
    assert admission["podSetAssignments"] == [
        {"name": "main", "count": 1, "flavors": {"cpu": queue}, "resourceUsage": {"cpu": "1"}}
    ]

    create(localenv, namespace, workload("second", queue))
    second = wait_condition(localenv, namespace, "second", "QuotaReserved", "False", "Pending")
    assert "insufficient unused quota for cpu" in cond(second, "QuotaReserved")["message"]
    assert "admission" not in second["status"]
    assert condition(second, "Admitted") is None


def test_preemption_evicts_until_the_owner_releases_the_quota(
    localenv: LocalEnv, namespace: str, queue: str
) -> None:
    create(localenv, namespace, workload("low", queue))
    wait_condition(localenv, namespace, "low", "Admitted", "True")

    create(localenv, namespace, workload("high", queue, priority_class=queue))
    low = wait_condition(localenv, namespace, "low", "Evicted", "True", "Preempted")
    assert cond(low, "Preempted")["status"] == "True"
    assert cond(low, "Preempted")["reason"] == "InClusterQueue"
    # Kueue only asks: the quota stays reserved, and the Workload admitted, until the owner
    # has stopped its pods and says so.
    assert cond(low, "QuotaReserved")["status"] == "True"
    assert cond(low, "Admitted")["status"] == "True"
    assert low["status"]["admission"]["clusterQueue"] == queue
    assert low["spec"].get("active", True) is True
    assert "requeueState" not in low["status"]
    assert low["status"]["schedulingStats"]["evictions"] == [
        {"count": 1, "reason": "Preempted", "underlyingCause": ""}
    ]
    high = wait_condition(localenv, namespace, "high", "QuotaReserved", "False", "Pending")
    assert "Pending the preemption of 1 workload(s)" in cond(high, "QuotaReserved")["message"]

    release_quota_after_eviction(localenv, namespace, "low")
    high = wait_condition(localenv, namespace, "high", "Admitted", "True")
    assert high["spec"]["priority"] == 1000
    low = wait_condition(localenv, namespace, "low", "QuotaReserved", "False", "Pending")
    assert "admission" not in low["status"]
    assert cond(low, "Requeued")["status"] == "True"

    # The preemptor finishes: its quota comes back and the evicted one is admitted again,
    # its Evicted and Preempted conditions turned False.
    finish(localenv, namespace, "high")
    low = wait_condition(localenv, namespace, "low", "Admitted", "True")
    assert cond(low, "Evicted")["status"] == "False"
    assert cond(low, "Evicted")["reason"] == "QuotaReserved"
    assert cond(low, "Preempted")["status"] == "False"


def test_owned_by_a_trainingrun_released_when_the_run_goes(
    localenv: LocalEnv, namespace: str, queue: str, crd: str
) -> None:
    run = create(localenv, namespace, trainingrun("run", localenv, "kueue-owner"))
    owner = {
        "apiVersion": f"{api.GROUP}/{api.VERSION}",
        "kind": api.KIND,
        "name": "run",
        "uid": run["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    create(localenv, namespace, workload("owned", queue, owner=owner))
    wait_condition(localenv, namespace, "owned", "Admitted", "True")
    create(localenv, namespace, workload("waiting", queue))
    wait_condition(localenv, namespace, "waiting", "QuotaReserved", "False", "Pending")

    # The run goes: the garbage collector deletes its Workload, or Kueue finishes it first
    # (reason OwnerNotFound, feature FinishOrphanedWorkloads); either way the quota comes back.
    localenv.kubectl("delete", "-n", namespace, f"{api.PLURAL}.{api.GROUP}/run", "--wait=false")

    def released() -> str | None:
        # One read: the Workload may be deleted between two (the newcomer run once saw it
        # there, then gone at the second read).
        proc = localenv.kubectl_run(
            "get", "-n", namespace, "workload.kueue.x-k8s.io/owned", "-o", "json"
        )
        if proc.returncode != 0 and "NotFound" in proc.stderr:
            return "deleted"
        assert proc.returncode == 0, proc.stderr
        finished = condition(json.loads(proc.stdout), "Finished")
        if finished and finished["status"] == "True":
            assert finished["reason"] == "OwnerNotFound"
            return "finished"
        return None

    print("owned Workload:", wait_for(released, 60, "the owned Workload to release its quota"))
    wait_condition(localenv, namespace, "waiting", "Admitted", "True")
