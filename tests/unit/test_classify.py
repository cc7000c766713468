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
- the operator's restore exiting with the insufficient-disk code -> Permanent "InsufficientDisk"
  with its message (the run fails, it does not loop); the same code from a container that is not
  the operator's restore -> Failed "InitFailed";
- every message taken from a container or pod status is bounded (``bounded``): control
  characters become spaces, at most MESSAGE_MAX characters with a marker naming what was cut;
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
from trainingrun.api import DEFAULT_NOTICE_TAINTS, RestartPolicySpec
from trainingrun.contract import (
    ANNOTATION_RESUME_STEP,
    EXIT_CHECKPOINT_BAD,
    EXIT_INSUFFICIENT_DISK,
    RESTORE_CONTAINER,
    SYNC_CONTAINER,
)
from trainingrun.decide.classify import (
    CONFIG_CACHE_GRACE_SECONDS,
    IMAGE_PULL_GRACE_SECONDS,
    End,
    Outcome,
    classify,
)
from trainingrun.decide.naming import RunRef
from trainingrun.decide.pod import AgentSettings, build_pod, resume_of
from trainingrun.decide.podview import MESSAGE_MAX, bounded
from trainingrun.decide.policy import Action, Counters, decide
from trainingrun.operator.cache import slim_pod

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


# How the restore's exit codes are read when they come from the operator's own restore.
RESTORE_CODES = {
    EXIT_CHECKPOINT_BAD: (End.CHECKPOINT_BAD, "CheckpointBad"),
    EXIT_INSUFFICIENT_DISK: (End.PERMANENT, "InsufficientDisk"),
}


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
    # -- CheckpointBad, InsufficientDisk: the restore's own exit codes, with its termination
    # message, or without one (the ending says what the code means) --------------------------
    *[
        pytest.param(
            Case(
                pod_from(RESUMED_POD).restore_exited(code, message=message or None).build(),
                *RESTORE_CODES[code],
                ready_node,
                message_has=message.strip() or says,
            ),
            id=case_id,
        )
        for code, message, says, case_id in [
            (
                EXIT_CHECKPOINT_BAD,
                "model.safetensors: checksum mismatch\n",
                "",
                "restore-exit-3-is-a-bad-checkpoint",
            ),
            (
                EXIT_CHECKPOINT_BAD,
                "",
                "corrupt",
                "restore-exit-3-without-message-is-a-bad-checkpoint",
            ),
            (
                EXIT_INSUFFICIENT_DISK,
                "checkpoint-120 needs 2000 bytes but only 1000 bytes are free\n",
                "",
                "restore-out-of-disk-is-permanent-with-its-message",
            ),
            (
                EXIT_INSUFFICIENT_DISK,
                "",
                "sizeLimit",
                "restore-out-of-disk-without-message-is-permanent",
            ),
        ]
    ],
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
    *[
        pytest.param(
            Case(
                make_pod()
                .scheduled(_ago(age))
                .waiting(
                    "CreateContainerConfigError",
                    container=container,
                    message=f"failed to sync {kind} cache: timed out waiting for the condition",
                )
                .build(),
                end,
                reason,
                ready_node,
                message_has=f"container {container}: failed to sync {kind} cache",
            ),
            id=f"{container}-{kind}-cache-not-synced-{age}s-after-scheduling-is-{end.value}",
        )
        for kind, container in (("secret", SYNC_CONTAINER), ("configmap", "trainer"))
        for age, end, reason in (
            (10, End.NOT_ENDED, "ContainerConfigRetrying"),
            (CONFIG_CACHE_GRACE_SECONDS - 1, End.NOT_ENDED, "ContainerConfigRetrying"),
            (CONFIG_CACHE_GRACE_SECONDS, End.FAILED, "ContainerConfigUnreadable"),
            (3600, End.FAILED, "ContainerConfigUnreadable"),
        )
    ],
    pytest.param(
        Case(
            make_pod()
            .on_node("spot-7")
            .scheduled(_ago(CONFIG_CACHE_GRACE_SECONDS))
            .waiting(
                "CreateContainerConfigError",
                message="failed to sync secret cache: timed out waiting for the condition",
            )
            .build(),
            End.FAILED,
            "ContainerConfigUnreadable",
            ready_node,
            message_has=(
                f"the kubelet of node spot-7 could not read it for {CONFIG_CACHE_GRACE_SECONDS}s"
            ),
        ),
        id="cache-not-synced-past-the-grace-names-the-node",
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


def _restore_ended(where: str, code: int) -> dict[str, Any]:
    """A pod whose restore container exited with ``code``: the operator's (``ours``, and as
    the pod cache keeps it), or one of the same name it did not add."""
    if where == "ours":
        return pod_from(RESUMED_POD).restore_exited(code).build()
    if where == "ours-cached":
        return slim_pod(pod_from(RESUMED_POD).restore_exited(code).build())
    if where == "no-resume-annotation":
        return make_pod().restore_exited(code).build()
    run = (
        make_run("r1").with_init_container(USER_RESTORE)
        if where == "user-init-container"
        else _faked_resume_annotation()
    )
    return pod_from(_built(run, None)).init_exited(RESTORE_CONTAINER, code).build()


@pytest.mark.parametrize("code", list(RESTORE_CODES), ids=["checkpoint-bad", "out-of-disk"])
@pytest.mark.parametrize(
    "where",
    [
        "ours",
        "ours-cached",
        "user-init-container",  # a user init container of the same name: a failure
        "faked-resume-annotation",  # with the resume annotation faked in the template too
        "no-resume-annotation",  # a pod without the operator's resume annotation
    ],
)
def test_only_the_operators_restore_reports_its_exit_codes(where: str, code: int) -> None:
    pod = _restore_ended(where, code)

    outcome = classify(pod, node=make_node().build(), node_deleted=False, notice_taints=[], now=NOW)

    if where.startswith("ours"):
        assert (outcome.end, outcome.reason) == RESTORE_CODES[code], outcome.message
    else:
        assert (outcome.end, outcome.reason) == (End.FAILED, "InitFailed"), outcome.message
        assert RESTORE_CONTAINER in outcome.message


# The pod of an attempt whose restore runs beside the trainer (restoreMode AlongsideTrainer).
ALONGSIDE_POD = _built(
    make_run("r1").with_checkpoint(120).with_checkpoint_fields(restoreMode="AlongsideTrainer"), 120
)


def _alongside(restore: int | None, trainer: int | None, node: str = "ready") -> Case:
    """The alongside pod, running, its restore and trainer exited with the given codes (None:
    still running)."""
    pod = pod_from(ALONGSIDE_POD).running()
    if restore is not None:
        pod.restore_beside_exited(restore, message=f"restore said {restore}")
    if trainer is not None:
        pod.trainer_exited(trainer, phase="Running")
    built = pod.build()
    if trainer is not None and trainer != 0:
        built["status"]["phase"] = "Failed"
    node_obj = make_node("n1").not_ready().build() if node == "not-ready" else ready_node
    return Case(built, End.NOT_ENDED, "", node_obj)


@pytest.mark.parametrize(
    ("restore", "trainer", "node", "end", "reason", "says"),
    [
        (None, None, "ready", End.NOT_ENDED, "Running", ""),
        (0, None, "ready", End.NOT_ENDED, "Running", ""),
        (EXIT_CHECKPOINT_BAD, None, "ready", End.CHECKPOINT_BAD, "CheckpointBad", "said 3"),
        (EXIT_INSUFFICIENT_DISK, None, "ready", End.PERMANENT, "InsufficientDisk", "said"),
        (1, None, "ready", End.FAILED, "RestoreFailed", "the restore exited 1: restore said 1"),
        (1, 1, "ready", End.FAILED, "RestoreFailed", "the restore exited 1"),
        (137, None, "not-ready", End.PREEMPTED, "NodeNotReady", "not ready"),
        (0, 1, "ready", End.FAILED, "Error", "the trainer exited 1"),
    ],
    ids=[
        "both-running",
        "restored-trainer-running",
        "checkpoint-bad-while-the-trainer-waits",
        "out-of-disk-while-the-trainer-waits",
        "restore-failed-while-the-trainer-waits",
        "restore-failed-then-the-trainer",
        "restore-killed-on-a-lost-node-is-a-preemption",
        "restored-then-the-trainer-failed",
    ],
)
def test_a_restore_beside_the_trainer_ends_the_attempt_when_it_fails(
    restore: int | None, trainer: int | None, node: str, end: End, reason: str, says: str
) -> None:
    case = _alongside(restore, trainer, node)

    outcome = classify(case.pod, node=case.node, node_deleted=False, notice_taints=[], now=NOW)

    assert (outcome.end, outcome.reason) == (end, reason), outcome.message
    assert says in outcome.message


def test_a_user_container_named_like_the_restore_in_a_fresh_start_is_not_the_restore() -> None:
    run = make_run("r1").with_container({**USER_RESTORE, "name": RESTORE_CONTAINER})
    pod = pod_from(_built(run, None)).running().restore_beside_exited(1).build()

    outcome = classify(pod, node=ready_node, node_deleted=False, notice_taints=[], now=NOW)

    assert outcome.end is End.NOT_ENDED, outcome.message


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


def test_insufficient_disk_ends_the_run_instead_of_looping() -> None:
    pod = pod_from(RESUMED_POD).restore_exited(EXIT_INSUFFICIENT_DISK, message="no room").build()
    outcome = classify(pod, node=ready_node, node_deleted=False, notice_taints=[], now=NOW)

    decision = decide(outcome, Counters(), RestartPolicySpec(), resume_step=120, latest_step=120)

    assert (decision.action, decision.reason) == (Action.FAIL, "InsufficientDisk")
    assert decision.message == "no room"
    assert decision.counters == Counters()


# -- bounded messages ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "limit", "expected"),
    [
        pytest.param("CUDA error", 1024, "CUDA error", id="short-text-unchanged"),
        pytest.param("line 1\nline 2\r\n", 1024, "line 1 line 2", id="newlines-become-spaces"),
        pytest.param("a\tb\x00c\x1b[31md\x7fe", 1024, "a b c [31md e", id="c0-and-del"),
        pytest.param("a\x85b\x9bc", 1024, "a b c", id="c1-controls"),
        pytest.param("a\u2028b\u2029c", 1024, "a b c", id="line-and-paragraph-separators"),
        pytest.param("user \u202egnp.exe", 1024, "user  gnp.exe", id="bidi-override"),
        pytest.param("Grüße, 日本語 ✓", 1024, "Grüße, 日本語 ✓", id="printable-unicode-kept"),
        pytest.param("", 1024, "", id="empty"),
        pytest.param("x" * 10, 10, "x" * 10, id="exactly-the-limit"),
        pytest.param("x" * 40, 30, "x" * 5 + " [... 35 more characters]", id="cut-with-marker"),
        pytest.param("x" * 104, 30, "x" * 5 + " [... 99 more characters]", id="count-99"),
        pytest.param("x" * 105, 30, "x" * 4 + " [... 101 more characters]", id="gains-a-digit"),
        pytest.param(" a\n" + "x" * 40, 30, "a xxx [... 37 more characters]", id="stripped-first"),
        pytest.param("x" * 100, 5, "x" * 5, id="no-room-for-a-marker"),
    ],
)
def test_bounded(raw: str, limit: int, expected: str) -> None:
    assert bounded(raw, limit) == expected


@pytest.mark.parametrize("size", [1024, 1025, 5000, 1_000_000], ids=lambda n: f"{n}-chars")
def test_bounded_stays_within_the_limit_and_counts_what_it_cut(size: int) -> None:
    raw = "y" * size

    out = bounded(raw)

    assert len(out) <= MESSAGE_MAX
    kept, _, marker = out.partition(" [... ")
    assert kept == raw[: len(kept)]
    if size > MESSAGE_MAX:
        assert marker == f"{size - len(kept)} more characters]"
    else:
        assert out == raw


def _long(detail: str) -> str:
    return "Traceback (most recent call last):\n" + (detail * 3000)[:3000] + "\x1b[0m"


def _failed_pod(message: str) -> dict[str, Any]:
    pod = make_pod().phase("Failed").on_node().build()
    pod["status"]["message"] = message
    return pod


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param(make_pod().trainer_exited(1, message=_long("boom\n")).build(), id="trainer"),
        pytest.param(
            pod_from(RESUMED_POD)
            .restore_exited(EXIT_CHECKPOINT_BAD, message=_long("bad\n"))
            .build(),
            id="restore-bad-checkpoint",
        ),
        pytest.param(
            pod_from(RESUMED_POD)
            .restore_exited(EXIT_INSUFFICIENT_DISK, message=_long("full\n"))
            .build(),
            id="restore-out-of-disk",
        ),
        pytest.param(
            make_pod().on_node().ended_by("Evicted", _long("pressure\n")).build(),
            id="pod-status-message",
        ),
        pytest.param(
            make_pod().trainer_exited(143).disrupted("EvictionByEvictionAPI", _long("x\n")).build(),
            id="disruption-condition",
        ),
        pytest.param(
            make_pod().on_node().waiting("InvalidImageName", message=_long("img\n")).build(),
            id="waiting-container",
        ),
        pytest.param(_failed_pod(_long("m\n")), id="failed-pod"),
    ],
)
def test_messages_from_the_pod_are_bounded(pod: dict[str, Any]) -> None:
    outcome = classify(pod, node=ready_node, node_deleted=False, notice_taints=[], now=NOW)

    assert outcome.ended
    assert "more characters]" in outcome.message
    assert len(outcome.message) <= MESSAGE_MAX + 100  # the bounded text and a short preface
    assert not any(ch in outcome.message for ch in "\n\r\t\x1b")
    assert "Traceback (most recent call last): " in outcome.message
