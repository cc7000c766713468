"""Gangs (spec.replicas > 1) against the real control plane, kube-scheduler and kwok nodes:

- a 4-pod run: its headless Service and four pods on four nodes (the scheduler honours the
  anti-affinity the operator adds), torchrun's environment by rank, the Replicas column of
  ``kubectl get -o wide``; one member failing ends the attempt, the other three are deleted,
  attempt 2 has four new pods, restarts 1 and preemptions 0;
- a 2-pod run whose second pod cannot be scheduled: the first is not left running past
  ``spec.gang.startTimeoutSeconds`` (the attempt fails with GangNotScheduled in its Event and
  condition, and the scheduled pod is deleted).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.integration.support import Runs, trainingrun, wait_for
from tests.localenv import LocalEnv

pytestmark = pytest.mark.usefixtures("operator")


def gang(name: str, localenv: LocalEnv, prefix: str, group: str, **spec: Any) -> dict[str, Any]:
    body = trainingrun(name, localenv, prefix)
    body["spec"]["template"]["spec"]["nodeSelector"] = {"gang": group}
    body["spec"].update(spec)
    return body


def names(runs: Runs, run: str) -> set[str]:
    return {p.metadata.name for p in runs.pods_of(run) if not p.metadata.deletion_timestamp}


def test_one_failed_member_ends_the_attempt_and_four_new_pods_follow(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, core_v1: Any
) -> None:
    group = uuid.uuid4().hex[:8]
    for _ in range(4):
        kwok_node({"gang": group})
    runs.create(gang("g4", localenv, prefix, group, replicas=4))
    runs.wait_status("g4", lambda s: s.get("activePod") == "g4-1-0", 30, "attempt 1 started")
    pods = [runs.wait_pod_running(f"g4-1-{rank}") for rank in range(4)]

    assert len({p.spec.node_name for p in pods}) == 4
    service = core_v1.read_namespaced_service("g4", runs.namespace)
    assert service.spec.cluster_ip == "None"
    assert [p.spec.subdomain for p in pods] == ["g4"] * 4
    env = runs.env_of(pods[2])
    assert (env["PET_NNODES"], env["PET_NODE_RANK"], env["PET_MASTER_ADDR"]) == (
        "4",
        "2",
        f"g4-1-0.g4.{runs.namespace}.svc.cluster.local",
    )
    wide = localenv.kubectl("get", "trainingruns", "g4", "-n", runs.namespace, "-o", "wide")
    header, row = wide.strip().splitlines()[:2]
    assert row[header.index("REPLICAS") :].split()[0] == "4"  # columns are left-aligned

    runs.end_pod("g4-1-2", 1)

    status = runs.wait_status("g4", lambda s: s.get("activePod") == "g4-2-0", 60, "attempt 2")
    assert (status["restarts"], status["preemptions"]) == (1, 0)
    wait_for(
        lambda: names(runs, "g4") == {"g4-1-2", *(f"g4-2-{r}" for r in range(4))},
        60,
        "the other three pods of attempt 1 gone, four of attempt 2 there",
    )
    failed = [e.message for e in runs.wait_events("g4", "Failed")]
    assert any("g4-1-2: the trainer exited 1" in m for m in failed), failed


def test_a_member_that_cannot_be_scheduled_leaves_no_partial_gang_past_the_timeout(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any
) -> None:
    group = uuid.uuid4().hex[:8]
    kwok_node({"gang": group})  # one node for two pods that must not share one
    runs.create(gang("g2", localenv, prefix, group, replicas=2, gang={"startTimeoutSeconds": 10}))
    runs.wait_status("g2", lambda s: s.get("activePod") == "g2-1-0", 30, "attempt 1 started")
    placed = wait_for(
        lambda: [p for p in runs.pods_of("g2") if p.spec.node_name],
        30,
        "one pod of the gang scheduled",
    )
    assert [p.metadata.name for p in placed] in (["g2-1-0"], ["g2-1-1"])

    messages = [e.message for e in runs.wait_events("g2", "Failed", timeout_s=60)]

    assert any("GangNotScheduled" in m and "not scheduled 10s" in m for m in messages), messages
    status = runs.status("g2")
    running = next(c for c in status["conditions"] if c["type"] == "Running")
    assert "GangNotScheduled" in running["message"] or status["attempt"] > 1
    wait_for(
        lambda: placed[0].metadata.name not in names(runs, "g2"),
        60,
        f"{placed[0].metadata.name} deleted",
    )
