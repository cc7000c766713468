"""How the operator's own containers in a pod (the restore and the sync sidecar) run, as plain
dicts for the pod builder (``decide.pod``): their securityContext, hardened, with the trainer's
user when the template names a non-root one (never root: their own non-root user instead of a
uid or gid 0 the pod level would give them), and where they serve their metrics.
"""

from __future__ import annotations

from typing import Any

from trainingrun import contract as c

LOOPBACK = "127.0.0.1"
# The agent image's own user and group (images/agent/Dockerfile: USER 65532:65532): what the
# agents run as when the template would make them root.
AGENT_UID = 65532
AGENT_GID = 65532


def security_context(user: dict[str, Any]) -> dict[str, Any]:
    """An agent's securityContext: no privilege escalation, no capabilities, a read-only root,
    the container runtime's default seccomp profile (what Pod Security ``restricted`` asks),
    and ``user`` (``agent_user``)."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
        **user,
    }


def metrics_env(mode: str) -> list[dict[str, Any]]:
    """Where the agents serve their metrics: on loopback (the default), on the pod's IP (for a
    PodMonitor to scrape), or not at all (``off``)."""
    if mode == "off":
        return [{"name": c.ENV_METRICS_PORT, "value": "0"}]
    if mode == "pod":
        pod_ip = {"fieldRef": {"fieldPath": "status.podIP"}}
        return [{"name": c.ENV_METRICS_ADDRESS, "valueFrom": pod_ip}]
    return [{"name": c.ENV_METRICS_ADDRESS, "value": LOOPBACK}]


def _id(key: str, own: dict[str, Any], pod_level: dict[str, Any]) -> int | None:
    """A user or group id of the trainer container's securityContext, else of the pod's."""
    value = own.get(key)
    if value is None:
        value = pod_level.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def agent_user(pod_spec: dict[str, Any], trainer: dict[str, Any] | None) -> dict[str, Any]:
    """The user fields of the agents' securityContext. The agents write what the trainer reads
    and rotates away (the restored checkpoint, the control folder), so they run as the trainer
    does when the template says who that is: a ``runAsUser`` other than 0 of the trainer
    container, else of the pod, becomes theirs, with the matching ``runAsGroup`` when given,
    and ``runAsNonRoot``. The pod's ``runAsNonRoot: true`` without a uid is kept.

    Never root: a uid 0 is never copied, and what the agents would inherit from the pod level
    as root (``runAsUser: 0``, ``runAsGroup: 0``) is replaced by their own user, ``AGENT_UID``
    and ``AGENT_GID``, for the template is the tenant's and the agents hold the bucket's
    credentials."""
    pod_level = pod_spec.get("securityContext") or {}
    own = (trainer or {}).get("securityContext") or {}
    uid = _id("runAsUser", own, pod_level)
    gid = _id("runAsGroup", own, pod_level)
    if uid is not None and uid != 0:
        user: dict[str, Any] = {"runAsUser": uid}
        if gid is not None:
            user["runAsGroup"] = AGENT_GID if gid == 0 else gid
        user["runAsNonRoot"] = True
        return user
    # Nothing about the user is copied. Unknown: the trainer runs as its image's USER, which the
    # operator cannot see, and files the agents restored as some other uid might not be
    # deletable by the trainer's checkpoint rotation. Root: never copied to the agents.
    pod_uid, pod_gid = _id("runAsUser", {}, pod_level), _id("runAsGroup", {}, pod_level)
    if pod_uid == 0:  # the pod level would make them root
        return {"runAsUser": AGENT_UID, "runAsGroup": AGENT_GID, "runAsNonRoot": True}
    user = {"runAsGroup": AGENT_GID} if pod_gid == 0 else {}
    if pod_level.get("runAsNonRoot") is True:
        user["runAsNonRoot"] = True  # the agent image's user is a numeric non-root one
    return user
