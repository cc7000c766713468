"""The operator against the real control plane, kwok nodes and the real bucket; no mocks.

Covers: a run that succeeds; a failed attempt resubmitted from the newest committed checkpoint
and counted as a restart; preemption by the Eviction API, by node deletion, by node NotReady, by
a pod deleted by someone else and after a notice taint only the run names (its pod annotated),
each resubmitted and counted as a preemption only; maxRestarts exhausted ends the run Failed; a
newest checkpoint with a missing object, and one the restore reports corrupt, both fall back to
the previous checkpoint; a missing credentials Secret is waited for (Pending, reason
MissingSecret, the Waiting condition) and fails the run after the operator's wait, while one
deleted during a running attempt does not end it, holds only the next attempt's start, and the
run goes on by itself once the Secret is back; an image pull error keeps the run
Running (ImagePullRetrying) until the pull has failed for the grace, then fails it; the
operator's metrics (transitions
by reason, pods created, passes, runs by phase); a pod of the attempt's name that is not the
run's is never adopted (PodNameTaken) and the run starts once it is gone; `kubectl get
trainingruns` columns; the operator SIGKILLed around resubmissions leaves exactly one pod per
attempt and no attempt number skipped; a pod of an older attempt that is still there is deleted
(a DELETE with its UID as precondition), while one with the run's labels that is not the run's
is left alone.
"""

from __future__ import annotations

import random
import re
import time
from typing import Any

import pytest
from kubernetes import client

from tests.integration.support import (
    OperatorProcess,
    Runs,
    commit_checkpoint,
    credentials_secret,
    mark_unknown,
    trainingrun,
    wait_for,
)
from tests.localenv import KWOK_NODE_ANNOTATION, LocalEnv
from trainingrun import api
from trainingrun.checkpoint.progress import PROGRESS_RECORD, ProgressRecord, encode
from trainingrun.contract import ANNOTATION_NOTICE, EXIT_CHECKPOINT_BAD, LABEL_ATTEMPT, LABEL_RUN

pytestmark = pytest.mark.usefixtures("operator")


def run_prefix(prefix: str, namespace: str, name: str) -> str:
    return f"{prefix}/{namespace}/{name}"


def start(runs: Runs, localenv: LocalEnv, prefix: str, name: str, node: str, **kw: Any) -> Any:
    runs.create(trainingrun(name, localenv, prefix, node=node, **kw))
    runs.wait_status(name, lambda s: s.get("activePod") == f"{name}-1", 30, "attempt 1 started")
    return runs.wait_pod_running(f"{name}-1")


def test_run_succeeds_when_trainer_exits_zero(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any
) -> None:
    start(runs, localenv, prefix, "ok", kwok_node())
    runs.end_pod("ok-1", 0)
    status = runs.wait_status("ok", lambda s: s.get("phase") == "Succeeded", 30, "Succeeded")
    assert status["attempt"] == 1
    assert status["restarts"] == 0 and status["preemptions"] == 0
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Succeeded"]["status"] == "True"
    assert conds["Running"]["status"] == "False"
    assert runs.wait_events("ok", "Succeeded")


def test_failed_attempt_resubmits_from_newest_checkpoint_as_restart(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, s3: Any
) -> None:
    start(runs, localenv, prefix, "fail", kwok_node())
    key = run_prefix(prefix, runs.namespace, "fail")
    commit_checkpoint(s3, localenv.bucket, key, 10, {"model.safetensors": b"w" * 100})
    commit_checkpoint(s3, localenv.bucket, key, 20, {"model.safetensors": b"x" * 120})
    runs.end_pod("fail-1", 1)
    status = runs.wait_status(
        "fail", lambda s: s.get("activePod") == "fail-2", 30, "attempt 2 started"
    )
    assert status["restarts"] == 1
    assert status["preemptions"] == 0
    assert status["resumeStep"] == 20
    assert status["latestCheckpoint"]["step"] == 20
    env = runs.env_of(runs.pod("fail-2"))
    assert env["TRAININGRUN_RESUME_STEP"] == "20"
    assert env["TRAININGRUN_RESUME_FROM"] == "/checkpoints/checkpoint-20"
    assert env["TRAININGRUN_RESUME_URI"].endswith(f"{key}/checkpoints/checkpoint-20/")
    assert env["TRAININGRUN_ATTEMPT"] == "2"
    restore = runs.env_of(runs.pod("fail-2"), "trainingrun-restore")
    assert restore["TRAININGRUN_RESTORE_STEP"] == "20"
    assert runs.wait_events("fail", "Failed") and runs.wait_events("fail", "Resumed")


def test_eviction_is_a_preemption_not_a_restart(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, core_v1: Any
) -> None:
    start(runs, localenv, prefix, "evict", kwok_node())
    core_v1.create_namespaced_pod_eviction(
        "evict-1",
        runs.namespace,
        client.V1Eviction(metadata=client.V1ObjectMeta(name="evict-1", namespace=runs.namespace)),
    )
    status = runs.wait_status(
        "evict", lambda s: s.get("activePod") == "evict-2", 30, "attempt 2 after eviction"
    )
    assert status["preemptions"] == 1
    assert status["restarts"] == 0
    messages = [e.message for e in runs.wait_events("evict", "Preempted")]
    assert messages and "EvictionByEvictionAPI" in messages[0]


def test_pod_deleted_by_someone_else_is_a_preemption(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, core_v1: Any
) -> None:
    start(runs, localenv, prefix, "deleted", kwok_node())
    core_v1.delete_namespaced_pod("deleted-1", runs.namespace)  # graceful, as kubectl does
    status = runs.wait_status(
        "deleted", lambda s: s.get("activePod") == "deleted-2", 30, "attempt 2 after deletion"
    )
    assert (status["preemptions"], status["restarts"]) == (1, 0)
    messages = [e.message for e in runs.wait_events("deleted", "Preempted")]
    assert messages and "deleted" in messages[0]


def test_node_deletion_is_a_preemption(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, core_v1: Any
) -> None:
    node = kwok_node()
    spare = kwok_node()
    start(runs, localenv, prefix, "gone", node)
    # Let the replacement schedule on the spare node. A merge patch, not a read and a replace:
    # the operator may write the status in between (the Protected condition once the trainer
    # runs), and a replace of the read version would then be refused with 409.
    selector = {"kubernetes.io/hostname": None, "type": "kwok"}
    runs.custom.patch_namespaced_custom_object(
        "trainingrun.dev",
        "v1alpha1",
        runs.namespace,
        "trainingruns",
        "gone",
        {"spec": {"template": {"spec": {"nodeSelector": selector}}}},
    )
    core_v1.delete_node(node)
    status = runs.wait_status(
        "gone", lambda s: s.get("activePod") == "gone-2", 30, "attempt 2 after node deletion"
    )
    assert status["preemptions"] == 1
    assert status["restarts"] == 0
    runs.wait_pod_running("gone-2")
    assert runs.pod("gone-2").spec.node_name != node
    del spare


def test_notice_taint_of_the_run_reaches_its_pod_and_makes_the_end_a_preemption(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, core_v1: Any
) -> None:
    # A taint key only this run knows (not an operator-wide one): its own pass annotates.
    node = kwok_node()
    start(
        runs,
        localenv,
        prefix,
        "noticed",
        node,
        preemption={"noticeTaints": ["example.com/reclaim"]},
    )
    core_v1.patch_node(
        node, {"spec": {"taints": [{"key": "example.com/reclaim", "effect": "NoSchedule"}]}}
    )
    notice = wait_for(
        lambda: (runs.pod("noticed-1").metadata.annotations or {}).get(ANNOTATION_NOTICE),
        30,
        "the notice annotation on noticed-1",
    )
    assert notice == "example.com/reclaim"
    runs.end_pod("noticed-1", 143)
    status = runs.wait_status(
        "noticed", lambda s: s.get("activePod") == "noticed-2", 30, "attempt 2 after the notice"
    )
    assert (status["preemptions"], status["restarts"]) == (1, 0)


def test_pod_of_the_attempts_name_that_is_not_the_runs_is_never_adopted(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, core_v1: Any
) -> None:
    node = kwok_node()
    core_v1.create_namespaced_pod(
        runs.namespace,
        {
            "metadata": {"name": "taken-1", "labels": {"app": "someone-else"}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [{"name": "c", "image": "example.invalid/other:1"}],
            },
        },
    )
    runs.create(trainingrun("taken", localenv, prefix, node=node))
    message = wait_for(
        lambda: next((e.message for e in runs.events("taken") if e.reason == "PodNameTaken"), None),
        30,
        "a PodNameTaken Event",
    )
    assert "taken-1" in message and "delete it or rename the run" in message
    assert not runs.get("taken").get("status", {}).get("activePod")
    assert runs.pod("taken-1").metadata.labels == {"app": "someone-else"}

    core_v1.delete_namespaced_pod("taken-1", runs.namespace, grace_period_seconds=0)
    run_uid = runs.get("taken")["metadata"]["uid"]
    pod = wait_for(
        lambda: (p := runs.pod("taken-1")) is not None and p.metadata.owner_references and p,
        60,
        "the run's own pod taken-1 (the create is retried every few seconds)",
    )
    assert [r.uid for r in pod.metadata.owner_references] == [run_uid]
    runs.wait_status("taken", lambda s: s.get("activePod") == "taken-1", 30, "attempt 1 started")


def test_node_not_ready_is_a_preemption(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, core_v1: Any
) -> None:
    node = kwok_node()
    start(runs, localenv, prefix, "sick", node)
    # Stop kwok from heartbeating for this node, then mark it as the node lifecycle controller
    # marks a node whose kubelet stopped posting status.
    core_v1.patch_node(node, {"metadata": {"annotations": {KWOK_NODE_ANNOTATION: None}}})
    time.sleep(0.5)
    mark_unknown(core_v1, node)
    status = runs.wait_status(
        "sick", lambda s: s.get("attempt", 0) >= 2, 30, "attempt 2 after node NotReady"
    )
    assert status["preemptions"] == 1
    assert status["restarts"] == 0
    # The attempt on the lost node is deleted so it cannot write again.
    wait_for(lambda: runs.pod("sick-1") is None, 30, "pod sick-1 deleted")


def test_a_pod_of_an_older_attempt_is_deleted_and_one_not_the_runs_is_not(
    runs: Runs,
    localenv: LocalEnv,
    prefix: str,
    kwok_node: Any,
    core_v1: Any,
    operator: OperatorProcess,
) -> None:
    node = kwok_node()
    start(runs, localenv, prefix, "stale", node)
    core_v1.delete_namespaced_pod("stale-1", runs.namespace, grace_period_seconds=0)
    runs.wait_status("stale", lambda s: s.get("activePod") == "stale-2", 30, "attempt 2 started")
    owner = {
        "apiVersion": f"{api.GROUP}/{api.VERSION}",
        "kind": api.KIND,
        "name": "stale",
        "uid": runs.get("stale")["metadata"]["uid"],
        "controller": True,
    }
    # Attempt 1's pod back (as if its DELETE had been lost), and a copy that is not the run's.
    for name, owners in (("stale-1", [owner]), ("stale-copy", [])):
        core_v1.create_namespaced_pod(
            runs.namespace,
            {
                "metadata": {
                    "name": name,
                    "labels": {LABEL_RUN: "stale", LABEL_ATTEMPT: "1"},
                    "ownerReferences": owners,
                },
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{"name": "c", "image": "example.invalid/other:1"}],
                },
            },
        )
    # The next pass of the run sweeps (a change of the run here; else the periodic resync).
    runs.custom.patch_namespaced_custom_object(
        api.GROUP,
        api.VERSION,
        runs.namespace,
        api.PLURAL,
        "stale",
        {"metadata": {"annotations": {"example.com/poke": "1"}}},
    )
    wait_for(lambda: runs.pod("stale-1") is None, 30, "the old attempt's pod stale-1 deleted")
    assert runs.pod("stale-copy") is not None
    assert runs.status("stale")["activePod"] == "stale-2"
    assert operator.metrics().get('trainingrun_old_pod_deletes_total{result="accepted"}', 0) >= 1


def test_max_restarts_exhausted_ends_failed(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any
) -> None:
    start(
        runs,
        localenv,
        prefix,
        "budget",
        kwok_node(),
        restart_policy={"maxRestarts": 1, "crashLoopLimit": 10},
    )
    runs.end_pod("budget-1", 1)
    runs.wait_status("budget", lambda s: s.get("activePod") == "budget-2", 30, "attempt 2")
    runs.wait_pod_running("budget-2")
    runs.end_pod("budget-2", 137, reason="OOMKilled")
    status = runs.wait_status("budget", lambda s: s.get("phase") == "Failed", 30, "Failed")
    assert status["reason"] == "RestartBudgetExhausted"
    assert status["restarts"] == 2
    assert "OOMKilled" in status["message"] or "memory" in status["message"]
    time.sleep(1)
    assert runs.pod("budget-3") is None


def test_missing_object_in_newest_checkpoint_falls_back_to_previous(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, s3: Any
) -> None:
    start(runs, localenv, prefix, "fallback", kwok_node())
    key = run_prefix(prefix, runs.namespace, "fallback")
    commit_checkpoint(s3, localenv.bucket, key, 5, {"w.bin": b"a" * 10, "opt.bin": b"b" * 5})
    commit_checkpoint(s3, localenv.bucket, key, 9, {"w.bin": b"c" * 10, "opt.bin": b"d" * 5})
    s3.delete_object(Bucket=localenv.bucket, Key=f"{key}/checkpoints/checkpoint-9/opt.bin")
    runs.end_pod("fallback-1", 1)
    runs.wait_status("fallback", lambda s: s.get("activePod") == "fallback-2", 30, "attempt 2")
    env = runs.env_of(runs.pod("fallback-2"))
    assert env["TRAININGRUN_RESUME_STEP"] == "5"
    skipped = [e.message for e in runs.wait_events("fallback", "CheckpointSkipped")]
    assert skipped and "checkpoint 9" in skipped[0] and "opt.bin is missing" in skipped[0]


def test_checkpoint_reported_corrupt_by_restore_is_marked_bad(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, s3: Any
) -> None:
    start(runs, localenv, prefix, "corrupt", kwok_node())
    key = run_prefix(prefix, runs.namespace, "corrupt")
    commit_checkpoint(s3, localenv.bucket, key, 3, {"w.bin": b"1" * 8})
    commit_checkpoint(s3, localenv.bucket, key, 6, {"w.bin": b"2" * 8})
    runs.end_pod("corrupt-1", 1)
    runs.wait_status("corrupt", lambda s: s.get("activePod") == "corrupt-2", 30, "attempt 2")
    assert runs.env_of(runs.pod("corrupt-2"))["TRAININGRUN_RESUME_STEP"] == "6"
    runs.wait_pod_running("corrupt-2")
    runs.end_pod("corrupt-2", EXIT_CHECKPOINT_BAD, reason="Error", container="trainingrun-restore")
    status = runs.wait_status(
        "corrupt", lambda s: s.get("activePod") == "corrupt-3", 30, "attempt 3"
    )
    assert status["badCheckpoints"] == [6]
    assert status["restarts"] == 1  # only attempt 1's failure; CheckpointBad spends nothing
    assert runs.env_of(runs.pod("corrupt-3"))["TRAININGRUN_RESUME_STEP"] == "3"


def test_a_missing_secret_is_waited_for_with_its_reason_then_fails_the_run(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any
) -> None:
    runs.create(trainingrun("nosecret", localenv, prefix, secret="absent", node=kwok_node()))
    waiting = runs.wait_status(
        "nosecret", lambda s: s.get("reason") == "MissingSecret", 30, "waiting for the Secret"
    )
    assert waiting["phase"] == "Pending"
    assert "absent" in waiting["message"] and "AWS_ACCESS_KEY_ID" in waiting["message"]
    assert {c["type"]: c["status"] for c in waiting["conditions"]}["Waiting"] == "True"
    # The session operator waits SECRET_WAIT_SECONDS for it (tests/integration/support.py).
    status = runs.wait_status("nosecret", lambda s: s.get("phase") == "Failed", 60, "Failed")
    assert status["reason"] == "MissingSecret"
    assert runs.pods_of("nosecret") == []


def test_a_secret_deleted_and_recreated_while_a_run_trains_holds_only_the_next_start(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, core_v1: Any
) -> None:
    start(runs, localenv, prefix, "rotate", kwok_node())
    # A rotation tool deletes the Secret, and the pod is evicted before the new one exists.
    core_v1.delete_namespaced_secret("s3creds", runs.namespace)
    evict = client.V1Eviction(
        metadata=client.V1ObjectMeta(name="rotate-1", namespace=runs.namespace)
    )
    core_v1.create_namespaced_pod_eviction("rotate-1", runs.namespace, evict)
    waiting = runs.wait_status(
        "rotate", lambda s: s.get("reason") == "MissingSecret", 60, "waiting for the Secret"
    )
    assert (waiting["phase"], waiting["attempt"], waiting["preemptions"]) == ("Pending", 2, 1)
    assert "rotate-2" not in [p.metadata.name for p in runs.pods_of("rotate")]

    core_v1.create_namespaced_secret(runs.namespace, credentials_secret(localenv))
    status = runs.wait_status(
        "rotate",
        lambda s: s.get("activePod") == "rotate-2",
        30,
        "attempt 2 once the Secret is back",
    )
    assert status["phase"] == "Running" and status["restarts"] == 0
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Waiting"] == "WaitOver"


def test_image_pull_error_is_retried_for_a_while_then_ends_the_run(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any
) -> None:
    start(runs, localenv, prefix, "pull", kwok_node())
    runs.pull_failing("pull-1", "ErrImagePull", "dial tcp 10.0.0.1:443: i/o timeout")
    status = runs.wait_status(
        "pull", lambda s: s.get("reason") == "ImagePullRetrying", 30, "ImagePullRetrying"
    )
    assert status["phase"] == "Running", status
    assert "i/o timeout" in status["message"] and "fails if the image" in status["message"]
    assert runs.pod("pull-1") is not None

    # The pull has been failing since the pod was scheduled 10 minutes ago: past the grace.
    runs.pull_failing("pull-1", "ImagePullBackOff", 'Back-off pulling image "x"', 600)
    status = runs.wait_status("pull", lambda s: s.get("phase") == "Failed", 30, "Failed")
    assert status["reason"] == "ImagePullBackOff", status
    assert (status["restarts"], status["attempt"]) == (0, 1)
    assert runs.wait_events("pull", "ImagePullBackOff")


def test_secret_deleted_mid_run_does_not_end_a_running_attempt(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, core_v1: Any
) -> None:
    core_v1.create_namespaced_secret(runs.namespace, credentials_secret(localenv, "lost-creds"))
    start(runs, localenv, prefix, "lost", kwok_node(), secret="lost-creds")
    core_v1.delete_namespaced_secret("lost-creds", runs.namespace)
    runs.end_pod("lost-1", 0)  # the attempt had its credentials: its success counts
    status = runs.wait_status(
        "lost", lambda s: s.get("phase") in ("Succeeded", "Failed"), 30, "end"
    )
    assert (status["phase"], status["reason"]) == ("Succeeded", "Succeeded")


def test_operator_metrics_count_transitions_pods_and_runs_by_phase(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, operator: OperatorProcess
) -> None:
    def scrape() -> dict[str, float] | None:
        try:
            return operator.metrics()
        except OSError:
            return None  # not serving yet (the operator starts with the session)

    before = wait_for(scrape, 60, "the operator's /metrics page")
    start(runs, localenv, prefix, "metered", kwok_node())
    runs.end_pod("metered-1", 1)
    runs.wait_status("metered", lambda s: s.get("activePod") == "metered-2", 30, "attempt 2")
    runs.wait_pod_running("metered-2")

    def grows_by(name: str, least: float) -> None:
        wait_for(
            lambda: operator.metrics().get(name, 0.0) - before.get(name, 0.0) >= least,
            10,
            f"{name} up by {least}",
        )

    # No checkpoint was committed: attempt 2 starts from scratch too (Started, not Resumed).
    grows_by('trainingrun_transitions_total{reason="Started"}', 2)
    grows_by('trainingrun_transitions_total{reason="Failed"}', 1)
    grows_by("trainingrun_pods_created_total", 2)
    grows_by("trainingrun_reconcile_seconds_count", 2)
    samples = operator.metrics()
    assert samples['trainingrun_runs{phase="Running"}'] >= 1
    assert set(k for k in samples if k.startswith("trainingrun_runs{")) == {
        f'trainingrun_runs{{phase="{p}"}}'
        for p in ("Pending", "Running", "Backoff", "Succeeded", "Failed")
    }


def test_kubectl_get_shows_live_columns(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, s3: Any
) -> None:
    start(runs, localenv, prefix, "cols", kwok_node())
    commit_checkpoint(
        s3, localenv.bucket, run_prefix(prefix, runs.namespace, "cols"), 42, {"w": b"1"}
    )
    runs.end_pod("cols-1", 1)
    runs.wait_status("cols", lambda s: s.get("activePod") == "cols-2", 30, "attempt 2")
    out = localenv.kubectl("get", "trainingruns", "-n", runs.namespace)
    header, row = out.strip().splitlines()[:2]
    assert header.split() == [
        "NAME",
        "PHASE",
        "ATTEMPT",
        "RESTARTS",
        "PREEMPTIONS",
        "CHECKPOINT",
        "PROGRESS",
        "ETA",
        "AGE",
    ]
    assert row.split()[:6] == ["cols", "Running", "2", "1", "0", "42"]
    wide = localenv.kubectl("get", "trainingruns", "-n", runs.namespace, "-o", "wide")
    assert "REASON" in wide.splitlines()[0] and "MESSAGE" in wide.splitlines()[0]
    assert "Resumed" in wide.splitlines()[1]


def test_kubectl_get_shows_the_trainers_progress(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, s3: Any
) -> None:
    """Rank 0's sidecar publishes the trainer's progress into the run's prefix; the operator
    reads it with a manifest refresh (the next pass a pod event brings) and kubectl shows it."""
    start(runs, localenv, prefix, "prog", kwok_node())
    now = time.time()
    record = ProgressRecord(600, 1, 400, now - 200, now, total_steps=1000)
    key = f"{run_prefix(prefix, runs.namespace, 'prog')}/{PROGRESS_RECORD}"
    s3.put_object(Bucket=localenv.bucket, Key=key, Body=encode(record))
    time.sleep(1.5)  # past TRAININGRUN_PROGRESS_REFRESH_SECONDS since the first pass's read
    localenv.kubectl("annotate", "pod", "prog-1", "-n", runs.namespace, "poke=1")

    status = runs.wait_status("prog", lambda s: bool(s.get("progress")), 30, "progress")
    assert (status["progress"]["step"], status["progress"]["summary"]) == (600, "60%")
    assert status["progress"]["etaSeconds"] == 400  # 400 steps at 1 step/s since step 400
    out = localenv.kubectl("get", "trainingruns", "-n", runs.namespace, "-o", "wide")
    header, row = out.strip().splitlines()[:2]
    assert header.split()[5:10] == ["CHECKPOINT", "PROGRESS", "ETA", "AGE", "STEP"]
    cells = row.split()  # no checkpoint yet: its cell is blank, so found by value
    at = cells.index("60%")
    assert re.fullmatch(r"6m[0-3]?\ds", cells[at + 1])  # 6m40s less the seconds since
    assert cells[at + 3] == "600"  # after the age


def test_operator_killed_around_resubmissions_makes_one_pod_per_attempt(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, operator: OperatorProcess
) -> None:
    start(
        runs,
        localenv,
        prefix,
        "chaos",
        kwok_node(),
        restart_policy={
            "maxRestarts": 20,
            "crashLoopLimit": 20,
            "backoff": {"initialSeconds": 0, "maxSeconds": 0},
        },
    )
    rng = random.Random(7)
    rounds = 5
    try:
        for attempt in range(1, rounds + 1):
            runs.wait_pod_running(f"chaos-{attempt}")
            runs.end_pod(f"chaos-{attempt}", 1)
            # Kill at a random moment of the resubmission (before, during or after the status
            # write and the pod create), then restart.
            time.sleep(rng.uniform(0.0, 0.4))
            operator.kill()
            operator.start()
            runs.wait_status(
                "chaos",
                lambda s, a=attempt: s.get("activePod") == f"chaos-{a + 1}",
                45,
                f"attempt {attempt + 1}",
            )
    finally:
        if not operator.alive():
            operator.start()
    names = sorted(p.metadata.name for p in runs.pods_of("chaos"))
    assert names == sorted(f"chaos-{i}" for i in range(1, rounds + 2))
    status = runs.status("chaos")
    assert status["attempt"] == rounds + 1
    assert status["restarts"] == rounds


def test_deleting_a_run_removes_its_pod_and_keeps_the_bucket(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, s3: Any
) -> None:
    start(runs, localenv, prefix, "bye", kwok_node())
    key = run_prefix(prefix, runs.namespace, "bye")
    commit_checkpoint(s3, localenv.bucket, key, 7, {"w.bin": b"7" * 16})
    runs.delete("bye")
    wait_for(lambda: runs.pods_of("bye") == [], 60, "the run's pods to be garbage collected")
    listed = s3.list_objects_v2(Bucket=localenv.bucket, Prefix=f"{key}/")
    keys = {o["Key"] for o in listed.get("Contents", [])}
    assert f"{key}/manifest.json" in keys
    assert f"{key}/checkpoints/checkpoint-7/w.bin" in keys
