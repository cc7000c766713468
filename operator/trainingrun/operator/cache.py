"""What the operator knows of the cluster without asking: the newest state seen of each run, pod
and node, from watch events and from the answers to its own writes (like an informer's store).

``Cache`` keeps one kind of object; ``slim_*`` keep of each object only what a pass reads (a pod's
container specs and a node's images are most of their size). ``ClusterView`` reads through the
caches to the API for an object they have never heard of, and answers which of the operator's
pods are on a node from the pod cache (so the operator needs no list of pods across namespaces).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from trainingrun.contract import LABEL_ATTEMPT, LABEL_RUN


def _rv(obj: Mapping[str, Any]) -> int:
    value = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(value) if value.isdigit() else -1


def _pick(obj: Mapping[str, Any] | None, keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: obj[k] for k in keys if obj and k in obj}


_POD_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",  # a gang's pod not scheduled within its start timeout
    "labels",
    "annotations",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",  # 0 in a removed pod's last state (classify reads it)
    "ownerReferences",  # whose pod it is: a pod of the same name may be another run's
    "finalizers",  # what holds an old attempt's pod that does not go (OldPodLingers)
)


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a pod a pass reads (classify, resume step, node, attempt label, the grace
    period an old attempt's pod is given to go): the spec of its containers is most of a pod's
    size and no pass looks at it again."""
    return {
        "metadata": _pick(pod.get("metadata"), _POD_METADATA),
        "spec": _pick(pod.get("spec"), ("nodeName", "terminationGracePeriodSeconds")),
        "status": pod.get("status") or {},
    }


Index = Callable[[Any, Mapping[str, Any]], Any]


def run_of_pod(key: Any, pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, run) of a pod by its run label: the pod cache's index by run."""
    run = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_RUN)
    return (key[0], str(run)) if run else None


def node_of_pod(key: Any, pod: Mapping[str, Any]) -> str | None:
    """The node of a scheduled pod with the run label: the pod cache's index by node, which tells
    the node handler the run pods on a node without a list of pods across namespaces."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    return str(node) if node and LABEL_RUN in labels else None


def slim_node(node: Mapping[str, Any]) -> dict[str, Any]:
    """What classify() reads of a node: Ready and the taints (a node's images and addresses are
    most of its size)."""
    status = node.get("status") or {}
    return {
        "metadata": _pick(node.get("metadata"), ("name", "resourceVersion")),
        "spec": _pick(node.get("spec"), ("taints",)),
        "status": _pick(status, ("conditions",)),
    }


def slim_run(run: Mapping[str, Any]) -> dict[str, Any]:
    """The run without managedFields and kubectl's copy of the last applied spec."""
    meta = dict(run.get("metadata") or {})
    meta.pop("managedFields", None)
    annotations = meta.get("annotations")
    if annotations and "kubectl.kubernetes.io/last-applied-configuration" in annotations:
        meta["annotations"] = {
            k: v
            for k, v in annotations.items()
            if k != "kubectl.kubernetes.io/last-applied-configuration"
        }
    return {**run, "metadata": meta}


class Cache:
    """The newest state seen of each object, from watch events and from the answers to the
    operator's own writes (like an informer's store): a pass reads it instead of the API.
    An older resourceVersion never replaces a newer one. ``slim`` keeps of each object only
    what passes read; each of ``indexes`` (by name) files the live objects under a value
    (None: under none), which ``indexed(name, value)`` lists, like an informer's indexers."""

    def __init__(
        self,
        slim: Callable[[Mapping[str, Any]], dict[str, Any]],
        max_gone: int = 10000,
        indexes: Mapping[str, Index] | None = None,
    ) -> None:
        self._slim = slim
        self._lock = threading.Lock()
        self._live: dict[Any, dict[str, Any]] = {}
        self._gone: OrderedDict[Any, dict[str, Any]] = OrderedDict()
        self._max_gone = max_gone
        self._index_of = dict(indexes or {})
        self._index: dict[str, dict[Any, set[Any]]] = {name: {} for name in self._index_of}

    def _unindex(self, key: Any, obj: Mapping[str, Any] | None) -> None:
        if obj is None:
            return
        for name, index_of in self._index_of.items():
            value, index = index_of(key, obj), self._index[name]
            keys = index.get(value) if value is not None else None
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del index[value]

    def _file(self, key: Any, obj: Mapping[str, Any]) -> None:
        for name, index_of in self._index_of.items():
            value = index_of(key, obj)
            if value is not None:
                self._index[name].setdefault(value, set()).add(key)

    def put(self, key: Any, obj: Mapping[str, Any]) -> None:
        slim = self._slim(obj)
        with self._lock:
            old = self._live.get(key)
            if old is None or _rv(slim) >= _rv(old):
                self._unindex(key, old)
                self._live[key] = slim
                self._file(key, slim)
            self._gone.pop(key, None)

    def gone(self, key: Any, last: Mapping[str, Any] | None) -> None:
        """The object was deleted; ``last`` is its final state."""
        slim = self._slim(last) if last else {}
        with self._lock:
            self._unindex(key, self._live.pop(key, None))
            self._gone[key] = slim
            while len(self._gone) > self._max_gone:
                self._gone.popitem(last=False)

    def get(self, key: Any) -> tuple[dict[str, Any] | None, bool]:
        """(object, known): known is False when the cache has never heard of the key."""
        with self._lock:
            if key in self._live:
                return self._live[key], True
            if key in self._gone:
                return None, True
            return None, False

    def seen(self, key: Any, obj: Mapping[str, Any]) -> bool:
        """True when the cache already holds this very version of the object."""
        with self._lock:
            old = self._live.get(key)
            return old is not None and _rv(old) == _rv(obj) >= 0

    def keys(self) -> list[Any]:
        with self._lock:
            return list(self._live)

    def values(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._live.values())

    def last(self, key: Any) -> dict[str, Any] | None:
        with self._lock:
            return self._gone.get(key)

    def indexed(self, index: str, value: Any) -> list[dict[str, Any]]:
        """The live objects the index named ``index`` files under ``value``."""
        with self._lock:
            return [self._live[key] for key in self._index[index].get(value, ())]


class ObjectReader(Protocol):
    """The reads ``ClusterView`` falls back to (``trainingrun.operator.kube.Kube`` has them)."""

    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def get_node(self, name: str) -> dict[str, Any] | None: ...


class ClusterView:
    """The caches of runs (by (namespace, name)), pods (by (namespace, name)) and nodes (by
    name), read through to the API for an object they have never heard of."""

    def __init__(self, api: ObjectReader) -> None:
        self._api = api
        self.runs = Cache(slim_run)
        self.pods = Cache(slim_pod, indexes={"run": run_of_pod, "node": node_of_pod})
        self.nodes = Cache(slim_node)

    def run(self, namespace: str, name: str) -> dict[str, Any] | None:
        run, known = self.runs.get((namespace, name))
        if not known:
            run = self._api.get_run(namespace, name)
            if run is not None:
                self.runs.put((namespace, name), run)
        return run

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod, or for a deleted pod its last state when that state says it ended (an
        evicted pod is gone before a pass can read why)."""
        key = (namespace, name)
        pod, known = self.pods.get(key)
        if pod is not None:
            return pod
        if known:
            return self.pods.last(key)
        pod = self._api.get_pod(namespace, name)
        if pod is not None:
            self.pods.put(key, pod)
        return pod

    def run_pods(self, namespace: str, run: str) -> list[dict[str, Any]]:
        """The live pods with the run's label, of any attempt and any owner, as cached (a watch
        lists every such pod at start)."""
        return self.pods.indexed("run", (namespace, run))

    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        """The live pods with the run label scheduled on ``node``, in every watched namespace,
        as cached: the watch of run pods sees each of them (it lists them all at start), so the
        question needs no list of pods by node name across namespaces."""
        return self.pods.indexed("node", node)

    def pod_gone(self, namespace: str, name: str) -> None:
        """The API server says the pod is gone (a DELETE answered 404) before the watch did;
        its last state is the one cached."""
        key = (namespace, name)
        self.pods.gone(key, self.pods.get(key)[0])

    def node(self, name: str) -> tuple[dict[str, Any] | None, bool]:
        """(node, deleted)."""
        node, known = self.nodes.get(name)
        if known:
            return node, node is None
        node = self._api.get_node(name)
        if node is not None:
            self.nodes.put(name, node)
        return node, node is None

    def phases(self) -> list[str]:
        """The phase of every run in the cache (scraped by the runs-by-phase gauge)."""
        runs = self.runs.values()
        return [str((run.get("status") or {}).get("phase") or "Pending") for run in runs]

    def is_old_attempt(self, namespace: str, run: str, pod: Mapping[str, Any]) -> bool:
        """A pod of an attempt before the run's current one (by the cached status)."""
        cached, _ = self.runs.get((namespace, run))
        current = int(((cached or {}).get("status") or {}).get("attempt") or 0)
        label = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ATTEMPT, "")
        return label.isdigit() and current > 0 and int(label) < current
