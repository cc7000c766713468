"""The TrainingRun API, defined once.

These pydantic models are the single source of the CRD: ``trainingrun.api.crd`` turns them into the
structural OpenAPI schema in ``crds/trainingrun.yaml`` (with the CEL rules and printer columns),
and the operator parses every object it reads through them. Field descriptions here become
``kubectl explain`` text.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, JsonValue, model_validator

from trainingrun.api.status import AttemptRecord as AttemptRecord
from trainingrun.api.status import CheckpointRef as CheckpointRef
from trainingrun.api.status import Condition as Condition
from trainingrun.api.status import Goodput as Goodput
from trainingrun.api.status import LedgerTotals as LedgerTotals
from trainingrun.api.status import RunProgress as RunProgress
from trainingrun.api.status import SaveEstimate as SaveEstimate
from trainingrun.api.status import StepsLost as StepsLost
from trainingrun.api.status import TrainingRunStatus as TrainingRunStatus
from trainingrun.api.storage import ApiModel
from trainingrun.api.storage import StorageSpec as StorageSpec
from trainingrun.contract import DEFAULT_STEP_PATTERN, MAX_REPLICAS, pattern_problem

GROUP = "trainingrun.dev"
VERSION = "v1alpha1"
KIND = "TrainingRun"
PLURAL = "trainingruns"
SINGULAR = "trainingrun"
SHORT_NAMES = ["trun", "truns"]

# Spot notice taints of the common node termination handlers and cloud providers.
DEFAULT_NOTICE_TAINTS = [
    "aws-node-termination-handler/spot-itn",
    "aws-node-termination-handler/rebalance-recommendation",
    "karpenter.sh/disrupted",
    "cloud.google.com/impending-node-termination",
]


_Model = ApiModel


# spec.checkpoint.format: auto, the formats of trainingrun.checkpoint.layouts, or pattern.
CheckpointFormat = Literal[
    "auto",
    "hf",
    "lightning",
    "composer",
    "dcp",
    "deepspeed",
    "megatron",
    "nemo",
    "mindformers",
    "accelerate",
    "pattern",
]


class PatternSpec(_Model):
    """A checkpoint layout of your own (format: pattern)."""

    glob: str = Field(
        description=(
            "Each checkpoint, a folder or a file, relative to localPath (glob syntax: "
            "'step_*', 'run/ckpt-*.pt')."
        ),
        min_length=1,
        max_length=1024,
    )
    step: str = Field(
        default=DEFAULT_STEP_PATTERN,
        description=(
            "Regular expression whose first group, searched in the checkpoint's path, is its "
            "step. Default: the last number in the path."
        ),
        max_length=1024,
    )
    marker: str | None = Field(
        default=None,
        description=(
            "A file inside a checkpoint folder that the trainer writes last: the folder is "
            "complete once it is there. Unset: complete once no file changed for 10 s."
        ),
        max_length=1024,
    )

    @model_validator(mode="after")
    def _usable(self) -> PatternSpec:
        problem = pattern_problem(self.glob, self.step)
        if problem is not None:
            raise ValueError(problem)
        return self


class CheckpointSpec(_Model):
    """How checkpoints are written locally and kept in storage."""

    local_path: str = Field(
        default="/checkpoints",
        description=(
            "Folder inside the trainer container where it writes checkpoint-N/ folders; "
            "mounted from a shared volume."
        ),
        pattern=r"^/.*",
        max_length=1024,
    )
    storage: StorageSpec = Field(description="Object storage for checkpoints.")
    keep: int = Field(
        default=3,
        ge=1,
        le=1000,
        description="Committed checkpoints to keep in storage; older ones are deleted.",
    )
    format: CheckpointFormat = Field(
        default="auto",
        description=(
            "The trainer's checkpoint layout (docs/checkpoints.md, formats): auto (recognise "
            "any known one), hf, lightning, composer, dcp, deepspeed, megatron, nemo, "
            "mindformers, accelerate, or pattern (then set pattern)."
        ),
    )
    pattern: PatternSpec | None = Field(default=None, description="The layout of format: pattern.")
    size_limit: str | None = Field(
        default=None,
        description=(
            "Size limit of the local checkpoint volume (an emptyDir), as a quantity such as "
            "50Gi. Empty means the node's free disk. The restore checks that the checkpoint "
            "fits before it downloads (docs/checkpoints.md, disk)."
        ),
        pattern=r"^[0-9]+(\.[0-9]+)?([KMGTPE]i|[kMGTPE]|[eE][0-9]+)?$",
        max_length=32,
    )
    restore_mode: Literal["BeforeTrainer", "AlongsideTrainer"] = Field(
        default="BeforeTrainer",
        description=(
            "When a resume's checkpoint is downloaded. BeforeTrainer: by an init container, so "
            "any trainer finds it in place. AlongsideTrainer: by a container beside the trainer, "
            "during the trainer's start-up; the trainer must get the checkpoint from "
            "trainingrun.integrations.trainer.resume_from() (the hf, lightning and composer "
            "integrations do), which waits until it is verified in place (docs/checkpoints.md, "
            "restore beside the trainer)."
        ),
    )
    unprotected_after_seconds: int = Field(
        default=1800,
        ge=0,
        le=604800,
        description=(
            "Seconds an attempt's trainer may run with no checkpoint committed since it "
            "started; then the run's Protected condition turns False (reason Unprotected) and a "
            "Warning Event says so, once per attempt: the sync sidecar recognised no checkpoint "
            "(files of no known format, or none written) or could not upload one "
            "(docs/checkpoints.md, unprotected runs). 0 turns the warning off."
        ),
    )


class BackoffSpec(_Model):
    """Exponential backoff between failed attempts."""

    initial_seconds: int = Field(
        default=10, ge=0, le=3600, description="Wait after the first failure."
    )
    max_seconds: int = Field(
        default=300, ge=0, le=86400, description="Longest wait between attempts."
    )
    factor: int = Field(default=2, ge=1, le=10, description="Growth factor per failure.")


class RestartPolicySpec(_Model):
    """Budgets for resubmitting the run."""

    max_restarts: int = Field(
        default=3,
        ge=0,
        le=10000,
        description="Failed attempts (crash, non-zero exit, OOM) tolerated before the run fails.",
    )
    max_preemptions: int | None = Field(
        default=None,
        ge=0,
        le=100000,
        description=(
            "Preemptions (spot reclaim, eviction, node loss) tolerated; empty means unlimited. "
            "Preemptions never spend maxRestarts."
        ),
    )
    crash_loop_limit: int = Field(
        default=3,
        ge=1,
        le=1000,
        description=(
            "Failures in a row with no new committed checkpoint that end the run as a crash loop."
        ),
    )
    backoff: BackoffSpec = Field(
        default_factory=BackoffSpec,
        json_schema_extra={"default": BackoffSpec().model_dump(by_alias=True)},
        description="Backoff between failed attempts.",
    )


class PreemptionSpec(_Model):
    """How preemption notice is recognised and honoured."""

    notice_taints: list[
        Annotated[str, Field(description="A taint key, as in a node's spec.taints[].key.")]
    ] = Field(
        default_factory=lambda: list(DEFAULT_NOTICE_TAINTS),
        json_schema_extra={"default": list[JsonValue](DEFAULT_NOTICE_TAINTS)},
        description="Node taint keys that announce the node is about to go away.",
        max_length=64,
    )
    termination_grace_period_seconds: int = Field(
        default=120,
        ge=1,
        le=3600,
        description="Grace period of each attempt's pod: time to save and upload on notice.",
    )


class GangSpec(_Model):
    """How the pods of one attempt find each other and start together (replicas > 1)."""

    master_port: int = Field(
        default=29500,
        ge=1,
        le=65535,
        description=(
            "Port of rank 0's rendezvous, as PET_MASTER_PORT in every trainer container "
            "(torchrun's --master-port)."
        ),
    )
    start_timeout_seconds: int = Field(
        default=600,
        ge=10,
        le=86400,
        description=(
            "Longest time some pods of an attempt may run while another one is not scheduled; "
            "then the attempt ends as failed (reason GangNotScheduled) and is retried after the "
            "backoff. A gang none of whose pods is scheduled waits without limit: queueing is "
            "the cluster's (Kueue's, a gang scheduler's) job."
        ),
    )


class TrainingRunSpec(_Model):
    """Desired state of a TrainingRun."""

    template: dict[str, Any] = Field(
        description=(
            "Pod template of one attempt (PodTemplateSpec, checked at apply). It must have a "
            "container named 'trainer'; the operator adds the restore init container, the sync "
            "sidecar, the checkpoint volume and the TRAININGRUN_* environment, and names starting "
            "with 'trainingrun-' are kept for those."
        ),
    )
    replicas: int = Field(
        default=1,
        ge=1,
        le=MAX_REPLICAS,
        description=(
            "Pods of one attempt, one per node, each from the same template: a gang that is "
            "started, ended and resumed as one. Above 1, pods are named <run>-<attempt>-<rank>, "
            "a headless Service <run> gives rank 0 a DNS name, and each trainer container gets "
            "torchrun's PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT."
        ),
    )
    gang: GangSpec = Field(
        default_factory=GangSpec,
        json_schema_extra={"default": GangSpec().model_dump(by_alias=True)},
        description="Rendezvous port and start timeout of a gang (replicas > 1).",
    )
    checkpoint: CheckpointSpec = Field(description="Checkpoint location and retention.")
    restart_policy: RestartPolicySpec = Field(
        default_factory=RestartPolicySpec,
        json_schema_extra={
            "default": RestartPolicySpec().model_dump(by_alias=True, exclude_none=True)
        },
        description="Restart and preemption budgets.",
    )
    preemption: PreemptionSpec = Field(
        default_factory=PreemptionSpec,
        json_schema_extra={"default": PreemptionSpec().model_dump(by_alias=True)},
        description="Preemption notice handling.",
    )
    suspend: bool = Field(
        default=False,
        description=(
            "Pause the run: true asks the running attempt to save at its next step end, then "
            "removes its pods (after terminationGracePeriodSeconds at the latest) and shows "
            "phase Suspended; false resumes it from the newest committed checkpoint. A pause "
            "spends no budget and counts as neither restart nor preemption. A run created "
            "suspended creates no pod."
        ),
    )
