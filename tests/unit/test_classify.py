"""classify(): how an attempt ended, from the pod and its node as API JSON.

Covers every row of the table in ``trainingrun.decide.classify`` and the cases around them:

- trainer exit 0 (or pod Succeeded) -> Succeeded, also on a noticed or failing node; while the
  pod still runs (its sidecar commits the last checkpoint) on a Ready node -> NotEnded
  "Finishing";
- non-zero exit -> Failed "Error" (with the termination message), OOMKilled, a failed user
  init container, a failed pod without container statuses;
- DisruptionTarget with each reason the control plane sets -> Preempted with that reason once
  the pod stopped (also when the trainer then exited non-zero), or at once when its node is
  NotReady, deleted or unknown; while a Ready node stops it -> NotEnded "Terminating" (the save
  at SIGTERM must land first); a DisruptionTarget that is not True is ignored;
- a pod deleted by someone else (no DisruptionTarget): NotEnded "Terminating" while a Ready node
  stops it (also after the trainer exited, while the sidecar commits), then Preempted
  "PodDeleted", not a failure; at once when removed with grace 0 or on a NotReady node; a
  finished trainer still succeeds;
- pod gone, node deleted, node NotReady/Unknown, ``status.reason`` Shutdown/Evicted/NodeLost/
  Terminated/Preempting -> Preempted;
- a notice taint on the node or the notice annotation, then an end -> Preempted; a notice alone
  (still running) is not an end; taints outside ``notice_taints`` are not notices;
- the operator's restore exiting with the checkpoint-bad code -> CheckpointBad (also in the pod
  as the reconciler's cache keeps it), any other restore exit -> Failed; a container of the
  restore's name that is not the operator's (a user init container of a fresh start, a faked
  resume annotation dropped, a pod without the resume annotation) exiting with that code ->
  Failed "InitFailed";
- image and config errors on any container -> Permanent; an image pull error (ErrImagePull,
  ImagePullBackOff) only once it has lasted IMAGE_PULL_GRACE_SECONDS since the pod was scheduled
  (or created), NotEnded "ImagePullRetrying" with the time to look again before that;
- running, pending, container creating -> NotEnded.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.unit.builders import RunBuilder, make_node, make_pod, make_run, pod_from
from trainingrun.api import DEFAULT_NOTICE_TAINTS
from trainingrun.cache import slim_pod
from trainingrun.contract import (
    ANNOTATION_RESUME_STEP,
    EXIT_CHECKPOINT_BAD,
    RESTORE_CONTAINER,
    SYNC_CONTAINER,
)
from trainingrun.decide.classify import (
    IMAGE_PULL_GRACE_SECONDS,
    End,
    Outcome,
    classify,
)
from trainingrun.decide.pod import AgentSettings, RunRef, build_pod, resume_of

SPOT_TAINT = "aws-node-termination-handler/spot-itn"


@dataclass(frozen=True)
class Case:
    pod: dict[str, Any] | None
    end: End
    reason: str
    node: dict[str, Any] | None = None
    node_deleted: bool = False
    message_has: str = ""


# The pods below were scheduled at 11:30 (the builder's condition time) unless they say.
NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def _classify(case: Case) -> Outcome:
    return classify(
        case.pod,
        node=case.node,
        node_deleted=case.node_deleted,
        notice_taints=DEFAULT_NOTICE_TAINTS,
        now=NOW,
    )


def _built(run: RunBuilder | RunRef, step: int | None) -> dict[str, Any]:
    """Attempt 2's pod as the operator builds it, resuming from ``step`` (None: fresh start)."""
    ref = run if isinstance(run, RunRef) else run.ref()
    return build_pod(ref, 2, resume_of(ref, step), AgentSettings(), epoch=2)


# The operator's pod of an attempt that resumes from checkpoint 120: its restore is the one.
RESUMED_POD = _built(make_run("r1").with_checkpoint(120), 120)
# A user init container named like the restore, in a fresh start's pod (no restore of ours).
USER_RESTORE = {"name": RESTORE_CONTAINER, "image": "busybox", "command": ["sh", "-c", "exit 3"]}


def _ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


ready_node = make_node("n1").build()


def removed(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's last state as its DELETED event carries it: deleted with grace 0."""
    pod["metadata"]["deletionTimestamp"] = "2025-01-01T12:00:00Z"
    pod["metadata"]["deletionGracePeriodSeconds"] = 0
    return pod


def deleting(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod deleted by someone else (``kubectl delete pod``): graceful, no DisruptionTarget."""
    pod["metadata"]["deletionTimestamp"] = "2025-01-01T12:00:00Z"
    pod["metadata"]["deletionGracePeriodSeconds"] = 30
    return pod


CASES = [
    # -- Succeeded --------------------------------------------------------------------------
    pytest.param(
        Case(make_pod().trainer_exited(0).build(), End.SUCCEEDED, "Succeeded", ready_node),
        id="trainer-exit-0-succeeds",
    ),
    pytest.param(
        Case(make_pod().phase("Succeeded").on_node().build(), End.SUCCEEDED, "Succeeded"),
        id="pod-phase-succeeded-without-container-statuses-succeeds",
    ),
    pytest.param(
        Case(
            make_pod().trainer_exited(0).build(),
            End.SUCCEEDED,
            "Succeeded",
            make_node().tainted(SPOT_TAINT).build(),
        ),
        id="trainer-exit-0-after-notice-taint-still-succeeds",
    ),
    pytest.param(
        Case(
            make_pod().trainer_exited(0).build(),
            End.SUCCEEDED,
            "Succeeded",
            make_node().not_ready().build(),
        ),
        id="trainer-exit-0-on-not-ready-node-still-succeeds",
    ),
    pytest.param(
        Case(
            make_pod().running().trainer_exited(0, phase="Running").build(),
            End.NOT_ENDED,
            "Finishing",
            ready_node,
            message_has="commits the last checkpoint",
        ),
        id="trainer-exit-0-while-the-sidecar-still-commits-is-finishing",
    ),
    pytest.param(
        Case(
            make_pod().running().trainer_exited(0, phase="Running").build(),
            End.SUCCEEDED,
            "Succeeded",
            make_node().not_ready().build(),
        ),
        id="trainer-exit-0-with-the-sidecar-up-on-a-not-ready-node-succeeds",
    ),
    pytest.param(
        Case(
            make_pod().running().trainer_exited(0, phase="Running").build(),
            End.SUCCEEDED,
            "Succeeded",
            None,
            node_deleted=True,
        ),
        id="trainer-exit-0-with-the-sidecar-up-on-a-deleted-node-succeeds",
    ),
    pytest.param(
        Case(
            removed(make_pod().running().trainer_exited(0, phase="Running").build()),
            End.SUCCEEDED,
            "Succeeded",
            ready_node,
        ),
        id="trainer-exit-0-then-the-pod-removed-succeeds",
    ),
    # -- Failed -----------------------------------------------------------------------------
    pytest.param(
        Case(
            make_pod().trainer_exited(1).build(),
            End.FAILED,
            "Error",
            ready_node,
            message_has="exited 1",
        ),
        id="trainer-exit-1-fails-with-error",
    ),
    pytest.param(
        Case(
            make_pod().trainer_exited(2, message="CUDA error: device-side assert\n").build(),
            End.FAILED,
            "Error",
            ready_node,
            message_has="CUDA error: device-side assert",
        ),
        id="trainer-failure-message-carries-termination-message",
    ),
    pytest.param(
        Case(
            make_pod().trainer_exited(137).build(),
            End.FAILED,
            "Error",
            ready_node,
            message_has="137",
        ),
        id="trainer-sigkill-without-oom-fails-with-error",
    ),
    pytest.param(
        Case(
            make_pod().trainer_exited(143).build(),
            End.FAILED,
            "Error",
            ready_node,
            message_has="143",
        ),
        id="trainer-sigterm-without-notice-fails-with-error",
    ),
    pytest.param(
        Case(
            make_pod().trainer_exited(137, reason="OOMKilled").build(),
            End.FAILED,
            "OOMKilled",
            ready_node,
            message_has="out of memory",
        ),
        id="trainer-oomkilled-fails-with-oomkilled",
    ),
    pytest.param(
        Case(
            make_pod().trainer_exited(1, phase="Running").build(),
            End.FAILED,
            "Error",
            ready_node,
        ),
        id="trainer-terminated-while-sidecar-keeps-pod-running-fails",
    ),
    pytest.param(
        Case(
            make_pod().init_exited("download-data", 1).build(),
            End.FAILED,
            "InitFailed",
            ready_node,
            message_has="download-data",
        ),
        id="user-init-container-exit-1-fails-with-init-failed",
    ),
    pytest.param(
        Case(
            make_pod().restore_exited(1).build(),
            End.FAILED,
            "InitFailed",
            ready_node,
            message_has="trainingrun-restore",
        ),
        id="restore-exit-1-is-a-failure-not-a-bad-checkpoint",
    ),
    pytest.param(
        Case(make_pod().phase("Failed").on_node().build(), End.FAILED, "PodFailed", ready_node),
        id="failed-pod-without-container-statuses-fails",
    ),
    pytest.param(
        Case(
            make_pod().trainer_exited(1).build(),
            End.FAILED,
            "Error",
            make_node().tainted("node.kubernetes.io/unschedulable").build(),
        ),
        id="taint-outside-notice-list-is-not-a-notice",
    ),
    # -- Preempted: DisruptionTarget --------------------------------------------------------
    *[
        pytest.param(
            Case(
                make_pod().running().disrupted(reason, f"{reason} message").build(),
                End.PREEMPTED,
                reason,
                make_node("n1").not_ready().build(),
                message_has=f"{reason} message",
            ),
            id=f"disruption-target-{reason}-on-a-not-ready-node-preempts-at-once",
        )
        for reason in (
            "PreemptionByScheduler",
            "DeletionByTaintManager",
            "EvictionByEvictionAPI",
            "DeletionByPodGC",
            "TerminationByKubelet",
        )
    ],
    *[
        pytest.param(
            Case(
                make_pod().running().disrupted(reason).build(),
                End.NOT_ENDED,
                "Terminating",
                ready_node,
                message_has=reason,
            ),
            id=f"disruption-target-{reason}-waits-while-a-ready-node-stops-the-pod",
        )
        for reason in ("EvictionByEvictionAPI", "PreemptionByScheduler", "TerminationByKubelet")
    ],
    pytest.param(
        Case(
            make_pod().running().disrupted("EvictionByEvictionAPI").build(),
            End.PREEMPTED,
            "EvictionByEvictionAPI",
            None,
        ),
        id="disruption-target-on-an-unknown-node-preempts",
    ),
    pytest.param(
        Case(
            removed(make_pod().running().disrupted("EvictionByEvictionAPI").build()),
            End.PREEMPTED,
            "EvictionByEvictionAPI",
            ready_node,
        ),
        id="disruption-target-in-a-removed-pods-last-state-preempts",
    ),
    pytest.param(
        Case(
            make_pod().running().disrupted("DeletionByTaintManager").build(),
            End.PREEMPTED,
            "DeletionByTaintManager",
            None,
            node_deleted=True,
        ),
        id="disruption-target-on-a-deleted-node-preempts-at-once",
    ),
    *[
        pytest.param(
            Case(
                make_pod().trainer_exited(143).disrupted(reason, f"{reason} message").build(),
                End.PREEMPTED,
                reason,
                ready_node,
                message_has=f"{reason} message",
            ),
            id=f"disruption-target-{reason}-preempts-once-the-pod-stopped",
        )
        for reason in (
            "PreemptionByScheduler",
            "DeletionByTaintManager",
            "EvictionByEvictionAPI",
            "DeletionByPodGC",
            "TerminationByKubelet",
        )
    ],
    pytest.param(
        Case(
            make_pod().trainer_exited(143).disrupted("EvictionByEvictionAPI").build(),
            End.PREEMPTED,
            "EvictionByEvictionAPI",
            ready_node,
        ),
        id="disruption-target-beats-the-non-zero-exit-it-caused",
    ),
    pytest.param(
        Case(
            make_pod().running().condition("DisruptionTarget", "False").build(),
            End.NOT_ENDED,
            "Running",
            ready_node,
        ),
        id="disruption-target-false-is-ignored",
    ),
    # -- Preempted: pod or node gone --------------------------------------------------------
    pytest.param(Case(None, End.PREEMPTED, "PodDeleted"), id="pod-gone-preempts"),
    pytest.param(
        Case(deleting(make_pod().running().build()), End.NOT_ENDED, "Terminating", ready_node),
        id="pod-being-deleted-waits-while-a-ready-node-stops-it",
    ),
    pytest.param(
        Case(
            deleting(make_pod().trainer_exited(143, phase="Running").build()),
            End.NOT_ENDED,
            "Terminating",
            ready_node,
        ),
        id="pod-being-deleted-waits-for-the-sidecar-after-the-trainer-stopped",
    ),
    pytest.param(
        Case(
            deleting(make_pod().trainer_exited(143).build()),
            End.PREEMPTED,
            "PodDeleted",
            ready_node,
        ),
        id="pod-deleted-by-someone-else-preempts-once-stopped-not-a-failure",
    ),
    pytest.param(
        Case(removed(make_pod().running().build()), End.PREEMPTED, "PodDeleted", ready_node),
        id="pod-removed-with-grace-0-preempts",
    ),
    pytest.param(
        Case(
            deleting(make_pod().running().build()),
            End.PREEMPTED,
            "PodDeleted",
            make_node("n1").not_ready().build(),
        ),
        id="pod-being-deleted-on-a-not-ready-node-preempts-at-once",
    ),
    pytest.param(
        Case(
            deleting(make_pod().trainer_exited(0).build()), End.SUCCEEDED, "Succeeded", ready_node
        ),
        id="pod-deleted-after-the-trainer-finished-succeeds",
    ),
    pytest.param(
        Case(make_pod().running().build(), End.PREEMPTED, "NodeDeleted", None, node_deleted=True),
        id="node-deleted-preempts",
    ),
    pytest.param(
        Case(
            make_pod().running().build(),
            End.PREEMPTED,
            "NodeNotReady",
            make_node().not_ready().build(),
        ),
        id="node-not-ready-preempts",
    ),
    pytest.param(
        Case(
            make_pod().running().build(),
            End.PREEMPTED,
            "NodeNotReady",
            make_node().unreachable().build(),
        ),
        id="node-ready-unknown-preempts",
    ),
    pytest.param(
        Case(make_pod().build(), End.NOT_ENDED, "Pending", make_node().not_ready().build()),
        id="unscheduled-pod-ignores-a-not-ready-node",
    ),
    *[
        pytest.param(
            Case(
                make_pod().on_node().ended_by(reason, f"node said {reason}").build(),
                End.PREEMPTED,
                reason,
                ready_node,
                message_has=f"node said {reason}",
            ),
            id=f"pod-status-reason-{reason}-preempts",
        )
        for reason in ("Shutdown", "Evicted", "NodeLost", "Terminated", "Preempting")
    ],
    # -- Preempted: notice, then an end -----------------------------------------------------
    *[
        pytest.param(
            Case(
                make_pod().trainer_exited(143).build(),
                End.PREEMPTED,
                "PreemptionNotice",
                make_node().tainted(taint, "NoExecute").build(),
                message_has=taint,
            ),
            id=f"exit-after-notice-taint-{taint.split('/')[0]}-preempts",
        )
        for taint in DEFAULT_NOTICE_TAINTS
    ],
    pytest.param(
        Case(
            make_pod().trainer_exited(1).with_notice_annotation("spot-itn").build(),
            End.PREEMPTED,
            "PreemptionNotice",
            ready_node,
            message_has="spot-itn",
        ),
        id="exit-after-notice-annotation-preempts",
    ),
    pytest.param(
        Case(
            make_pod().phase("Failed").on_node().build(),
            End.PREEMPTED,
            "PreemptionNotice",
            make_node().tainted(SPOT_TAINT).build(),
        ),
        id="failed-pod-after-notice-taint-preempts",
    ),
    pytest.param(
        Case(
            make_pod().running().build(),
            End.NOT_ENDED,
            "Running",
            make_node().tainted(SPOT_TAINT).build(),
        ),
        id="notice-taint-alone-is-not-an-end",
    ),
    pytest.param(
        Case(
            make_pod().running().with_notice_annotation().build(),
            End.NOT_ENDED,
            "Running",
            ready_node,
        ),
        id="notice-annotation-alone-is-not-an-end",
    ),
    # -- CheckpointBad ----------------------------------------------------------------------
    pytest.param(
        Case(
            pod_from(RESUMED_POD)
            .restore_exited(EXIT_CHECKPOINT_BAD, message="model.safetensors: checksum mismatch\n")
            .build(),
            End.CHECKPOINT_BAD,
            "CheckpointBad",
            ready_node,
            message_has="model.safetensors: checksum mismatch",
        ),
        id="restore-exit-3-is-a-bad-checkpoint",
    ),
    pytest.param(
        Case(
            pod_from(RESUMED_POD).restore_exited(EXIT_CHECKPOINT_BAD).build(),
            End.CHECKPOINT_BAD,
            "CheckpointBad",
            ready_node,
            message_has="corrupt",
        ),
        id="restore-exit-3-without-message-is-a-bad-checkpoint",
    ),
    # -- Permanent --------------------------------------------------------------------------
    *[
        pytest.param(
            Case(
                make_pod().on_node().waiting(reason, message=f"{reason} detail").build(),
                End.PERMANENT,
                reason,
                ready_node,
                message_has=f"container trainer: {reason} detail",
            ),
            id=f"trainer-waiting-{reason}-is-permanent",
        )
        for reason in (
            "ErrImagePull",
            "ImagePullBackOff",
            "InvalidImageName",
            "CreateContainerConfigError",
        )
    ],
    pytest.param(
        Case(
            make_pod()
            .on_node()
            .waiting(
                "CreateContainerConfigError",
                container=SYNC_CONTAINER,
                message='secret "s3-creds" not found',
            )
            .build(),
            End.PERMANENT,
            "CreateContainerConfigError",
            ready_node,
            message_has=f'container {SYNC_CONTAINER}: secret "s3-creds" not found',
        ),
        id="sidecar-missing-secret-is-permanent",
    ),
    *[
        pytest.param(
            Case(
                make_pod().scheduled(_ago(age)).waiting(reason, message=f"{reason} detail").build(),
                end,
                reason if end is End.PERMANENT else "ImagePullRetrying",
                ready_node,
                message_has=f"container trainer: {reason} detail",
            ),
            id=f"{reason}-{age}s-after-scheduling-is-{end.value}",
        )
        for reason in ("ErrImagePull", "ImagePullBackOff")
        for age, end in (
            (10, End.NOT_ENDED),
            (IMAGE_PULL_GRACE_SECONDS - 1, End.NOT_ENDED),
            (IMAGE_PULL_GRACE_SECONDS, End.PERMANENT),
            (3600, End.PERMANENT),
        )
    ],
    pytest.param(
        Case(
            make_pod().scheduled(_ago(10)).waiting("InvalidImageName").build(),
            End.PERMANENT,
            "InvalidImageName",
            ready_node,
        ),
        id="invalid-image-name-is-permanent-at-once",
    ),
    pytest.param(
        Case(
            make_pod()
            .scheduled(_ago(10))
            .waiting("CreateContainerConfigError", message='secret "s3" not found')
            .build(),
            End.PERMANENT,
            "CreateContainerConfigError",
            ready_node,
        ),
        id="missing-secret-is-permanent-at-once",
    ),
    pytest.param(
        Case(
            make_pod().created(_ago(10)).waiting("ErrImagePull").build(),
            End.NOT_ENDED,
            "ImagePullRetrying",
            ready_node,
        ),
        id="pull-error-of-a-pod-not-yet-scheduled-counts-from-its-creation",
    ),
    pytest.param(
        Case(
            make_pod()
            .created(_ago(3600))
            .waiting("ImagePullBackOff", container=SYNC_CONTAINER)
            .build(),
            End.PERMANENT,
            "ImagePullBackOff",
            ready_node,
            message_has=f"container {SYNC_CONTAINER}",
        ),
        id="sidecar-pull-error-past-the-grace-is-permanent",
    ),
    # -- NotEnded ---------------------------------------------------------------------------
    pytest.param(
        Case(make_pod().running().build(), End.NOT_ENDED, "Running", ready_node),
        id="running-pod-has-not-ended",
    ),
    pytest.param(
        Case(make_pod().build(), End.NOT_ENDED, "Pending"),
        id="pending-pod-has-not-ended",
    ),
    pytest.param(
        Case(
            make_pod().on_node().waiting("ContainerCreating").build(),
            End.NOT_ENDED,
            "Pending",
            ready_node,
        ),
        id="container-creating-has-not-ended",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_classify(case: Case) -> None:
    outcome = _classify(case)

    assert (outcome.end, outcome.reason) == (case.end, case.reason)
    assert case.message_has in outcome.message
    assert outcome.ended is (case.end is not End.NOT_ENDED)


def _faked_resume_annotation() -> RunRef:
    """A run whose template has the user restore and the operator's resume annotation."""
    ref = make_run("r1").with_init_container(USER_RESTORE).ref()
    template = copy.deepcopy(ref.spec.template)
    template["metadata"]["annotations"][ANNOTATION_RESUME_STEP] = "120"
    spec = ref.spec.model_copy(update={"template": template})
    return RunRef(name=ref.name, namespace=ref.namespace, uid=ref.uid, spec=spec)


@pytest.mark.parametrize(
    ("pod", "end", "reason"),
    [
        pytest.param(
            pod_from(RESUMED_POD).restore_exited(EXIT_CHECKPOINT_BAD).build(),
            End.CHECKPOINT_BAD,
            "CheckpointBad",
            id="the-operators-restore-is-a-bad-checkpoint",
        ),
        pytest.param(
            slim_pod(pod_from(RESUMED_POD).restore_exited(EXIT_CHECKPOINT_BAD).build()),
            End.CHECKPOINT_BAD,
            "CheckpointBad",
            id="the-operators-restore-as-the-pod-cache-keeps-it",
        ),
        pytest.param(
            pod_from(_built(make_run("r1").with_init_container(USER_RESTORE), None))
            .init_exited(RESTORE_CONTAINER, EXIT_CHECKPOINT_BAD)
            .build(),
            End.FAILED,
            "InitFailed",
            id="a-user-init-container-of-the-same-name-is-a-failure",
        ),
        pytest.param(
            pod_from(_built(_faked_resume_annotation(), None))
            .init_exited(RESTORE_CONTAINER, EXIT_CHECKPOINT_BAD)
            .build(),
            End.FAILED,
            "InitFailed",
            id="with-a-resume-annotation-faked-in-the-template-too",
        ),
        pytest.param(
            make_pod().restore_exited(EXIT_CHECKPOINT_BAD).build(),
            End.FAILED,
            "InitFailed",
            id="in-a-pod-without-the-operators-resume-annotation",
        ),
    ],
)
def test_only_the_operators_restore_reports_a_bad_checkpoint(
    pod: dict[str, Any], end: End, reason: str
) -> None:
    outcome = classify(pod, node=make_node().build(), node_deleted=False, notice_taints=[], now=NOW)

    assert (outcome.end, outcome.reason) == (end, reason), outcome.message
    if end is End.FAILED:
        assert RESTORE_CONTAINER in outcome.message


def test_notice_taints_come_from_the_argument_not_the_defaults() -> None:
    pod = make_pod().trainer_exited(143).build()
    node = make_node().tainted("example.com/draining").build()

    default = classify(
        pod, node=node, node_deleted=False, notice_taints=DEFAULT_NOTICE_TAINTS, now=NOW
    )
    custom = classify(
        pod, node=node, node_deleted=False, notice_taints=["example.com/draining"], now=NOW
    )

    assert default.end is End.FAILED
    assert (custom.end, custom.reason) == (End.PREEMPTED, "PreemptionNotice")


def test_classify_does_not_modify_its_inputs() -> None:
    pod_builder = make_pod().trainer_exited(143).with_notice_annotation()
    node_builder = make_node().tainted(SPOT_TAINT)
    pod, node = pod_builder.build(), node_builder.build()

    classify(pod, node=node, node_deleted=False, notice_taints=DEFAULT_NOTICE_TAINTS, now=NOW)

    assert pod == pod_builder.build()
    assert node == node_builder.build()


def test_image_pull_retrying_says_when_it_decides() -> None:
    pod = make_pod().scheduled(_ago(60)).waiting("ErrImagePull", message="i/o timeout").build()

    outcome = classify(
        pod, node=ready_node, node_deleted=False, notice_taints=DEFAULT_NOTICE_TAINTS, now=NOW
    )

    deadline = NOW + timedelta(seconds=IMAGE_PULL_GRACE_SECONDS - 60)
    assert outcome.decide_at == deadline
    assert deadline.strftime("%Y-%m-%dT%H:%M:%SZ") in outcome.message
    assert "i/o timeout" in outcome.message
