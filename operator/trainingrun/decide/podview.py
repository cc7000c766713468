"""What a pod and its node say, read from their API JSON (plain dicts, camelCase): instants,
container states, conditions, the node's notice and readiness, and messages made safe to show.

Every message taken from a container or pod status (a termination message, a condition's or
the pod's message) is ``bounded``: it goes into ``status.message`` and Events, and the
container writing it may print anything (a whole traceback, terminal escapes).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from trainingrun.contract import (
    ANNOTATION_RESUME_STEP,
)

# The longest message taken from a container or pod status, marker included: enough for an
# error and its cause, short enough for a status field and an Event.
MESSAGE_MAX = 1024


# What becomes a space in such a message: control characters (newlines, tabs, terminal escapes,
# C1), invisible format characters (bidirectional overrides reorder what a reader sees), lone
# surrogates, and line and paragraph separators.
UNPRINTED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def bounded(text: object, limit: int = MESSAGE_MAX) -> str:
    """``text`` fit for a status message: every character of UNPRINTED_CATEGORIES a space, no
    space at either end, and at most ``limit`` characters, the last ones a marker that counts
    what was cut."""
    clean = "".join(
        " " if unicodedata.category(ch) in UNPRINTED_CATEGORIES else ch for ch in str(text)
    ).strip()
    if len(clean) <= limit:
        return clean
    keep = limit
    for _ in range(4):  # the marker's length depends on the count it shows: three rounds do
        marker = f" [... {len(clean) - keep} more characters]"
        if keep + len(marker) <= limit:
            return clean[:keep] + marker
        keep = max(limit - len(marker), 0)
    return clean[:limit]  # a limit too small for any marker


def pod_message(obj: Mapping[str, Any], default: str = "") -> str:
    """The ``message`` of a status, condition or container state, bounded, or ``default``."""
    return bounded(obj.get("message") or "") or default


def conditions_of(obj: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    return list(((obj or {}).get("status") or {}).get("conditions") or [])


def condition_of(obj: Mapping[str, Any] | None, ctype: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions_of(obj) if c.get("type") == ctype), None)


def statuses_of(pod: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    return list((pod.get("status") or {}).get(key) or [])


def parse_instant(value: object) -> datetime | None:
    """An RFC 3339 time as the API server (``2025-01-01T12:00:00Z``) or the bucket manifest
    (with microseconds) writes it; None when absent or malformed."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def container_status(pod: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """The status of the pod's container (or init container) ``name``, None before it has one."""
    for key in ("containerStatuses", "initContainerStatuses"):
        for s in statuses_of(pod, key):
            if s.get("name") == name:
                return s
    return None


def operators_restore(pod: Mapping[str, Any]) -> bool:
    """The pod's ``RESTORE_CONTAINER`` is the restore the operator added (module docstring):
    the pod carries the operator's resume annotation."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(ANNOTATION_RESUME_STEP, "")).isdigit()


def terminated_state(status: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if not status:
        return None
    term = (status.get("state") or {}).get("terminated")
    return term if isinstance(term, Mapping) else None


def stops_by_itself(
    pod: Mapping[str, Any], node: Mapping[str, Any] | None, node_deleted: bool
) -> bool:
    """Every main container has terminated and a Ready node runs the pod: its kubelet stops the
    sidecar and writes the final phase, so the pod (and its logs) can be left alone."""
    mains = statuses_of(pod, "containerStatuses")
    return (
        bool(mains) and all(terminated_state(s) for s in mains) and node_alive(node, node_deleted)
    )


def node_notice(node: Mapping[str, Any] | None, notice_taints: Iterable[str]) -> str | None:
    """The first notice taint key on the node, if any."""
    keys = set(notice_taints)
    for taint in ((node or {}).get("spec") or {}).get("taints") or []:
        if taint.get("key") in keys:
            return str(taint["key"])
    return None


def node_not_ready(node: Mapping[str, Any] | None) -> bool:
    ready = condition_of(node, "Ready")
    return ready is not None and ready.get("status") != "True"


def node_alive(node: Mapping[str, Any] | None, node_deleted: bool) -> bool:
    """The node is known, present and Ready: its kubelet will finish stopping the pod."""
    return node is not None and not node_deleted and not node_not_ready(node)


def after_scheduling(pod: Mapping[str, Any], seconds: int) -> datetime | None:
    """``seconds`` after the pod was scheduled (``scheduled_at``); None when unknown."""
    since = scheduled_at(pod)
    return since + timedelta(seconds=seconds) if since is not None else None


def scheduled_at(pod: Mapping[str, Any]) -> datetime | None:
    """When the pod was bound to its node (PodScheduled), else when it was created."""
    scheduled = condition_of(pod, "PodScheduled")
    for value in (
        (scheduled or {}).get("lastTransitionTime")
        if (scheduled or {}).get("status") == "True"
        else None,
        (pod.get("metadata") or {}).get("creationTimestamp"),
    ):
        at = parse_instant(value)
        if at is not None:
            return at
    return None
