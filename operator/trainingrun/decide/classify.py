"""How an attempt ended, from the pod and its node as plain dicts (API JSON, camelCase).

| seen                                                         | class         |
| ------------------------------------------------------------ | ------------- |
| trainer exited 0, and the pod ended too (or its node is gone) | Succeeded     |
| DisruptionTarget (once the pod stopped, or its node is gone), | Preempted     |
| node gone or NotReady, reason Shutdown/...                   |               |
| pod deleted by someone else (gone, or stopped while deleting) | Preempted     |
| notice taint on the node or notice annotation, then an end   | Preempted     |
| non-zero exit, OOMKilled                                     | Failed        |
| the operator's restore exited with the checkpoint-bad code  | CheckpointBad |
| the operator's restore exited with the insufficient-disk code | Permanent     |
| ... saying the node's disk is short now (NODE_DISK_FULL_MESSAGE) | Failed      |
| the operator's restore beside the trainer exited non-zero     | Failed        |
| image pull failing for IMAGE_PULL_GRACE_SECONDS since the    | Permanent     |
| pod was scheduled; invalid image name; missing Secret/ConfigMap |             |
| the kubelet's Secret/ConfigMap cache not filled in time        | not ended     |
| ... still not filled CONFIG_CACHE_GRACE_SECONDS after scheduling | Failed      |

The restore's exit codes (checkpoint-bad, insufficient-disk) count only from the restore the
operator added: the container ``RESTORE_CONTAINER`` (init, or beside the trainer) of a pod that
carries the operator's resume annotation. ``build_pod`` sets that annotation exactly when it
adds its restore and drops every ``trainingrun.dev/*`` key of the template, so a template cannot
fake it, and a user container of the same name cannot sit beside the operator's (the API server
refuses two containers of one name). A user container of that name in a pod that resumes from
nothing (a template made before names were reserved) exiting with that code is a plain failure.
(The containers' spec cannot tell: the reconciler's pod cache keeps none of it.)

Every message taken from a container or pod status (a termination message, a condition's or
the pod's message) is ``bounded``: it goes into ``status.message`` and Events, and the
container writing it may print anything (a whole traceback, terminal escapes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from trainingrun.contract import (
    ANNOTATION_NOTICE,
    EXIT_CHECKPOINT_BAD,
    EXIT_INSUFFICIENT_DISK,
    RESTORE_CONTAINER,
    TIME_FORMAT,
    TRAINER_CONTAINER,
)
from trainingrun.decide import reasons as R
from trainingrun.decide.podview import (
    after_scheduling,
    condition_of,
    container_status,
    node_alive,
    node_not_ready,
    node_notice,
    operators_restore,
    pod_message,
    statuses_of,
    terminated_state,
)

PREEMPTING_POD_REASONS = frozenset({"Shutdown", "Evicted", "NodeLost", "Terminated", "Preempting"})
CONFIG_ERROR = "CreateContainerConfigError"
PERMANENT_WAITING_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", CONFIG_ERROR}
)
# A pull can fail for a while and then work (a registry or network blip, a rate limit, a
# credential that is still propagating), and the kubelet keeps retrying with a back-off that
# grows to 300 s. A pull error ends the run only once it has lasted this long since the pod was
# scheduled: about five pulls.
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff"})
IMAGE_PULL_GRACE_SECONDS = 300
# CreateContainerConfigError with these words is the kubelet's Secret or ConfigMap cache not
# filled in time (an API server restart, a slow watch), not a missing object or key: the
# kubelet tries again on its own and the container starts once it is filled. The run shows it,
# looked at again every CONFIG_CACHE_RECHECK_SECONDS. A cache still not filled
# CONFIG_CACHE_GRACE_SECONDS after the pod was scheduled is that node's kubelet unable to read
# the object (it cannot reach the API server, or the node authorizer refuses it): the attempt
# fails, spending the restart budget, and the next one gets a new pod.
CONFIG_CACHE_NOT_SYNCED = ("failed to sync secret cache", "failed to sync configmap cache")
CONFIG_CACHE_RECHECK_SECONDS = 30
CONFIG_CACHE_GRACE_SECONDS = 600
# How the restore's termination message starts when, with the insufficient-disk code, the
# checkpoint fits spec.checkpoint.sizeLimit (or there is none) but not the node's free disk now:
# another node, or this one later, may have room, so the attempt fails and is retried.
NODE_DISK_FULL_MESSAGE = "insufficient disk on this node"


class End(Enum):
    NOT_ENDED = "NotEnded"
    SUCCEEDED = "Succeeded"
    PREEMPTED = "Preempted"
    FAILED = "Failed"
    CHECKPOINT_BAD = R.CHECKPOINT_BAD
    PERMANENT = "Permanent"
    PAUSED = R.PAUSED  # stopped for spec.suspend (decide.hold): spends nothing


@dataclass(frozen=True)
class Outcome:
    end: End
    reason: str
    message: str
    # Not ended yet, but it will be at this time unless the pod changes (an image pull that
    # keeps failing): the caller looks again then.
    decide_at: datetime | None = None
    # The trainer's exit code when it ended the attempt (the goodput ledger tells a SIGKILL).
    exit_code: int | None = None

    @property
    def ended(self) -> bool:
        return self.end is not End.NOT_ENDED


def classify(
    pod: Mapping[str, Any] | None,
    *,
    node: Mapping[str, Any] | None,
    node_deleted: bool,
    notice_taints: Iterable[str],
    now: datetime,
) -> Outcome:
    """Classifies the attempt whose pod is ``pod`` (None: the pod is gone) at time ``now``."""
    if pod is None:
        return Outcome(End.PREEMPTED, R.POD_DELETED, "the attempt's pod was deleted")
    status = pod.get("status") or {}
    phase = status.get("phase")

    meta = pod.get("metadata") or {}
    # A deletion grace of 0 is the final removal, the pod's last state: nothing more will come.
    removed = meta.get("deletionGracePeriodSeconds") == 0

    stopping = phase not in ("Succeeded", "Failed") and not removed
    stopping = stopping and node_alive(node, node_deleted)
    disrupted = _disrupted(pod, stopping)
    if disrupted is not None:
        return disrupted

    refused = _restore_refused(pod)
    if refused is not None:
        return refused

    trainer_status = container_status(pod, TRAINER_CONTAINER)
    trainer = terminated_state(trainer_status)
    if trainer and trainer.get("exitCode") == 0 and phase != "Failed":
        if phase != "Succeeded" and not removed and node_alive(node, node_deleted):
            # The kubelet now stops the sync sidecar, which commits the last checkpoint first:
            # the run ends with the pod, so its status names that checkpoint.
            return Outcome(
                End.NOT_ENDED,
                R.FINISHING,
                "the trainer exited 0; the sidecar commits the last checkpoint",
            )
        return Outcome(End.SUCCEEDED, R.SUCCEEDED, "the trainer exited 0")
    if phase == "Succeeded":
        return Outcome(End.SUCCEEDED, R.SUCCEEDED, "the pod succeeded")

    if meta.get("deletionTimestamp"):
        # Deleted without a DisruptionTarget (`kubectl delete pod`, a tool that deletes instead
        # of evicting): someone else's doing, since the operator deletes an attempt's pod only
        # after recording its end. Like an eviction, it waits for the save at SIGTERM.
        if phase != "Failed" and not removed and node_alive(node, node_deleted):
            return Outcome(End.NOT_ENDED, R.TERMINATING, "the pod is being deleted: saving")
        return Outcome(End.PREEMPTED, R.POD_DELETED, "the attempt's pod was deleted")

    stuck = _stuck_waiting(pod, now)
    if stuck is not None:
        return stuck

    return _lost_or_failed(pod, trainer, node, node_deleted, notice_taints)


def _restore_refused(pod: Mapping[str, Any]) -> Outcome | None:
    """The operator's restore refused the checkpoint (module docstring): it is bad (the operator
    falls back to an older one), or it does not fit the checkpoint volume (the run fails: every
    attempt would fail the same way), or the node's disk is short now (a failed attempt)."""
    restore = terminated_state(container_status(pod, RESTORE_CONTAINER))
    if not restore or not operators_restore(pod):
        return None
    code = restore.get("exitCode")
    if code == EXIT_CHECKPOINT_BAD:
        msg = pod_message(restore, "restore found the checkpoint corrupt")
        return Outcome(End.CHECKPOINT_BAD, R.CHECKPOINT_BAD, msg)
    if code == EXIT_INSUFFICIENT_DISK:
        msg = pod_message(
            restore,
            "the checkpoint does not fit the checkpoint volume: raise spec.checkpoint.sizeLimit "
            "or use nodes with more disk",
        )
        if msg.startswith(NODE_DISK_FULL_MESSAGE):
            return Outcome(End.FAILED, R.NODE_DISK_FULL, msg)
        return Outcome(End.PERMANENT, R.INSUFFICIENT_DISK, msg)
    return None


def _lost_or_failed(
    pod: Mapping[str, Any],
    trainer: Mapping[str, Any] | None,
    node: Mapping[str, Any] | None,
    node_deleted: bool,
    notice_taints: Iterable[str],
) -> Outcome:
    """The node or the pod was lost (a preemption), or the pod ended by itself: a failure,
    unless a notice came first (then the failure is the preemption's doing)."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if node_deleted:
        return Outcome(End.PREEMPTED, R.NODE_DELETED, "the pod's node was deleted")
    if status.get("reason") in PREEMPTING_POD_REASONS:
        reason = str(status["reason"])
        return Outcome(End.PREEMPTED, reason, pod_message(status, reason))
    if (pod.get("spec") or {}).get("nodeName") and node_not_ready(node):
        return Outcome(End.PREEMPTED, R.NODE_NOT_READY, "the pod's node is not ready")
    restore = _restore_beside_failed(pod)
    if phase == "Failed" or trainer or restore:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        notice = annotations.get(ANNOTATION_NOTICE) or node_notice(node, notice_taints)
        if notice:
            return Outcome(
                End.PREEMPTED, R.PREEMPTION_NOTICE, f"ended after preemption notice ({notice})"
            )
        return _failure(pod, trainer, restore)
    return Outcome(End.NOT_ENDED, str(phase or "Pending"), "")


def _disrupted(pod: Mapping[str, Any], stopping: bool) -> Outcome | None:
    """The pod's ``DisruptionTarget`` condition (eviction, preemption by the scheduler, taint
    manager, pod GC, kubelet): a preemption once the pod stopped; while its kubelet is still
    ``stopping`` it, not yet: the trainer saves at the next step end and the sidecar commits that
    checkpoint within the grace period, and resubmitting now would resume from an older one."""
    disruption = condition_of(pod, "DisruptionTarget")
    if not disruption or disruption.get("status") != "True":
        return None
    reason = str(disruption.get("reason") or R.DISRUPTION_TARGET)
    if stopping:
        return Outcome(End.NOT_ENDED, R.TERMINATING, f"{reason}: saving and stopping")
    return Outcome(End.PREEMPTED, reason, pod_message(disruption, reason))


def _stuck_waiting(pod: Mapping[str, Any], now: datetime) -> Outcome | None:
    """A container the kubelet cannot start (bad image, missing Secret or ConfigMap): a
    permanent end, except an image pull, which gets ``IMAGE_PULL_GRACE_SECONDS`` of retries,
    and the kubelet's cache of a Secret or ConfigMap not filled yet, which waits."""
    for s in [*statuses_of(pod, "initContainerStatuses"), *statuses_of(pod, "containerStatuses")]:
        waiting = (s.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") not in PERMANENT_WAITING_REASONS:
            continue
        detail = pod_message(waiting, str(waiting["reason"]))
        message = f"container {s.get('name')}: {detail}"
        if waiting["reason"] == CONFIG_ERROR and any(
            words in detail for words in CONFIG_CACHE_NOT_SYNCED
        ):
            return _config_cache_not_synced(pod, message, now)
        deadline = after_scheduling(pod, IMAGE_PULL_GRACE_SECONDS)
        pulling = waiting["reason"] in IMAGE_PULL_REASONS
        if pulling and deadline is not None and now < deadline:
            until = deadline.strftime(TIME_FORMAT)
            return Outcome(
                End.NOT_ENDED,
                R.IMAGE_PULL_RETRYING,
                f"{message} (the kubelet retries; the run fails if the image is still "
                f"not pulled at {until})",
                decide_at=deadline,
            )
        return Outcome(End.PERMANENT, str(waiting["reason"]), message)
    return None


def _config_cache_not_synced(pod: Mapping[str, Any], message: str, now: datetime) -> Outcome:
    """The kubelet could not fill its Secret or ConfigMap cache: it retries, for
    ``CONFIG_CACHE_GRACE_SECONDS`` after the pod was scheduled; then the attempt fails."""
    deadline = after_scheduling(pod, CONFIG_CACHE_GRACE_SECONDS)
    if deadline is not None and now >= deadline:
        node = (pod.get("spec") or {}).get("nodeName")
        where = f"the kubelet of node {node}" if node else "the kubelet"
        return Outcome(
            End.FAILED,
            R.CONTAINER_CONFIG_UNREADABLE,
            f"{message} ({where} could not read it for {CONFIG_CACHE_GRACE_SECONDS}s after the "
            "pod was scheduled: check that the node reaches the API server; the next attempt "
            "gets a new pod)",
        )
    recheck = now + timedelta(seconds=CONFIG_CACHE_RECHECK_SECONDS)
    until = f"; the attempt fails at {deadline.strftime(TIME_FORMAT)}" if deadline else ""
    return Outcome(
        End.NOT_ENDED,
        R.CONTAINER_CONFIG_RETRYING,
        f"{message} (the kubelet retries until it can read it{until})",
        decide_at=min(recheck, deadline) if deadline else recheck,
    )


def _restore_beside_failed(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The operator's restore running beside the trainer (``restoreMode: AlongsideTrainer``)
    ended non-zero: the attempt ends, as the trainer waits for a checkpoint that never comes."""
    for s in statuses_of(pod, "containerStatuses"):
        if s.get("name") == RESTORE_CONTAINER and operators_restore(pod):
            term = terminated_state(s)
            if term and term.get("exitCode") not in (0, None):
                return term
    return None


def _failure(
    pod: Mapping[str, Any],
    trainer: Mapping[str, Any] | None,
    restore: Mapping[str, Any] | None,
) -> Outcome:
    """``restore``: the restore beside the trainer, when it ended non-zero."""
    if restore:
        detail = pod_message(restore)
        msg = f"the restore exited {restore.get('exitCode')}" + (f": {detail}" if detail else "")
        return Outcome(End.FAILED, R.RESTORE_FAILED, msg)
    if trainer:
        code = trainer.get("exitCode")
        exit_code = code if isinstance(code, int) and not isinstance(code, bool) else None
        if trainer.get("reason") == R.OOM_KILLED:
            oom = f"the trainer ran out of memory (exit {code})"
            return Outcome(End.FAILED, R.OOM_KILLED, oom, exit_code=exit_code)
        detail = pod_message(trainer)
        msg = f"the trainer exited {code}" + (f": {detail}" if detail else "")
        return Outcome(End.FAILED, R.TRAINER_ERROR, msg, exit_code=exit_code)
    for s in statuses_of(pod, "initContainerStatuses"):
        term = terminated_state(s)
        if term and term.get("exitCode") not in (0, None):
            return Outcome(
                End.FAILED,
                R.INIT_FAILED,
                f"init container {s.get('name')} exited {term.get('exitCode')}",
            )
    status = pod.get("status") or {}
    return Outcome(End.FAILED, R.POD_FAILED, pod_message(status, "the pod failed"))
