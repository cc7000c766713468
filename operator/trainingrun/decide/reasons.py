"""Condition types and reasons, named once: the words of ``status.conditions``,
``status.reason``, the Events and the transitions metric (docs/concepts.md lists them for users).

Reasons are one PascalCase word each (Kubernetes API conventions). An Event's type follows from
its reason: the ones in ``NORMAL`` are the run going as planned, every other one is a Warning.
"""

from __future__ import annotations

# -- condition types (states) -----------------------------------------------------------------

RUNNING = "Running"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
PROTECTED = "Protected"  # the running attempt has committed a checkpoint since its trainer started
SUSPENDED = "Suspended"  # True while spec.suspend holds the run (decide.hold)
ADMITTED = "Admitted"  # a queued run's admission by Kueue: False while it waits (decide.hold)
WAITING = "Waiting"  # True while the next attempt's start is held back (decide.waits)
SAVE_AT_RISK = "SaveAtRisk"  # True: a save on preemption would not upload in time (savefit)

# -- how an attempt starts --------------------------------------------------------------------

STARTED = "Started"  # from scratch
RESUMED = "Resumed"  # from a committed checkpoint

# -- what the policy makes of an ended attempt ------------------------------------------------

PREEMPTED = "Preempted"
FAILED_ATTEMPT = "Failed"
CHECKPOINT_BAD = "CheckpointBad"
RESTARTS_EXHAUSTED = "RestartBudgetExhausted"
PREEMPTIONS_EXHAUSTED = "PreemptionBudgetExhausted"
CRASH_LOOP = "CrashLoop"

# -- whether the running attempt is protected (the Protected condition) -----------------------

CHECKPOINT_COMMITTED = "CheckpointCommitted"  # True: committed one since its trainer started
AWAITING_CHECKPOINT = "AwaitingCheckpoint"  # Unknown: none yet, the deadline has not come
UNPROTECTED = "Unprotected"  # False: none within spec.checkpoint.unprotectedAfterSeconds
ACCESS_DENIED = "AccessDenied"  # False: the sync sidecar gave up on access denied

# -- whether a save on preemption fits its window (the SaveAtRisk condition) -------------------

SAVE_FITS = "SaveFits"  # False: the latest checkpoint's upload fits the window
SAVE_TOO_SLOW = "SaveTooSlow"  # True: it does not

# -- pauses and queues (the Suspended and Admitted conditions, decide.hold) --------------------

SUSPEND_REQUESTED = "SuspendRequested"  # spec.suspend became true: save, stop, hold
SUSPEND_LIFTED = "SuspendLifted"  # spec.suspend became false: resume
PAUSED = "Paused"  # the attempt stopped for a pause: spends no budget
QUEUED = "Queued"  # Kueue has not admitted the run's Workload yet
ADMITTED_BY_KUEUE = "AdmittedByKueue"  # Kueue admitted it: its pods may be created
EVICTED = "Evicted"  # Kueue evicted the Workload (priority preemption, quota reclaim, ...)
KUEUE_NOT_INSTALLED = "KueueNotInstalled"  # the queue label names Kueue, which is not installed
WORKLOAD_FAILED = "WorkloadFailed"  # the run's Workload cannot be created or read

# -- a run that cannot go on ------------------------------------------------------------------

INVALID_SPEC = "InvalidSpec"
MISSING_SECRET = "MissingSecret"  # noqa: S105 - a reason, not a secret
INSUFFICIENT_DISK = "InsufficientDisk"  # the checkpoint does not fit the checkpoint volume
STORAGE_NOT_ALLOWED = "StorageNotAllowed"  # the operator's admin does not allow this endpoint/uri
STORAGE_MISCONFIGURED = "StorageMisconfigured"  # no client can be made of spec.checkpoint.storage

# -- why the operator waits (the Waiting condition and Events, decide.waits) -------------------

WAIT_OVER = "WaitOver"  # Waiting False: the attempt started
MANIFEST_UNREADABLE = "ManifestUnreadable"  # the bucket manifest cannot be read or is refused

STORAGE_UNAVAILABLE = "StorageUnavailable"
CHECKPOINT_SKIPPED = "CheckpointSkipped"
POD_FORBIDDEN = "PodForbidden"
POD_NAME_TAKEN = "PodNameTaken"
SERVICE_NAME_TAKEN = "ServiceNameTaken"  # a gang's headless Service name is another's
SERVICE_FORBIDDEN = "ServiceForbidden"  # the API server refused a gang's headless Service
OLD_POD_LINGERS = "OldPodLingers"  # a pod of an older attempt does not go

# -- what classify saw (the detail of an ending, or of a pod not ended yet) -------------------

DISRUPTION_TARGET = "DisruptionTarget"
POD_DELETED = "PodDeleted"
NODE_DELETED = "NodeDeleted"
NODE_NOT_READY = "NodeNotReady"
PREEMPTION_NOTICE = "PreemptionNotice"
OOM_KILLED = "OOMKilled"
TRAINER_ERROR = "Error"
INIT_FAILED = "InitFailed"
RESTORE_FAILED = "RestoreFailed"  # the restore beside the trainer (AlongsideTrainer) failed
NODE_DISK_FULL = "NodeDiskFull"  # the restore found the node's disk short now: retried
POD_FAILED = "PodFailed"
TERMINATING = "Terminating"  # stopping after a disruption: saving first
FINISHING = "Finishing"  # the trainer exited 0: the sidecar commits the last checkpoint
IMAGE_PULL_RETRYING = "ImagePullRetrying"
# The kubelet could not fill its Secret or ConfigMap cache in time (decide.classify)
CONTAINER_CONFIG_RETRYING = "ContainerConfigRetrying"
CONTAINER_CONFIG_UNREADABLE = "ContainerConfigUnreadable"  # ... for CONFIG_CACHE_GRACE_SECONDS
GANG_SCHEDULING = "GangScheduling"  # some pods of a gang wait to be scheduled
GANG_NOT_SCHEDULED = "GangNotScheduled"  # ... longer than spec.gang.startTimeoutSeconds

NORMAL = frozenset(
    {
        STARTED,
        RESUMED,
        SUCCEEDED,
        PREEMPTED,
        CHECKPOINT_COMMITTED,
        SUSPEND_REQUESTED,
        SUSPEND_LIFTED,
        PAUSED,
        QUEUED,
        ADMITTED_BY_KUEUE,
    }
)


def event_type(reason: str) -> str:
    """Normal for the run going as planned, else Warning."""
    return "Normal" if reason in NORMAL else "Warning"
