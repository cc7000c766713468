"""Preemption notices from nodes: a node that carries a notice taint (operator-wide or one a run
names), goes NotReady or is deleted matters to the runs with a pod on it. A notice becomes the
``trainingrun.dev/preemption-notice`` annotation on each such pod, which the pod's sync sidecar
reads (downward API) and turns into a "save now" request to the trainer.

The pods on a node are the operator's own, from its pod cache (``ClusterView.pods_on_node``):
no list of pods across namespaces. A namespace that refuses the annotation (403: no Role there
in namespaced mode, or an admission policy) is logged once and skipped; the others go on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from trainingrun.api import TrainingRunSpec
from trainingrun.contract import ANNOTATION_NOTICE, LABEL_RUN
from trainingrun.decide.podview import node_not_ready, node_notice
from trainingrun.operator.kube import Forbidden

log = logging.getLogger("trainingrun.operator")

Key = tuple[str, str]  # (namespace, run name)


class PodAnnotator(Protocol):
    """The call of ``trainingrun.operator.kube.Kube`` notices need (``Forbidden`` on 403)."""

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None: ...


class Notices:
    def __init__(self, api: PodAnnotator, operator_taints: Iterable[str]) -> None:
        self._api = api
        self._operator_taints = tuple(operator_taints)
        # Notice taint keys runs name beyond the operator-wide ones: a node that gets one needs
        # the passes of the runs with a pod on it (each annotates its own pod).
        self._run_taints: dict[Key, frozenset[str]] = {}
        # Namespaces whose last answer to an annotation was 403: logged once, not at every
        # event of every node, until one accepts an annotation again.
        self._refused: set[str] = set()
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

    def node_changed(
        self, node: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]
    ) -> list[Key]:
        """Runs with a pod on this node (``pods``: the run pods on it, as cached) that need a
        pass: the node is gone, NotReady or noticed. Pods on a node with an operator-wide notice
        taint get the notice annotation at once; a namespace that refuses it (403) is skipped,
        and its runs still get their pass."""
        if not self.node_matters(node):
            return []
        notice = node_notice(node, self._operator_taints)
        node_name = str(((node or {}).get("metadata") or {}).get("name"))
        runs, refused = [], set[str]()
        for pod in pods:
            meta = pod["metadata"]
            namespace = meta["namespace"]
            runs.append((namespace, meta["labels"][LABEL_RUN]))
            noticed = ANNOTATION_NOTICE in (meta.get("annotations") or {})
            if not notice or noticed or namespace in refused:
                continue
            if not self._annotate(namespace, meta["name"], notice, node_name):
                refused.add(namespace)  # its other pods would be refused as well
        return runs

    def _annotate(self, namespace: str, name: str, notice: str, node: str) -> bool:
        """The notice annotation on one pod; False when its namespace refuses it (403)."""
        try:
            self._api.annotate_pod(namespace, name, {ANNOTATION_NOTICE: notice})
        except Forbidden as e:
            with self._lock:
                first = namespace not in self._refused
                self._refused.add(namespace)
            log.log(
                logging.WARNING if first else logging.DEBUG,
                "node %s: namespace %s refuses the notice annotation (%s); its pods go without "
                "it, the other namespaces go on",
                node,
                namespace,
                e,
            )
            return False
        with self._lock:
            self._refused.discard(namespace)
        return True
