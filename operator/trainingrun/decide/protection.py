"""Whether the running attempt is protected: has a checkpoint been committed since its trainer
started? A trainer whose checkpoints the sync sidecar never recognises (a layout of no known
format) or that saves none trains unprotected while the run looks healthy; the ``Protected``
condition says so once ``spec.checkpoint.unprotectedAfterSeconds`` have passed without a commit.

The clock starts when the trainer container started (its state's ``startedAt``), not at the
pod's ``status.startTime``: the pod starts before the image pull and the restore, which can take
minutes for a large checkpoint, and a trainer cannot save before it runs. The trainer's start
and the commit times in the bucket manifest both come from clocks of the pod's node (the
kubelet's, the sync sidecar's), so comparing them does not depend on the operator's clock; the
deadline does (start + the limit, against the operator's now).

For a gang, rank 0's trainer is the clock: a checkpoint is committed once all ranks' parts are
there, so one commit time speaks for all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from trainingrun.api import CheckpointRef, CheckpointSpec
from trainingrun.contract import SYNC_CONTAINER, TRAINER_CONTAINER
from trainingrun.decide import reasons as R
from trainingrun.decide.podview import bounded, container_status, parse_instant

# The start of the sync sidecar's termination message when it gives up after access denied
# (trainingrun.agent.sidecar.AccessDeniedWatch): the kubelet restarts it, and its last state keeps
# the message, which turns the condition False at once rather than at the deadline.
ACCESS_DENIED_MESSAGE = "checkpoints are not being committed: access denied"
MAX_SIDECAR_MESSAGE = 512


@dataclass(frozen=True)
class Verdict:
    """What the ``Protected`` condition should say about the attempt whose trainer started at
    ``since``: True (a commit since), None (Unknown: none yet, before the deadline), False (none
    by the deadline). ``recheck_after``: seconds until the deadline, while it is not reached."""

    protected: bool | None
    reason: str
    message: str
    since: datetime
    recheck_after: float | None = None


def trainer_start(pod: Mapping[str, Any] | None) -> tuple[datetime | None, bool]:
    """(when the trainer container started, whether it runs now); (None, False) before it
    started. A trainer that exited keeps its start in ``state.terminated.startedAt``."""
    trainer = container_status(pod, TRAINER_CONTAINER) if pod else None
    state = (trainer or {}).get("state") or {}
    if "running" in state:
        return parse_instant((state["running"] or {}).get("startedAt")), True
    if "terminated" in state:
        return parse_instant((state["terminated"] or {}).get("startedAt")), False
    return None, False


def judge(
    pod: Mapping[str, Any] | None,
    latest: CheckpointRef | None,
    checkpoint: CheckpointSpec,
    label: str,
    now: datetime,
) -> Verdict | None:
    """The verdict on the attempt of ``pod`` (``label``: ``attempt 2 (r-2)``), None when there
    is nothing to judge: the warning is off (``unprotectedAfterSeconds: 0``), the trainer has
    not started, or it has stopped without a commit since its start (the attempt's ending says
    the rest)."""
    limit = checkpoint.unprotected_after_seconds
    since, running = trainer_start(pod)
    if not limit or since is None:
        return None
    committed = parse_instant(latest.time) if latest else None
    if committed is not None and committed < since:
        committed = None  # before this trainer started: not this attempt's
    denied = access_denied(pod) if running else None
    if latest is not None and committed is not None and not (denied and denied.after(committed)):
        message = f"{label}: checkpoint {latest.step} committed at {latest.time}"
        return Verdict(True, R.CHECKPOINT_COMMITTED, message + ", since its trainer started", since)
    if not running:
        return None
    if denied is not None:
        message = (
            f"{label}: {denied.message}; the sync sidecar cannot write to the bucket: check the "
            "keys in the Secret named by spec.checkpoint.storage.credentialsSecret (or the pods' "
            "identity) and the bucket policy (docs/storage.md#bucket-permissions)"
        )
        return Verdict(False, R.ACCESS_DENIED, message, since)
    deadline = since + timedelta(seconds=limit)
    if now < deadline:
        wait = (deadline - now).total_seconds()
        message = awaiting_message(label, limit)
        return Verdict(None, R.AWAITING_CHECKPOINT, message, since, recheck_after=wait)
    return Verdict(False, R.UNPROTECTED, unprotected_message(checkpoint, label, pod), since)


def awaiting_message(label: str, limit: int) -> str:
    """The Unknown verdict's message. It names no time: the condition set when the attempt's
    pod is created says the same, so the trainer's start changes nothing in the status (no
    write). The deadline itself is counted from the trainer's start."""
    return (
        f"{label}: no checkpoint committed since its trainer started; a warning follows if none "
        f"is within {limit} s of its start"
    )


@dataclass(frozen=True)
class Denied:
    """The sync sidecar gave up on access denied: its message, and when it exited (None when
    its status does not say)."""

    message: str
    at: datetime | None

    def after(self, committed: datetime) -> bool:
        """Whether the sidecar gave up after the commit at ``committed``: a commit after it
        (the sidecar restarted with keys that work) means it is protected again. Both times
        come from the pod's node; no time counts as after."""
        return self.at is None or self.at >= committed


def access_denied(pod: Mapping[str, Any] | None) -> Denied | None:
    """The sync sidecar's message (cut to ``MAX_SIDECAR_MESSAGE`` characters) when its last
    run ended giving up on access denied, None otherwise."""
    sync = container_status(pod, SYNC_CONTAINER) if pod else None
    for state in ((sync or {}).get("state"), (sync or {}).get("lastState")):
        ended = (state or {}).get("terminated") or {}
        message = str(ended.get("message") or "").strip()
        if message.startswith(ACCESS_DENIED_MESSAGE):
            first = bounded(message.splitlines()[0], MAX_SIDECAR_MESSAGE)
            return Denied(first, parse_instant(ended.get("finishedAt")))
    return None


def unprotected_message(
    checkpoint: CheckpointSpec, label: str, pod: Mapping[str, Any] | None
) -> str:
    """Names the problem and the fix; the same on every pass (the condition's message is
    written once per attempt, not rewritten as time goes by)."""
    limit, where = checkpoint.unprotected_after_seconds, checkpoint.local_path
    name = ((pod or {}).get("metadata") or {}).get("name", "")
    logs = f"kubectl logs {name} -c {SYNC_CONTAINER} says which"
    if checkpoint.format == "auto":
        seen = f"the sync sidecar recognised no checkpoint in {where}"
        fix = (
            "check that the trainer saves there in a format of docs/checkpoints.md, or set "
            "spec.checkpoint.format, or format: pattern with spec.checkpoint.pattern"
        )
    elif checkpoint.format == "pattern" and checkpoint.pattern is not None:
        glob = checkpoint.pattern.glob
        seen = f"the sync sidecar found no complete checkpoint matching {glob} in {where}"
        fix = (
            "check that the trainer saves there and that spec.checkpoint.pattern (glob, step, "
            "marker) describes its checkpoints (docs/checkpoints.md)"
        )
    else:
        seen = f"the sync sidecar found no complete {checkpoint.format} checkpoint in {where}"
        fix = (
            "check that the trainer saves there and that spec.checkpoint.format "
            f"({checkpoint.format}) is its format (docs/checkpoints.md)"
        )
    return (
        f"{label}: no checkpoint committed in the {limit} s since its trainer started: {seen}, "
        f"or could not upload one ({logs}); {fix}"
    )
