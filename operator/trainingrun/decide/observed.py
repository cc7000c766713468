"""What one reconcile pass sees of a run (``Observed``: the run, its attempt's pods and
nodes, the newest committed checkpoint when read, Kueue's answer) and what it decides
(``Plan``: the status, the Events, the annotations, the pods to delete and the attempt to
create), with the attempt's outcome as those pods show it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from trainingrun.api import (
    AttemptRecord,
    CheckpointRef,
    Goodput,
    TrainingRunSpec,
    TrainingRunStatus,
)
from trainingrun.checkpoint.progress import ProgressRecord
from trainingrun.decide import hold
from trainingrun.decide import reasons as R
from trainingrun.decide.classify import Outcome, classify
from trainingrun.decide.gang import Member, gang_outcome
from trainingrun.decide.naming import pod_name
from trainingrun.decide.notices import Notice
from trainingrun.decide.status import Event


@dataclass(frozen=True)
class Observed:
    name: str
    generation: int
    spec: TrainingRunSpec
    status: TrainingRunStatus
    pod: Mapping[str, Any] | None  # the pod of status.attempt, None when absent
    node: Mapping[str, Any] | None
    node_deleted: bool
    latest: CheckpointRef | None  # newest committed checkpoint in the manifest, when read
    now: datetime
    # A gang's other pods, ranks 1 to replicas - 1 (``pod`` and ``node`` are rank 0's).
    peers: tuple[Member, ...] = ()
    # Kueue's admission of the run's Workload; None: the run names no queue (decide.hold).
    queue: hold.Queue | None = None
    # The progress record rank 0's sidecar published, when read this pass (decide.progress).
    progress: ProgressRecord | None = None
    # The last word a sidecar put at its end, when looked for this pass (decide.goodput).
    last_word: ProgressRecord | None = None
    # When the run was created (its metadata.creationTimestamp): the goodput ledger's start.
    created: datetime | None = None
    # The goodput ledger read back from the run's prefix (the status has none): its figures and
    # attempts.
    ledger: tuple[Goodput, list[AttemptRecord]] | None = None

    @property
    def gang(self) -> tuple[Member, ...]:
        """Every pod of the attempt, by rank."""
        replicas = self.spec.replicas
        first = pod_name(self.name, self.status.attempt, 0, replicas)
        return (Member(first, self.pod, self.node, self.node_deleted), *self.peers)


@dataclass(frozen=True)
class Plan:
    status: TrainingRunStatus
    create_attempt: int | None = None
    delete_pods: tuple[str, ...] = ()  # pods of this attempt to delete (once status landed)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    # Pods of this attempt to annotate with ``annotations`` (asked to save and stop for a hold).
    annotate: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    # A preemption notice on one pod of the attempt, for the others (decide.notices).
    notice: Notice | None = None

    @property
    def warns_unprotected(self) -> bool:
        """Whether the pass warns that the attempt is unprotected."""
        return any(e.reason == R.UNPROTECTED for e in self.events)


def newer(latest: CheckpointRef | None, current: CheckpointRef | None) -> CheckpointRef | None:
    if latest is None:
        return current
    if current is None or latest.step >= current.step:
        return latest
    return current


def sooner(a: float | None, b: float | None) -> float | None:
    """The earlier of two requeue delays (None: no requeue)."""
    return b if a is None else a if b is None else min(a, b)


def attempt_outcome(obs: Observed) -> Outcome:
    """How the attempt stands: its pod's ending, or a gang's from all its pods'."""
    gang = obs.gang
    outcomes = [
        classify(
            m.pod,
            node=m.node,
            node_deleted=m.node_deleted,
            notice_taints=obs.spec.preemption.notice_taints,
            now=obs.now,
        )
        for m in gang
    ]
    start_timeout = float(obs.spec.gang.start_timeout_seconds)
    return gang_outcome(gang, outcomes, start_timeout=start_timeout, now=obs.now)


def attempt_label(obs: Observed, attempt: int, first: str) -> str:
    """``attempt 3 (r-3)``, or ``attempt 3 (4 pods)`` for a gang."""
    replicas = obs.spec.replicas
    return f"attempt {attempt} ({first if replicas == 1 else f'{replicas} pods'})"
