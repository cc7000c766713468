"""The TrainingRun API's status: what the operator writes back to a run (``status``), part of
the same CRD as ``trainingrun.api``, which re-exports every name here.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from trainingrun.api.storage import ApiModel

_Model = ApiModel


class CheckpointRef(_Model):
    """A committed checkpoint."""

    step: int = Field(ge=0, description="Training step of the checkpoint.")
    uri: str = Field(description="Object storage prefix of the checkpoint.")
    time: str | None = Field(default=None, description="When it was committed (RFC 3339).")
    format: str | None = Field(
        default=None,
        description=(
            "The checkpoint format the sync sidecar recognised it as (hf, lightning, composer, "
            "dcp, deepspeed, megatron, nemo, mindformers, accelerate or pattern)."
        ),
    )
    bytes: int | None = Field(default=None, ge=0, description="Its size, all ranks' files.")
    upload_seconds: float | None = Field(
        default=None, ge=0, description="What its upload and verify took (the slowest rank's)."
    )


class SaveEstimate(_Model):
    """Will a save on preemption fit? The last checkpoint's size at the upload throughput the
    sync sidecar measured, against the grace period and the spot notice windows."""

    checkpoint_bytes: int = Field(ge=0, description="Size of the latest checkpoint.")
    bytes_per_second: int = Field(ge=0, description="Upload throughput measured by the sidecar.")
    upload_seconds: float = Field(ge=0, description="Estimated time to upload such a save.")
    window_seconds: int = Field(
        ge=0,
        description=(
            "Time a save has: the grace period, or the spot notice of the attempt's node when "
            "shorter."
        ),
    )
    fits: bool = Field(description="Whether the upload fits the window.")
    message: str = Field(description="The estimate against every window known.")


class RunProgress(_Model):
    """Where the trainer is, as the sync sidecar of rank 0 last published it (display only:
    no decision reads it)."""

    step: int = Field(ge=0, description="The trainer's step, from its progress file.")
    total_steps: int | None = Field(
        default=None, ge=1, description="Steps the trainer will run, when its framework knows."
    )
    percent: float | None = Field(
        default=None, ge=0, le=100, description="step / totalSteps, in percent."
    )
    steps_per_second: float | None = Field(
        default=None,
        ge=0,
        description=(
            "Steps per second since the current attempt's first step the sidecar saw (not "
            "since the run began, so a resume does not skew it)."
        ),
    )
    samples_per_second: float | None = Field(
        default=None, ge=0, description="Samples per second, as the trainer reports it."
    )
    tokens_per_second: float | None = Field(
        default=None, ge=0, description="Tokens per second, as the trainer reports it."
    )
    eta_seconds: int | None = Field(
        default=None,
        ge=0,
        description="Seconds left at observedAt: (totalSteps - step) / stepsPerSecond.",
    )
    estimated_completion_time: str | None = Field(
        default=None, description="When the trainer reaches totalSteps at that rate (RFC 3339)."
    )
    eta: str | None = Field(
        default=None,
        description="Time left as the status was written, for people (1h12m); the ETA column.",
    )
    summary: str = Field(
        description=(
            "The percent done (48%), or the step when the total is unknown (step 48); the "
            "Progress column."
        )
    )
    attempt: int = Field(ge=0, description="The attempt whose sidecar published it.")
    observed_at: str = Field(description="When the sidecar read it from the trainer (RFC 3339).")


# Preemption kinds the goodput ledger counts the steps lost of (``decide.goodput.kind_of``).
LOSS_KINDS = ("eviction", "notice", "nodeLost", "sigkill", "other")


class AttemptRecord(_Model):
    """One attempt in the goodput ledger: its pod's start, the steps its sidecar saw, its end."""

    attempt: int = Field(ge=1, description="The attempt's number.")
    resume_step: int | None = Field(
        default=None, ge=0, description="The committed step it resumed from; none: from scratch."
    )
    created: str = Field(description="When its pod (rank 0's) was created (RFC 3339).")
    first_step: int | None = Field(
        default=None, ge=0, description="The first step its sidecar saw the trainer at."
    )
    first_step_time: str | None = Field(default=None, description="When (RFC 3339).")
    last_step: int | None = Field(
        default=None,
        ge=0,
        description="The last step its sidecar published (at its end, the trainer's last).",
    )
    last_step_time: str | None = Field(default=None, description="When (RFC 3339).")
    save_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Seconds its trainer stood still in saves, as its integration timed them.",
    )
    last_word: bool | None = Field(
        default=None,
        description="Its sidecar's last record was seen: lastStep is the trainer's last.",
    )
    ended: str | None = Field(default=None, description="When it ended (RFC 3339).")
    ending: str | None = Field(default=None, description="Why it ended: the ending's reason.")
    kind: str | None = Field(
        default=None,
        description=(
            "The preemption kind its lost steps count under: eviction, notice, nodeLost, "
            "sigkill or other; none for a success."
        ),
    )
    committed_step: int | None = Field(
        default=None, ge=0, description="The newest committed checkpoint when it ended."
    )
    steps_lost: int | None = Field(
        default=None,
        ge=0,
        description="Steps it trained past its last commit, lost at its end.",
    )


class StepsLost(_Model):
    """Steps trained after the last commit of attempts that ended, by preemption kind."""

    eviction: int = Field(default=0, ge=0, description="Evicted or deleted pods.")
    notice: int = Field(default=0, ge=0, description="Preemption notices (noticeTaints).")
    node_lost: int = Field(default=0, ge=0, description="Nodes gone or NotReady.")
    sigkill: int = Field(default=0, ge=0, description="Trainers killed (exit 137, OOM).")
    other: int = Field(default=0, ge=0, description="Failures and anything else.")


class LedgerTotals(_Model):
    """Seconds of the run's wall time by what they went to."""

    productive_seconds: float = Field(
        default=0.0, ge=0, description="Training whose steps the model keeps."
    )
    lost_seconds: float = Field(
        default=0.0, ge=0, description="Training past an ended attempt's last commit."
    )
    startup_seconds: float = Field(
        default=0.0, ge=0, description="Restore and start-up: a pod's creation to its first step."
    )
    waiting_seconds: float = Field(
        default=0.0,
        ge=0,
        description="No pod: queued, suspended, held for a Secret or storage, backoff.",
    )
    stall_seconds: float = Field(
        default=0.0,
        ge=0,
        description=(
            "Checkpoint stall: saves the trainer stood still for (as its integration timed "
            "them), and an attempt's end after its last step (its final save and upload)."
        ),
    )
    steps_lost: StepsLost = Field(
        default_factory=StepsLost, description="Steps lost, by preemption kind."
    )


class Goodput(LedgerTotals):
    """The goodput ledger: the run's wall time split by what it went to (display only)."""

    wall_seconds: float = Field(ge=0, description="Since the run was created, to observedAt.")
    percent: float | None = Field(
        default=None, ge=0, le=100, description="productiveSeconds / wallSeconds, in percent."
    )
    summary: str | None = Field(
        default=None, description="The percent for people (83%); the Goodput column."
    )
    observed_at: str = Field(description="When these figures were made (RFC 3339).")
    settled: LedgerTotals = Field(
        default_factory=LedgerTotals,
        description="The totals of the attempts that ended and the waits before them.",
    )
    settled_at: str | None = Field(
        default=None, description="Until when settled counts: its last attempt's end."
    )
    settled_through: int = Field(
        default=0,
        ge=0,
        description=(
            "The last attempt in settled; the attempt that ended after it is still open to "
            "its sidecar's last word."
        ),
    )


class Condition(_Model):
    """One aspect of the run's state, in the metav1.Condition shape."""

    type: str = Field(
        description=(
            "Type of condition in CamelCase: Running, Succeeded, Failed, Protected, Suspended, "
            "Admitted (by Kueue) or SaveAtRisk."
        ),
    )
    status: str = Field(description="Status of the condition, one of True, False, Unknown.")
    reason: str = Field(
        description=(
            "A programmatic identifier for the condition's last transition, in CamelCase "
            "(Started, Resumed, Preempted, CrashLoop, ...). This field may not be empty."
        ),
    )
    message: str = Field(
        default="",
        description=(
            "A human readable message indicating details about the transition. "
            "This may be an empty string."
        ),
    )
    observed_generation: int | None = Field(
        default=None,
        description=(
            "The .metadata.generation that the condition was set based upon. If it is lower "
            "than .metadata.generation, the condition is out of date with respect to the "
            "current spec."
        ),
    )
    last_transition_time: str = Field(
        description=(
            "The last time the condition transitioned from one status to another (RFC 3339). "
            "It changes only when the status flips."
        ),
    )


class TrainingRunStatus(_Model):
    """Observed state of a TrainingRun, written by the operator."""

    observed_generation: int | None = Field(
        default=None,
        description="The .metadata.generation of the spec the operator last acted on.",
    )
    phase: str | None = Field(
        default=None,
        description=(
            "Display summary: Pending, Running, Backoff, Suspending (held, its attempt saving "
            "and stopping), Suspended (spec.suspend), Queued (waiting for Kueue), Succeeded or "
            "Failed."
        ),
    )
    attempt: int = Field(default=0, description="Number of the current or last attempt.")
    restarts: int = Field(default=0, description="Failed attempts so far.")
    preemptions: int = Field(default=0, description="Preempted attempts so far.")
    consecutive_failures: int = Field(
        default=0, description="Failures in a row without a new committed checkpoint."
    )
    stalled_attempts: int = Field(
        default=0,
        description=(
            "Attempts in a row, however they ended, with no new committed checkpoint: the next "
            "attempt waits the backoff for this streak, so no ending can start pods in a loop."
        ),
    )
    latest_checkpoint: CheckpointRef | None = Field(
        default=None,
        description="Newest committed checkpoint in storage; the next attempt resumes from it.",
    )
    save_estimate: SaveEstimate | None = Field(
        default=None,
        description=(
            "Time to upload a checkpoint like the latest against the time a save on preemption "
            "has; the SaveAtRisk condition is True when it does not fit."
        ),
    )
    progress: RunProgress | None = Field(
        default=None,
        description=(
            "Where the trainer is and when it will end, from its progress file (written by the "
            "trainer integrations), refreshed at most once a minute; display only."
        ),
    )
    goodput: Goodput | None = Field(
        default=None,
        description=(
            "The goodput ledger: wall time split into productive training, work lost, start-up, "
            "waiting and checkpoint stall, and the steps lost by preemption kind; display only."
        ),
    )
    attempts: list[AttemptRecord] = Field(
        default_factory=list,
        max_length=20,
        description="The last 20 attempts: start, first and last step, end, steps lost.",
    )
    bad_checkpoints: list[
        Annotated[int, Field(description="Training step of a checkpoint that is not used.")]
    ] = Field(
        default_factory=list,
        description=(
            "Steps of committed checkpoints not used again: the restore found them corrupt, or "
            "the operator found them incomplete in the bucket (at most 1000)."
        ),
    )
    active_pod: str | None = Field(
        default=None,
        description=(
            "Name of the pod of the current attempt (<run>-<attempt>), or of its rank 0 "
            "(<run>-<attempt>-0) when replicas > 1, while the attempt runs."
        ),
    )
    resume_step: int | None = Field(
        default=None, description="Step the current attempt resumed from."
    )
    next_attempt_time: str | None = Field(
        default=None, description="When the next attempt starts after a backoff."
    )
    reason: str | None = Field(
        default=None,
        description=(
            "A brief CamelCase reason for the run's latest change (Started, Preempted, "
            "CrashLoop, ...)."
        ),
    )
    message: str | None = Field(
        default=None,
        description="A human readable message with details about the run's latest change.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        # A list-map: one entry per type, merged by type in server-side apply.
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description=(
            "The latest available observations of the run's state: Running, Succeeded, Failed, "
            "Protected, Suspended, Admitted, SaveAtRisk (metav1.Condition)."
        ),
    )
