"""Will a save on preemption fit? On notice the trainer saves and the sync sidecar uploads what it
saved before the pod goes: within the pod's grace period
(``spec.preemption.terminationGracePeriodSeconds``), and on a spot node within the cloud's
notice, whichever ends first. The sidecar records what each checkpoint's upload took (the
slowest rank's, ``ManifestEntry.upload_seconds``); the latest one's size at that throughput is
the estimate. The ``SaveAtRisk`` condition is True when it does not fit the window of the
attempt's node, with a Warning Event when it turns True; the status shows the estimate against
every window known.

The estimate is the upload alone: the trainer's own save to local disk comes before it.

Spot notice windows, from each cloud's documentation:

- AWS EC2 Spot: a two-minute interruption notice ("Spot Instance interruption notices",
  EC2 User Guide);
- Google Cloud Spot and preemptible VMs: 30 seconds ("Spot VMs", Compute Engine docs, preemption
  process);
- Azure Spot VMs: at least 30 seconds through Scheduled Events ("Azure Spot Virtual Machines",
  eviction; "Scheduled Events", Preempt).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trainingrun.api import CheckpointRef, SaveEstimate, TrainingRunStatus
from trainingrun.contract import format_bytes
from trainingrun.decide import reasons as R
from trainingrun.decide.status import Event, set_condition


@dataclass(frozen=True)
class Notice:
    name: str
    seconds: int
    labels: tuple[tuple[str, str], ...]  # node labels (key, value) that mark such a spot node


NOTICES = (
    Notice(
        "AWS spot notice",
        120,
        (("eks.amazonaws.com/capacityType", "SPOT"), ("karpenter.sh/capacity-type", "spot")),
    ),
    Notice(
        "GCP spot notice",
        30,
        (("cloud.google.com/gke-spot", "true"), ("cloud.google.com/gke-preemptible", "true")),
    ),
    Notice("Azure spot notice", 30, (("kubernetes.azure.com/scalesetpriority", "spot"),)),
)


def node_notice(node: Mapping[str, Any] | None) -> Notice | None:
    """The spot notice of the cloud whose spot node ``node`` is, by its labels; None when it is
    not a spot node of a cloud known here (or unknown)."""
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    return next((n for n in NOTICES if any(labels.get(k) == v for k, v in n.labels)), None)


def estimate(
    latest: CheckpointRef | None, grace_seconds: int, node: Mapping[str, Any] | None
) -> SaveEstimate | None:
    """The estimate for a checkpoint like ``latest``; None when its upload was not measured."""
    if latest is None or latest.bytes is None or latest.upload_seconds is None:
        return None
    seconds = latest.upload_seconds
    rate = int(latest.bytes / seconds) if seconds > 0 else 0
    windows = [("the grace period", grace_seconds), *((n.name, n.seconds) for n in NOTICES)]
    fit = [f"{name} ({s} s)" for name, s in windows if seconds <= s]
    miss = [f"{name} ({s} s)" for name, s in windows if seconds > s]
    notice = node_notice(node)
    window = min(grace_seconds, notice.seconds) if notice else grace_seconds
    parts = [
        f"a checkpoint of {format_bytes(latest.bytes)} took {seconds:.1f} s to upload "
        f"({format_bytes(rate)}/s)"
    ]
    if fit:
        parts.append("fits " + ", ".join(fit))
    if miss:
        parts.append("does not fit " + ", ".join(miss))
    if notice:
        parts.append(f"the attempt's node is a spot node with the {notice.name}")
    return SaveEstimate(
        checkpoint_bytes=latest.bytes,
        bytes_per_second=rate,
        upload_seconds=seconds,
        window_seconds=window,
        fits=seconds <= window,
        message="; ".join(parts),
    )


def mark(
    status: TrainingRunStatus,
    grace_seconds: int,
    node: Mapping[str, Any] | None,
    generation: int,
    now: datetime,
) -> tuple[TrainingRunStatus, list[Event]]:
    """``status`` with the estimate of its latest checkpoint and the SaveAtRisk condition; a
    Warning ``SaveTooSlow`` Event when the condition turns True. Without a measured upload the
    last estimate stays."""
    est = estimate(status.latest_checkpoint, grace_seconds, node)
    if est is None:
        return status, []
    old = next((c for c in status.conditions if c.type == R.SAVE_AT_RISK), None)
    reason = R.SAVE_FITS if est.fits else R.SAVE_TOO_SLOW
    message = est.message
    if not est.fits:
        message += (
            f": a save on preemption would be lost; raise "
            f"spec.preemption.terminationGracePeriodSeconds (now {grace_seconds} s), save less "
            f"per checkpoint, or run on nodes with a longer notice"
        )
    conds = set_condition(
        status.conditions, R.SAVE_AT_RISK, not est.fits, reason, message, generation, now
    )
    events = (
        []
        if est.fits or (old and old.status == "True")
        else [Event(R.event_type(reason), reason, message)]
    )
    return status.model_copy(update={"save_estimate": est, "conditions": conds}), events
