"""The contract between the operator, the pod it builds and the programs in that pod: every
environment variable name, label, annotation, container and volume name, exit code and time
format, defined once. The pod builder (``decide.pod``) produces them; classify, the sync
sidecar, the restore, the HuggingFace integration and the CLI read them from here.

Pure constants and two time helpers; this module imports nothing of the package.
"""

from __future__ import annotations

import re
import signal
from datetime import UTC, datetime

# -- containers and volumes of an attempt's pod -----------------------------------------------

TRAINER_CONTAINER = "trainer"  # the user's container the operator resumes
RESTORE_CONTAINER = "trainingrun-restore"  # init container: bucket -> local folder, verified
SYNC_CONTAINER = "trainingrun-sync"  # native sidecar: local folder -> bucket, committed
CHECKPOINT_VOLUME = "trainingrun-checkpoints"  # emptyDir shared by the three
# The pod's annotations as a downward API file: how the sync sidecar sees the preemption notice
# the operator writes, without any Kubernetes API access of its own.
PODINFO_VOLUME = "trainingrun-podinfo"
PODINFO_DIR = "/etc/trainingrun/podinfo"
PODINFO_ANNOTATIONS = "annotations"

# The most pods one attempt may have (spec.replicas), and so the most ranks, each a part of a
# checkpoint, that a reader of the bucket manifest accepts.
MAX_REPLICAS = 1024

# -- checkpoints ------------------------------------------------------------------------------

# A user's own layout (spec.checkpoint.pattern): by default a checkpoint's step is the last
# number in its path.
DEFAULT_STEP_PATTERN = r"(\d+)(?!.*\d)"


def pattern_problem(glob: str, step: str) -> str | None:
    """Why a user's own layout (``spec.checkpoint.pattern``) cannot work, or None: checked by
    the API at admission and by the agent that reads the pattern."""
    try:
        compiled = re.compile(step)
    except re.error as e:
        return f"checkpoint.pattern.step {step!r} is not a regular expression: {e}"
    if compiled.groups < 1:
        return f"checkpoint.pattern.step {step!r} needs a group, e.g. 'step_(\\d+)'"
    if not glob.strip("/*"):
        return f"checkpoint.pattern.glob {glob!r} matches everything; name the folders"
    return None


def checkpoint_dirname(step: int) -> str:
    """The folder of the checkpoint of ``step``: in the bucket, and where the restore puts it."""
    return f"checkpoint-{step}"


# -- labels and annotations -------------------------------------------------------------------

# The operator's own key prefix (and its subdomains): the signals it reads back from a pod. The
# pod builder drops every such key of the user's template, so a template cannot fake them.
RESERVED_DOMAIN = "trainingrun.dev"

LABEL_RUN = "trainingrun.dev/run"
LABEL_ATTEMPT = "trainingrun.dev/attempt"
LABEL_RANK = "trainingrun.dev/rank"  # the pod's rank in its attempt's gang (replicas > 1 only)
# The step an attempt's pod resumes from: the record of it even when a status write was lost.
ANNOTATION_RESUME_STEP = "trainingrun.dev/resume-step"
# Set by the operator on a pod whose node carries a notice taint; the sidecar's cue to save.
ANNOTATION_NOTICE = "trainingrun.dev/preemption-notice"
# Set by the operator, with the notice, on the pods of an attempt it stops for a hold: why
# (STOP_SUSPEND for spec.suspend, STOP_EVICTED for an eviction by Kueue). The attempt's end is
# then a pause, not a failure (decide.hold).
ANNOTATION_STOP = "trainingrun.dev/stop"
STOP_SUSPEND = "suspend"
STOP_EVICTED = "evicted"

# Kueue's plain-pod groups (kueue.sigs.k8s.io, "Run Plain Pods"): a template that names a queue
# gets one pod group per gang attempt, so Kueue admits all of its pods at once or none.
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
LABEL_KUEUE_POD_GROUP = "kueue.x-k8s.io/pod-group-name"
ANNOTATION_KUEUE_GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"

# -- environment ------------------------------------------------------------------------------

# The trainer container's view of its attempt.
ENV_NAME = "TRAININGRUN_NAME"
ENV_ATTEMPT = "TRAININGRUN_ATTEMPT"
ENV_CHECKPOINT_DIR = "TRAININGRUN_CHECKPOINT_DIR"
ENV_RESUME_FROM = "TRAININGRUN_RESUME_FROM"  # local folder of the restored checkpoint, or ""
ENV_RESUME_STEP = "TRAININGRUN_RESUME_STEP"
# "1" when the restore runs beside the trainer (spec.checkpoint.restoreMode AlongsideTrainer), in
# both: the restore writes its outcome file (``local.RESTORED``), ``trainer.resume_from()`` waits
# for it.
ENV_RESUME_WAIT = "TRAININGRUN_RESUME_WAIT"
ENV_RESUME_URI = "TRAININGRUN_RESUME_URI"
ENV_REPLICAS = "TRAININGRUN_REPLICAS"  # pods of the attempt (replicas > 1 only; with ENV_RANK)
# torchrun's environment (the defaults of its --nnodes, --node-rank, --master-addr and
# --master-port), as Kubeflow Trainer sets it: users run torchrun with no node arguments.
ENV_PET_NNODES = "PET_NNODES"
ENV_PET_NODE_RANK = "PET_NODE_RANK"
ENV_PET_MASTER_ADDR = "PET_MASTER_ADDR"
ENV_PET_MASTER_PORT = "PET_MASTER_PORT"

# The agents' (sync and restore) settings, set by the pod builder.
ENV_STORAGE_URI = "TRAININGRUN_STORAGE_URI"  # the run's prefix: <uri>/<namespace>/<run>
ENV_KEEP = "TRAININGRUN_KEEP"
ENV_PODINFO_DIR = "TRAININGRUN_PODINFO_DIR"
ENV_DRAIN_SECONDS = "TRAININGRUN_DRAIN_SECONDS"
ENV_RESTORE_STEP = "TRAININGRUN_RESTORE_STEP"
# spec.checkpoint.sizeLimit as written (a quantity), set only when the field is: the restore
# checks that the checkpoint fits under it before it downloads.
ENV_SIZE_LIMIT = "TRAININGRUN_SIZE_LIMIT"
# The fence the attempt holds (trainingrun.checkpoint.protocol): the sidecar writes and commits as
# it.
ENV_EPOCH = "TRAININGRUN_EPOCH"
# Which part of each checkpoint the sidecar writes, and of how many (1 for one pod an attempt).
ENV_RANK = "TRAININGRUN_RANK"
ENV_RANKS = "TRAININGRUN_RANKS"
# Agent tuning, read by the CLI with defaults (an admin may set them in the agent image).
ENV_PART_SIZE_MB = "TRAININGRUN_PART_SIZE_MB"
ENV_CONCURRENCY = "TRAININGRUN_CONCURRENCY"
ENV_MAX_BANDWIDTH_MBPS = "TRAININGRUN_MAX_BANDWIDTH_MBPS"
ENV_METRICS_PORT = "TRAININGRUN_METRICS_PORT"
ENV_METRICS_ADDRESS = "TRAININGRUN_METRICS_ADDRESS"
ENV_QUIET_SECONDS = "TRAININGRUN_QUIET_SECONDS"
# The checkpoint layout the sidecar looks for (spec.checkpoint.format: auto, a format, pattern)
# and, for pattern, spec.checkpoint.pattern as JSON {"glob", "step", "marker"}.
ENV_CHECKPOINT_FORMAT = "TRAININGRUN_CHECKPOINT_FORMAT"
ENV_CHECKPOINT_PATTERN = "TRAININGRUN_CHECKPOINT_PATTERN"
ENV_CHECKSUM = "TRAININGRUN_CHECKSUM"
ENV_SYNC_NICE = "TRAININGRUN_SYNC_NICE"
ENV_TERMINATION_LOG = "TRAININGRUN_TERMINATION_LOG"
# The sidecar's bytes in flight (MiB), and how long it keeps trying on nothing but access
# denied before it exits (the kubelet restarts it with the Secret's current keys).
ENV_MEMORY_BUDGET_MB = "TRAININGRUN_MEMORY_BUDGET_MB"
ENV_ACCESS_DENIED_SECONDS = "TRAININGRUN_ACCESS_DENIED_SECONDS"
# How often at most rank 0's sidecar publishes the trainer's progress (the operator's
# TRAININGRUN_PROGRESS_REFRESH_SECONDS: it reads no more often).
ENV_PROGRESS_SECONDS = "TRAININGRUN_PROGRESS_SECONDS"

# The standard AWS variables the agents' S3 client reads; credentials by secretKeyRef only.
ENV_AWS_ENDPOINT_URL = "AWS_ENDPOINT_URL"
ENV_AWS_REGION = "AWS_REGION"
CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# gs:// and az:// storage: the endpoint (an emulator, a private endpoint) and the keys of the
# credentials Secret each store reads, by secretKeyRef only. GCS: a service-account key file's
# JSON. Azure: an account key or a SAS token, either one.
ENV_STORAGE_ENDPOINT = "TRAININGRUN_STORAGE_ENDPOINT"
GCS_CREDENTIAL_KEYS = ("GOOGLE_SERVICE_ACCOUNT_JSON",)
AZURE_CREDENTIAL_KEYS = ("AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN")
# Per uri scheme: the Secret's keys, and whether each one is needed (else any one of them).
STORE_CREDENTIAL_KEYS = {
    "s3": (CREDENTIAL_KEYS, True),
    "gs": (GCS_CREDENTIAL_KEYS, True),
    "az": (AZURE_CREDENTIAL_KEYS, False),
}

# -- exit codes -------------------------------------------------------------------------------

EXIT_OK = 0
EXIT_ERROR = 1  # anything else: the attempt failed and is retried
EXIT_USAGE = 2  # an agent's settings are missing or malformed
# The restore exits with this when the chosen checkpoint fails verification: the operator marks
# the step bad and falls back to the previous committed one, spending no budget.
EXIT_CHECKPOINT_BAD = 3
# The restore exits with this when the chosen checkpoint does not fit the checkpoint volume (its
# free space, or spec.checkpoint.sizeLimit). When it cannot fit spec.checkpoint.sizeLimit, the
# run fails (every attempt's pod has the same limit). A termination message starting with
# decide.classify.NODE_DISK_FULL_MESSAGE (the node's disk is short now) is a failed attempt,
# retried.
EXIT_INSUFFICIENT_DISK = 4
# A trainer stopped early to be preempted (as if SIGTERM had ended it): never 0.
EXIT_STOPPED = 128 + signal.SIGTERM

# -- time -------------------------------------------------------------------------------------

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # RFC 3339 in UTC, as the Kubernetes API writes it
TIME_FORMAT_MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"  # commit times in the bucket manifest


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime(TIME_FORMAT)


def parse_time(s: str | None) -> datetime | None:
    if not s:
        return None
    return datetime.strptime(s, TIME_FORMAT).replace(tzinfo=UTC)


def now_rfc3339_micro() -> str:
    return datetime.now(UTC).strftime(TIME_FORMAT_MICRO)


def format_bytes(n: float) -> str:
    """A size for people: 812 B, 3.0 MiB, 2.0 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
