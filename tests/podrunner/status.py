"""A pod's status as the kubelet writes it, built from plain data: the phase, the conditions
(``lastTransitionTime`` moves only when a condition flips), each container's status, and what a
runner reports for containers an earlier runner process started and nobody watches any more.
Nothing here talks to the API; ``tests.podrunner.pod`` writes what ``pod_status`` returns.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from typing import Any

from tests.podrunner.node import now
from tests.podrunner.spec import POD_IP

INIT, SIDECAR, MAIN = "init", "sidecar", "main"
TERMINAL = ("Succeeded", "Failed")
SHUTDOWN_REASON = "Terminated"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
LOST_MESSAGE = "The container could not be located when the pod was terminated"


@dataclass
class Container:
    spec: dict[str, Any]
    kind: str
    state: dict[str, Any] = field(
        default_factory=lambda: {"waiting": {"reason": "PodInitializing"}}
    )
    last_state: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0
    proc: subprocess.Popen[bytes] | None = None
    mount_ns: str = ""  # its mount namespace once entered: what its processes share
    mount_ns_fd: int = -1  # held open while the container lives (hold_mount_ns)
    container_id: str = ""
    started_once: bool = False
    restart_at: float | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def running(self) -> bool:
        return "running" in self.state

    @property
    def exit_code(self) -> int | None:
        term = self.state.get("terminated")
        return None if term is None else int(term["exitCode"])


@dataclass(frozen=True)
class Progress:
    """How far the pod's life has come, as its status shows it."""

    sandbox: bool  # volumes are in place
    done: bool  # every container has stopped
    lost: bool  # an earlier runner process started its containers
    shut_down: bool  # stopped by a graceful node shutdown
    start_time: str | None
    pod_ip: str = POD_IP  # its own with a network of its own, else the node's loopback


class Transitions:
    """The status and ``lastTransitionTime`` of each condition type this runner wrote."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[str, str]] = {}

    def condition(self, kind: str, ok: bool, reason: str = "", message: str = "") -> dict[str, Any]:
        status = "True" if ok else "False"
        previous = self._seen.get(kind)
        if previous is None or previous[0] != status:
            self._seen[kind] = (status, now())
        # None clears what an earlier write set: conditions are merged by type.
        return {
            "type": kind,
            "status": status,
            "lastTransitionTime": self._seen[kind][1],
            "reason": reason or None,
            "message": message or None,
        }


def _unready(names: list[str], what: str) -> str:
    return f"containers with {what} status: [{' '.join(names)}]"


def ran_before(status: dict[str, Any]) -> bool:
    """An earlier runner process started this pod's containers; they are gone now."""
    seen = (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
    return any("running" in s.get("state", {}) or "terminated" in s.get("state", {}) for s in seen)


def mark_lost(containers: list[Container], status: dict[str, Any]) -> None:
    """Each container keeps the end it had; one that was running ends as the kubelet reports a
    container it cannot find (137, ``ContainerStatusUnknown``)."""
    previous = {
        s["name"]: s
        for s in (status.get("initContainerStatuses") or [])
        + (status.get("containerStatuses") or [])
    }
    for c in containers:
        state = previous.get(c.name, {}).get("state", {})
        if "terminated" in state:
            c.state = {"terminated": state["terminated"]}
        elif "running" in state:
            c.state = {
                "terminated": {
                    "exitCode": 137,
                    "reason": "ContainerStatusUnknown",
                    "message": LOST_MESSAGE,
                    "startedAt": state["running"].get("startedAt"),
                    "finishedAt": now(),
                }
            }


def phase(containers: list[Container], progress: Progress) -> str:
    if progress.lost or progress.shut_down:
        return "Failed"
    mains = [c for c in containers if c.kind == MAIN]
    if progress.done:
        return "Succeeded" if all(c.exit_code == 0 for c in mains) else "Failed"
    if any("waiting" not in c.state for c in mains):
        return "Running"
    return "Pending"


def conditions(
    containers: list[Container],
    progress: Progress,
    pod_phase: str,
    transitions: Transitions,
    known: set[str],
) -> list[dict[str, Any]]:
    """The conditions this runner owns; ``known`` are the types the pod has already (others,
    such as the scheduler's PodScheduled or an eviction's DisruptionTarget, are kept)."""
    cond = transitions.condition
    incomplete = [
        c.name
        for c in containers
        if (c.kind == INIT and c.exit_code != 0) or (c.kind == SIDECAR and not c.started_once)
    ]
    unready = [c.name for c in containers if c.kind != INIT and not c.running]
    if pod_phase in TERMINAL:
        ready_args: tuple[str, str] = ("PodCompleted", "")
    else:
        ready_args = ("ContainersNotReady", _unready(unready, "unready")) if unready else ("", "")
    init_args = ("ContainersNotInitialized", _unready(incomplete, "incomplete"))
    ready = not unready and pod_phase == "Running"
    result = [
        cond("PodReadyToStartContainers", progress.sandbox and not progress.done),
        cond("Initialized", not incomplete, *(init_args if incomplete else ())),
        cond("ContainersReady", ready, *ready_args),
        cond("Ready", ready, *ready_args),
    ]
    if "PodScheduled" not in known:
        result.append(cond("PodScheduled", True))
    if progress.shut_down:
        result.append(cond("DisruptionTarget", True, "TerminationByKubelet", SHUTDOWN_MESSAGE))
    return result


def container_status(c: Container) -> dict[str, Any]:
    status: dict[str, Any] = {
        "name": c.name,
        "image": c.spec.get("image", ""),
        "imageID": "",
        "ready": c.exit_code == 0 if c.kind == INIT else c.running,
        "restartCount": c.restarts,
        "started": c.running,
        "state": c.state,
    }
    if c.container_id:
        status["containerID"] = c.container_id
    if c.last_state:
        status["lastState"] = c.last_state
    return status


def pod_status(
    containers: list[Container], progress: Progress, transitions: Transitions, known: set[str]
) -> dict[str, Any]:
    """The whole ``status`` the runner writes (a strategic merge patch: conditions by type)."""
    pod_phase = phase(containers, progress)
    status: dict[str, Any] = {
        "phase": pod_phase,
        "conditions": conditions(containers, progress, pod_phase, transitions, known),
        "initContainerStatuses": [container_status(c) for c in containers if c.kind != MAIN],
        "containerStatuses": [container_status(c) for c in containers if c.kind == MAIN],
        "hostIP": POD_IP,
        "hostIPs": [{"ip": POD_IP}],
    }
    if progress.sandbox:
        status["podIP"] = progress.pod_ip
        status["podIPs"] = [{"ip": progress.pod_ip}]
    if progress.start_time:
        status["startTime"] = progress.start_time
    if progress.shut_down:
        status["reason"] = SHUTDOWN_REASON
        status["message"] = SHUTDOWN_MESSAGE
    return status
