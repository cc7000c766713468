"""Kueue admission and preemption end to end: the operator, Kueue built from its Go module
(tests/kueue.py), the real control plane, SeaweedFS, and the example HuggingFace fine-tuning
script run by local pod runner nodes.

Covers:
- a ClusterQueue with quota for one run: the first run is admitted and runs, a second one waits
  with phase Queued and Kueue's reason, and no pod;
- a higher-priority run arrives: Kueue evicts the first; it saves at its next step end (0 steps
  lost, measured against the bucket manifest), its pods go, a preemption is counted, and the
  high-priority run starts; when that one finished, the first is readmitted, resumes from the
  saved step, ends Succeeded with final weights bitwise equal to an uninterrupted run's;
- the seconds from eviction to no pod, and from readmission to the trainer's first step, are
  printed (docs/benchmarks.md);
- a run naming a queue when Kueue is not installed says so in its Admitted condition.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from tests import kueue as kueue_mod
from tests.e2e.example import pod_spec
from tests.e2e.test_full_chain import SEED, Chain, finetune_run
from tests.e2e.test_suspend import first_step_at, gone
from tests.integration.support import Runs, trainingrun
from tests.localenv import LocalEnv
from tests.podrunner import RunnerHandle

pytestmark = pytest.mark.usefixtures("operator")

QUEUE_LABEL, PRIORITY_LABEL = "kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class"
REQUESTS = {"requests": {"cpu": "1", "memory": "256Mi"}}  # quota 1.5 cpu: one run at a time
# The ``queue`` fixture's: quota for one run, priority classes ``<queue>-low`` and ``-high``.
QUEUE_QUOTA = kueue_mod.QueueQuota("1500m", "4Gi", {"-low": 100, "-high": 1000})


def queued(body: dict[str, Any], queue: str, priority: str) -> dict[str, Any]:
    body["metadata"]["labels"] = {QUEUE_LABEL: queue, PRIORITY_LABEL: f"{queue}-{priority}"}
    for container in body["spec"]["template"]["spec"]["containers"]:
        container["resources"] = REQUESTS
    return body


def test_priority_eviction_saves_then_readmission_resumes_to_the_uninterrupted_weights(
    runs: Runs,
    localenv: LocalEnv,
    prefix: str,
    queue: str,
    runner_nodes: list[RunnerHandle],
    s3: Any,
    tmp_path: Path,
    chain_reference: tuple[bytes, dict[int, float]],
) -> None:
    rng = random.Random(SEED)
    nodes = [h.node for h in runner_nodes]
    chain = Chain(
        runs, localenv, prefix, "low", tmp_path, runner_nodes, lambda b: queued(b, queue, "low")
    )
    chain.wait_attempt(1)

    # A second run of the same priority waits, with no pod.
    wait_dir = tmp_path / "waiting"
    runs.create(queued(finetune_run("waiting", localenv, prefix, wait_dir, nodes), queue, "low"))
    # The first pass says it waits for its Workload (created by that pass's apply step); the
    # next, within a poll, Kueue's own words.
    waiting = runs.wait_status(
        "waiting",
        lambda s: s.get("phase") == "Queued" and "quota" in s.get("message", ""),
        60,
        "Queued for quota",
    )
    admitted = next(c for c in waiting["conditions"] if c["type"] == "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "Queued")
    assert "quota" in admitted["message"], admitted
    assert not runs.pods_of("waiting")
    runs.delete("waiting")

    # A higher-priority run: Kueue evicts the first, which saves at its next step end.
    chain.wait_step(1, rng.randint(12, 22))
    (tmp_path / "urgent").mkdir()
    urgent = queued(trainingrun("urgent", localenv, prefix), queue, "high")
    urgent["spec"]["template"]["spec"] = pod_spec(tmp_path / "urgent", nodes, 20, 10, 0.1)
    urgent["spec"]["template"]["spec"]["containers"][0]["resources"] = REQUESTS
    arrived = time.monotonic()
    runs.create(urgent)
    evicted = runs.wait_status("low", lambda s: s.get("phase") == "Queued", 120, "low evicted")
    evicted_at = time.monotonic()
    gone(runs, "low")
    gone_s, arrived_s = time.monotonic() - evicted_at, time.monotonic() - arrived
    trained, saved = chain.step(1), max(chain.committed(s3))
    assert saved == trained, f"trained to step {trained}, newest committed {saved}"
    assert (evicted["preemptions"], evicted["restarts"], evicted["attempt"]) == (1, 0, 2)
    reason = next(c for c in evicted["conditions"] if c["type"] == "Admitted")["reason"]
    assert reason == "Evicted"
    assert "Preempted" in runs.wait_events("low", "Evicted")[0].message

    runs.wait_status("urgent", lambda s: s.get("activePod") == "urgent-1", 120, "urgent started")
    runs.wait_status("urgent", lambda s: s.get("phase") == "Succeeded", 300, "urgent finished")
    readmitted_at = time.monotonic()
    chain.wait_attempt(2, timeout=120)
    first_s = first_step_at(tmp_path / "loss-2.jsonl") - readmitted_at
    assert chain.resume_step(2) == saved

    end = runs.wait_status(
        "low", lambda s: s.get("phase") in ("Succeeded", "Failed"), 600, "low to end"
    )
    assert end["phase"] == "Succeeded", end
    assert (end["preemptions"], end["restarts"]) == (1, 0)
    chain.assert_matches_reference(s3, chain_reference, 2, saved)
    finished = localenv.kubectl(
        "get",
        "workload",
        "-n",
        runs.namespace,
        "trainingrun-low",
        "-o",
        "jsonpath={.status.conditions[?(@.type=='Finished')].status}",
    )
    assert finished == "True"
    print(
        f"evicted at step {trained}: saved step {saved} (0 steps lost), pods gone "
        f"{arrived_s:.1f} s after the high-priority run was created ({gone_s:.1f} s after the "
        f"evicted run showed Queued); readmission (the high-priority run "
        f"Succeeded) to the trainer's first step: {first_s:.1f} s"
    )


def test_a_queue_label_without_kueue_installed_says_so(
    runs: Runs, localenv: LocalEnv, prefix: str
) -> None:
    kueue_mod.down(localenv.name)  # no Kueue, no CRD: a cluster without Kueue
    body = trainingrun("nokueue", localenv, prefix)
    body["metadata"]["labels"] = {QUEUE_LABEL: "team-a"}
    runs.create(body)

    # The operator trusts its last look at the API for 30 s (trainingrun.operator.queues).
    status = runs.wait_status(
        "nokueue", lambda s: s.get("reason") == "KueueNotInstalled", 90, "KueueNotInstalled"
    )

    assert status["phase"] == "Queued"
    admitted = next(c for c in status["conditions"] if c["type"] == "Admitted")
    assert admitted["status"] == "False"
    assert "Kueue is not installed" in admitted["message"]
    assert "remove the label" in admitted["message"]
    assert runs.wait_events("nokueue", "KueueNotInstalled")[0].type == "Warning"
    assert not runs.pods_of("nokueue")
