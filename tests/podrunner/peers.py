"""Which pods of a namespace have which address, for the hosts files of the pods with a network
of their own (``tests.podrunner.podnet``): one list-and-watch of the namespace's pods (those of
every node, not only this runner's) while a pod of this runner there needs it. Listeners hear of
each change at once, on the watch's thread, so a peer that gets its address after this pod
started (rank 0 may come up after rank 1) is resolvable within a moment.

While the runner's link to the API server is cut (a simulated partition) nothing is called and
the last known addresses stay; once healed the namespace is listed again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client

from tests.podrunner.hosts import Peer, peer_of
from tests.podrunner.link import Link, list_and_watch

log = logging.getLogger("podrunner.peers")

Listener = Callable[[list[Peer]], None]
WATCH_TIMEOUT_S = 10  # how long a watch no one needs any more may linger
RETRY_S = 1.0


class NamespaceWatch:
    """The peers of one namespace, kept current by a watch on a thread of its own."""

    def __init__(self, core: client.CoreV1Api, link: Link, namespace: str) -> None:
        self.core, self.link, self.namespace = core, link, namespace
        self._pods: dict[str, Peer] = {}  # uid -> peer
        self._listeners: list[Listener] = []
        self._told: list[Peer] = []
        self._lock = threading.Lock()
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"peers {namespace}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, listener: Listener) -> None:
        """Calls ``listener`` with what is known now, then after every change. Listeners are
        called under the lock, so none ever hears of an older state after a newer one."""
        with self._lock:
            self._listeners.append(listener)
            listener(sorted(self._pods.values()))

    def remove(self, listener: Listener) -> int:
        """Removes ``listener``; returns how many are left."""
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)
            return len(self._listeners)

    def _changed_locked(self) -> None:
        peers = sorted(self._pods.values())
        if peers != self._told:
            self._told = peers
            for listener in self._listeners:
                listener(peers)

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        peer = None if kind == "DELETED" else peer_of(pod)
        with self._lock:
            if peer:
                self._pods[uid] = peer
            else:
                self._pods.pop(uid, None)
            self._changed_locked()

    def _relist(self) -> str:
        pods = self.core.api_client.sanitize_for_serialization(
            self.core.list_namespaced_pod(self.namespace)
        )
        found = {}
        for pod in pods["items"]:
            peer = peer_of(pod)
            if peer:
                found[pod["metadata"]["uid"]] = peer
        with self._lock:
            self._pods = found
            self._changed_locked()
        return str(pods["metadata"]["resourceVersion"])

    def _run(self) -> None:
        list_and_watch(
            self.link,
            self.stopped,
            self._relist,
            self.core.list_namespaced_pod,
            self._apply,
            f"peer (namespace {self.namespace})",
            WATCH_TIMEOUT_S,
            RETRY_S,
            namespace=self.namespace,
        )


class PeerDirectory:
    """The runner's namespace watches, started with the first listener of a namespace and
    stopped with its last."""

    def __init__(self, core: client.CoreV1Api, link: Link) -> None:
        self.core, self.link = core, link
        self._watches: dict[str, NamespaceWatch] = {}
        self._lock = threading.Lock()

    def subscribe(self, namespace: str, listener: Listener) -> Callable[[], None]:
        """Calls ``listener`` with the namespace's peers now and after every change; returns
        the call that stops it."""
        with self._lock:
            ns_watch = self._watches.get(namespace)
            if ns_watch is None:
                ns_watch = NamespaceWatch(self.core, self.link, namespace)
                self._watches[namespace] = ns_watch
                ns_watch.start()
            ns_watch.add(listener)

        def unsubscribe() -> None:
            with self._lock:
                if ns_watch.remove(listener) == 0 and self._watches.get(namespace) is ns_watch:
                    ns_watch.stopped.set()
                    del self._watches[namespace]

        return unsubscribe
