"""Preemption notices from nodes: a node that carries a notice taint (operator-wide or one a run
names), goes NotReady or is deleted matters to the runs with a pod on it. A notice becomes the
``trainingrun.dev/preemption-notice`` annotation on each such pod, which the pod's sync sidecar
reads (downward API) and turns into a "save now" request to the trainer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from trainingrun.api import TrainingRunSpec
from trainingrun.contract import ANNOTATION_NOTICE, LABEL_RUN
from trainingrun.decide.classify import node_not_ready, node_notice
from trainingrun.decide.gang import Member

Key = tuple[str, str]  # (namespace, run name)


class PodAnnotator(Protocol):
    """The two calls of ``trainingrun.kube.Kube`` notices need."""

    def run_pods_on_node(self, node: str, label: str) -> list[dict[str, Any]]: ...
    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None: ...


class Notices:
    def __init__(self, api: PodAnnotator, operator_taints: Iterable[str]) -> None:
        self._api = api
        self._operator_taints = tuple(operator_taints)
        # Notice taint keys runs name beyond the operator-wide ones: a node that gets one needs
        # the passes of the runs with a pod on it (each annotates its own pod).
        self._run_taints: dict[Key, frozenset[str]] = {}
        self._lock = threading.Lock()

    def remember(self, key: Key, spec: TrainingRunSpec | None) -> None:
        """The run's own notice taints (None: the run is gone or finished)."""
        own = frozenset(spec.preemption.notice_taints) if spec else frozenset()
        own -= set(self._operator_taints)
        with self._lock:
            if own:
                self._run_taints[key] = own
            else:
                self._run_taints.pop(key, None)

    def node_matters(self, node: Mapping[str, Any] | None) -> bool:
        """The node is gone, NotReady or carries a notice taint (operator-wide or a run's)."""
        with self._lock:
            runs_keys = set().union(*self._run_taints.values())
        return (
            node is None
            or node_not_ready(node)
            or node_notice(node, [*self._operator_taints, *runs_keys]) is not None
        )

    def node_changed(self, node: Mapping[str, Any] | None, name: str) -> list[Key]:
        """Runs with a pod on this node that need a pass: the node is gone, NotReady or noticed.
        Pods on a node with an operator-wide notice taint get the notice annotation at once."""
        if not self.node_matters(node):
            return []
        notice = node_notice(node, self._operator_taints)
        runs = []
        for pod in self._api.run_pods_on_node(name, LABEL_RUN):
            meta = pod["metadata"]
            if notice and ANNOTATION_NOTICE not in (meta.get("annotations") or {}):
                self._api.annotate_pod(meta["namespace"], meta["name"], {ANNOTATION_NOTICE: notice})
            runs.append((meta["namespace"], meta["labels"][LABEL_RUN]))
        return runs

    def pass_on(self, members: Sequence[Member], spec: TrainingRunSpec) -> None:
        """A notice on one pod of the attempt reaches every running pod of it: the pod whose
        node carries one of the run's own notice taints (the node handler annotates pods on a
        node with an operator-wide one at once), and a gang's other pods, so that every rank
        saves at the same step end while all are alive."""
        notice = None
        for m in members:
            annotations = ((m.pod or {}).get("metadata") or {}).get("annotations") or {}
            notice = annotations.get(ANNOTATION_NOTICE) or (
                node_notice(m.node, spec.preemption.notice_taints) if m.pod else None
            )
            if notice:
                break
        if not notice:
            return
        for m in members:
            meta = (m.pod or {}).get("metadata") or {}
            if m.pod is None or ANNOTATION_NOTICE in (meta.get("annotations") or {}):
                continue
            if (m.pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            self._api.annotate_pod(meta["namespace"], meta["name"], {ANNOTATION_NOTICE: notice})
