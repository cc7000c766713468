"""How the operator's own containers in a pod (the restore and the sync sidecar) run, as plain
dicts for the pod builder (``decide.pod``): their securityContext, hardened, with the trainer's
user when the template names a non-root one, and where they serve their metrics.

The sidecar must read every file the trainer writes, and the trainer must read, replace and
delete what the restore wrote. Trainers often write private files (safetensors writes 0600), so
the agents run as the trainer's user when the template names it. When it does not, or names
root, the trainer may be root or its image's ``USER``, which the operator cannot see: the
agents then run as uid 0 with one capability, ``DAC_OVERRIDE`` (read the trainer's files
whoever owns them; Pod Security ``baseline`` allows it), every other one dropped, and the
restore leaves what it writes open to every user of the pod (``checkpoint.local.share``).
"""

from __future__ import annotations

from typing import Any

from trainingrun import contract as c

LOOPBACK = "127.0.0.1"
# The agent image's own user and group (images/agent/Dockerfile: USER 65532:65532): what the
# agents run as when the template would make them root.
AGENT_UID = 65532
AGENT_GID = 65532


# The one capability the agents keep when they run as root: file permission checks bypassed,
# so the sidecar reads what a trainer of any user wrote private. Pod Security ``baseline``
# allows it (``DAC_READ_SEARCH``, read-only, it does not).
ROOT_CAPABILITY = "DAC_OVERRIDE"


def security_context(user: dict[str, Any]) -> dict[str, Any]:
    """An agent's securityContext: no privilege escalation, every capability dropped, a
    read-only root, the container runtime's default seccomp profile (what Pod Security
    ``restricted`` asks), and ``user`` (``agent_user``); as root, ``ROOT_CAPABILITY`` only."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if user.get("runAsUser") == 0:
        capabilities["add"] = [ROOT_CAPABILITY]
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": capabilities,
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


def _non_root(own: dict[str, Any], pod_level: dict[str, Any]) -> bool:
    """Whether the trainer must run as a non-root user: its own ``runAsNonRoot``, else the
    pod's."""
    value = own.get("runAsNonRoot")
    if value is None:
        value = pod_level.get("runAsNonRoot")
    return value is True


def agent_user(pod_spec: dict[str, Any], trainer: dict[str, Any] | None) -> dict[str, Any]:
    """The user fields of the agents' securityContext:

    - the template names the trainer's non-root uid (``runAsUser`` of the trainer container,
      else of the pod): the agents run as it, with the matching ``runAsGroup`` (never gid 0:
      their own ``AGENT_GID`` instead), and ``runAsNonRoot``;
    - it names no uid but asks for a non-root one (``runAsNonRoot: true``): the trainer runs as
      its image's user, unseen; the agents as their image's own, ``AGENT_UID``. A file the
      trainer keeps private cannot be read then: the sidecar says so, naming the fix (a
      ``runAsUser``);
    - it names root, or nothing: the agents run as root (``security_context`` then keeps only
      ``ROOT_CAPABILITY``) and read what the trainer writes, whichever user it runs as."""
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
    if uid is None and _non_root(own, pod_level):
        user = {"runAsNonRoot": True}  # the agent image's user is a numeric non-root one
        if _id("runAsGroup", {}, pod_level) == 0:
            user["runAsGroup"] = AGENT_GID
        return user
    return {"runAsUser": 0, "runAsNonRoot": False}
