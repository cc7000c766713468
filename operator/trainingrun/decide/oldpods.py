"""Pods of older attempts go away for sure: which to delete now and with which grace, and which
to report as lingering, from what is known of each pod and of the operator's DELETEs of it.

A pod of an attempt before the run's current one may still run and write (its node stopped
answering, a DELETE was refused, a finalizer holds it). Rules, in order, for each such pod:

- O1 it stopped, or stops by itself on a Ready node, and nobody asked it to go: left alone for
  its logs (as ``plan()`` leaves it);
- O2 no DELETE of it accepted yet (never sent, or refused): DELETE now, grace 0 when its node is
  NotReady or gone or it has been asked for longer than its grace period plus the margin, else
  its own grace period;
- O3 a DELETE with a grace period was accepted: grace 0 once its node is NotReady or gone, or
  once it outlived that grace period plus the margin; else wait;
- O4 a grace-0 DELETE was accepted and it is still there: the DELETE is sent again every
  ``resend_seconds``;
- O5 it lingers when it is still there ``margin_seconds`` after a grace-0 DELETE, or when every
  DELETE was refused for its grace period plus the margin: reported (an Event) at once and then
  every ``report_seconds`` while it stays. A grace-0 DELETE goes with each report: its 404 says
  the pod is gone after all (the cache had not seen it go), and nothing is reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from trainingrun.contract import LABEL_ATTEMPT, parse_time
from trainingrun.decide.podview import node_not_ready, stops_by_itself

DEFAULT_GRACE_SECONDS = 30  # the pod's terminationGracePeriodSeconds when it has none


@dataclass(frozen=True)
class Timing:
    # Past its grace period, a pod is deleted with grace 0; as long again, it lingers.
    margin_seconds: float = 30.0
    # The next pass while old pods remain: a refused DELETE is tried again then.
    retry_seconds: float = 5.0
    # A pod still there after a grace-0 DELETE: the DELETE is sent again this often.
    resend_seconds: float = 60.0
    # A lingering pod is reported once, then again this often while it stays (not every pass).
    report_seconds: float = 600.0


class NodeState(Enum):
    READY = "Ready"  # or not scheduled: the API server removes such a pod at once
    NOT_READY = "NotReady"
    GONE = "gone"


@dataclass(frozen=True)
class OldPod:
    name: str
    attempt: int
    node: NodeState = NodeState.READY
    node_name: str = ""
    ended: bool = False  # stopped, or stopping by itself on a Ready node
    grace_seconds: int = DEFAULT_GRACE_SECONDS  # spec.terminationGracePeriodSeconds
    deletion: datetime | None = None  # metadata.deletionTimestamp: when it should be gone
    deletion_grace: int | None = None  # metadata.deletionGracePeriodSeconds
    finalizers: tuple[str, ...] = ()

    @property
    def deleting_since(self) -> datetime | None:
        """When the API server accepted the DELETE it is going away by (anyone's)."""
        if self.deletion is None:
            return None
        return self.deletion - timedelta(seconds=self.deletion_grace or 0)


@dataclass(frozen=True)
class Asked:
    """What the operator remembers of its DELETEs of one pod."""

    first: datetime  # the first DELETE sent, accepted or not
    accepted: datetime | None = None  # the last DELETE the API server accepted
    grace: int | None = None  # its grace period; None: the pod's own
    error: str = ""  # why the last DELETE failed, when it did
    said: datetime | None = None  # when it was last reported lingering


@dataclass(frozen=True)
class Delete:
    name: str
    grace: int | None  # None: the pod's own grace period


@dataclass(frozen=True)
class Lingering:
    pod: OldPod
    asked_for: float  # seconds since it was first asked to go
    say: bool  # report it now: not reported within report_seconds
    error: str = ""  # the last refusal of its DELETE, when every one was refused


@dataclass(frozen=True)
class Sweep:
    deletes: list[Delete] = field(default_factory=list)
    lingering: list[Lingering] = field(default_factory=list)
    requeue_after: float | None = None  # old pods remain: look again then


def old_pod(
    pod: Mapping[str, Any], node: Mapping[str, Any] | None, node_deleted: bool
) -> OldPod | None:
    """The decision's view of a pod (API JSON) and its node; None without an attempt label."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    label = str((meta.get("labels") or {}).get(LABEL_ATTEMPT, ""))
    if not label.isdigit():
        return None
    node_name = str(spec.get("nodeName") or "")
    state = NodeState.READY
    if node_name and node_deleted:
        state = NodeState.GONE
    elif node_name and node_not_ready(node):
        state = NodeState.NOT_READY
    phase = (pod.get("status") or {}).get("phase")
    grace = spec.get("terminationGracePeriodSeconds")
    deletion_grace = meta.get("deletionGracePeriodSeconds")
    return OldPod(
        name=str(meta.get("name") or ""),
        attempt=int(label),
        node=state,
        node_name=node_name,
        ended=phase in ("Succeeded", "Failed") or stops_by_itself(pod, node, node_deleted),
        grace_seconds=int(grace) if grace is not None else DEFAULT_GRACE_SECONDS,
        deletion=parse_time(meta.get("deletionTimestamp")),
        deletion_grace=int(deletion_grace) if deletion_grace is not None else None,
        finalizers=tuple(meta.get("finalizers") or ()),
    )


def _after(t: datetime, seconds: float) -> datetime:
    return t + timedelta(seconds=seconds)


def _accepted(pod: OldPod, asked: Asked | None) -> tuple[datetime, int] | None:
    """(when, grace) of the DELETE the pod is going away by: its own record first (anyone's
    DELETE, and it survives an operator restart), else the operator's memory (the cache may not
    have seen the pod change yet)."""
    since = pod.deleting_since
    if since is not None:
        return since, pod.deletion_grace or 0
    if asked is not None and asked.accepted is not None:
        return asked.accepted, pod.grace_seconds if asked.grace is None else asked.grace
    return None


def decide_pod(
    pod: OldPod, asked: Asked | None, now: datetime, timing: Timing
) -> tuple[Delete | None, Lingering | None]:
    """Rules O1-O5 (module docstring) for one pod."""
    starts = [t for t in (asked.first if asked else None, pod.deleting_since) if t is not None]
    if not starts and pod.ended:
        return None, None  # O1
    since = min(starts, default=now)
    lost = pod.node is not NodeState.READY
    margin = timing.margin_seconds
    accepted = _accepted(pod, asked)
    if accepted is None:  # O2
        overdue = now >= _after(since, pod.grace_seconds + margin)
        delete = Delete(pod.name, 0 if lost or overdue else None)
        if not overdue:
            return delete, None
        error = asked.error if asked else ""
        return delete, _lingering(pod, asked, since, now, timing, error)
    at, grace = accepted
    if grace > 0:  # O3
        if lost or now >= _after(at, grace + margin):
            return Delete(pod.name, 0), None
        return None, None
    last = asked.accepted if asked and asked.accepted else at
    resend = Delete(pod.name, 0) if now >= _after(last, timing.resend_seconds) else None  # O4
    if now < _after(at, margin):
        return resend, None
    linger = _lingering(pod, asked, since, now, timing)  # O5
    return (Delete(pod.name, 0) if linger.say else resend), linger


def _lingering(
    pod: OldPod,
    asked: Asked | None,
    since: datetime,
    now: datetime,
    timing: Timing,
    error: str = "",
) -> Lingering:
    said = asked.said if asked else None
    say = said is None or now >= _after(said, timing.report_seconds)
    return Lingering(pod, (now - since).total_seconds(), say, error)


def sweep(
    pods: Iterable[OldPod], asked: Mapping[str, Asked], now: datetime, timing: Timing
) -> Sweep:
    """What to do about a run's pods of older attempts in this pass."""
    deletes: list[Delete] = []
    lingering: list[Lingering] = []
    remain = False
    for pod in pods:
        memory = asked.get(pod.name)
        delete, linger = decide_pod(pod, memory, now, timing)
        remain = remain or memory is not None or pod.deletion is not None or not pod.ended
        if delete is not None:
            deletes.append(delete)
        if linger is not None:
            lingering.append(linger)
    return Sweep(deletes, lingering, timing.retry_seconds if remain else None)


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{s % 3600 // 60}m"


def lingers_message(linger: Lingering, namespace: str) -> str:
    """The OldPodLingers message: the pod, its attempt, how long it has been asked to go, and
    the likely cause with its fix."""
    pod = linger.pod
    head = (
        f"pod {pod.name} of attempt {pod.attempt} is still there "
        f"{_duration(linger.asked_for)} after it was asked to go"
    )
    force = f"kubectl -n {namespace} delete pod {pod.name} --force --grace-period=0"
    if pod.finalizers:
        patch = (
            f"kubectl -n {namespace} patch pod {pod.name} --type=merge "
            """-p '{"metadata":{"finalizers":null}}'"""
        )
        why = (
            f"finalizers {', '.join(pod.finalizers)} hold it: the controller that set them "
            f"must remove them (if that controller is gone: {patch})"
        )
    elif linger.error:
        why = (
            f"the API server refused its DELETE ({linger.error}); check the operator's RBAC "
            f"(pods: delete) and the API server, or {force}"
        )
    elif pod.node is not NodeState.READY:
        state = "is gone" if pod.node is NodeState.GONE else "is NotReady"
        why = f"its node {pod.node_name} {state} and cannot confirm it stopped; {force}"
    else:
        where = f"the kubelet on {pod.node_name}" if pod.node_name else "the kubelet"
        why = f"{where} has not confirmed it stopped; check the node, or {force}"
    return f"{head}: {why}"


def draining_until(
    pod: Mapping[str, Any], node: Mapping[str, Any] | None, node_deleted: bool
) -> datetime | None:
    """When an old pod whose main containers all exited on a Ready node is due to have stopped:
    its sync sidecar is still uploading the trainer's last save (the notice's or the failure's),
    for at most its grace period after the last main container exited. None when it is not
    draining. The next attempt takes the fence only after this: a fenced sidecar could not
    commit that save."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    if not stops_by_itself(pod, node, node_deleted):
        return None
    finished = [
        parse_time(((s.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for s in (pod.get("status") or {}).get("containerStatuses") or []
    ]
    known = [t for t in finished if t is not None]
    if not known:
        return None
    grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return _after(max(known), int(grace) if grace is not None else DEFAULT_GRACE_SECONDS)
