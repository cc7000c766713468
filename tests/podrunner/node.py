"""The Node the runner plays the kubelet for: registration, a Lease in ``kube-node-lease`` renewed
like the kubelet's, and the node status heartbeat. Heartbeats can be switched off to simulate a
lost node (the node-lifecycle controller then marks it ``Unknown`` after its grace period), and
the node can report ``Ready=False`` itself (as a kubelet with a broken runtime does). Nothing is
sent while the runner's link to the API server is cut (``tests.podrunner.link``)."""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.podrunner.link import Link

log = logging.getLogger("podrunner.node")

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40  # the kubelet's default
LEASE_RENEW_S = 10  # a quarter of the duration, as the kubelet renews
STATUS_REPORT_S = 30
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# Pods land here only when they ask to: a shared control plane has other tests' pods too.
TAINT_KEY = "trainingrun.dev/local-pod-runner"
TAINT = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
TOLERATION = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
KUBELET_VERSION = "v1.34.0-podrunner"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NodeAgent:
    """Registers the node and keeps it (or stops keeping it) Ready."""

    def __init__(
        self,
        api: client.ApiClient,
        name: str,
        capacity: dict[str, str],
        taint: bool = True,
        link: Link | None = None,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.name = name
        self.capacity = capacity
        self.taint = taint
        self.link = link or Link()
        self.heartbeats = True
        self.ready = True
        self.not_ready_message = ""
        self._ready_since = now()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # -- registration --------------------------------------------------------------------------

    def register(self) -> None:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "type": "local",
        }
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels},
            "spec": {"taints": [TAINT] if self.taint else []},
        }
        try:
            existing = self.core.read_node(self.name)
        except ApiException as e:
            if e.status != 404:
                raise
            existing = None
        if existing is None:
            self.core.create_node(body)
        else:
            if KWOK_ANNOTATION in (existing.metadata.annotations or {}):
                raise SystemExit(
                    f"node {self.name} is a kwok node ({KWOK_ANNOTATION} annotation); "
                    "pick another --node name"
                )
            self.core.patch_node(self.name, {"metadata": {"labels": labels}})
        self.post_status()
        self.renew_lease()

    def _conditions(self) -> list[dict[str, Any]]:
        stamp = now()
        ready = {
            "type": "Ready",
            "status": "True" if self.ready else "False",
            "reason": "KubeletReady" if self.ready else "KubeletNotReady",
            "message": "kubelet is posting ready status" if self.ready else self.not_ready_message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": self._ready_since,
        }
        pressure = [
            {
                "type": kind,
                "status": "False",
                "reason": f"KubeletHasSufficient{what}",
                "message": f"kubelet has sufficient {what.lower()} available",
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": self._ready_since,
            }
            for kind, what in (
                ("MemoryPressure", "Memory"),
                ("DiskPressure", "Disk"),
                ("PIDPressure", "PID"),
            )
        ]
        return [ready, *pressure]

    def post_status(self) -> None:
        body = {
            "status": {
                "capacity": self.capacity,
                "allocatable": self.capacity,
                "conditions": self._conditions(),
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": self.name},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
                "nodeInfo": {
                    "architecture": os.uname().machine,
                    "operatingSystem": "linux",
                    "kernelVersion": os.uname().release,
                    "osImage": "local pod runner",
                    "kubeletVersion": KUBELET_VERSION,
                    "kubeProxyVersion": "",
                    "containerRuntimeVersion": "local://processes",
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": "",
                },
            }
        }
        self.core.patch_node_status(self.name, body)

    def renew_lease(self) -> None:
        spec = {
            "holderIdentity": self.name,
            "leaseDurationSeconds": LEASE_DURATION_S,
            "renewTime": micro_now(),
        }
        try:
            self.coordination.patch_namespaced_lease(self.name, LEASE_NAMESPACE, {"spec": spec})
        except ApiException as e:
            if e.status != 404:
                raise
            node = self.core.read_node(self.name)
            owner = {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.name,
                "uid": node.metadata.uid,
            }
            self.coordination.create_namespaced_lease(
                LEASE_NAMESPACE,
                {
                    "metadata": {"name": self.name, "ownerReferences": [owner]},
                    "spec": spec,
                },
            )

    # -- heartbeat -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        last_status = 0.0
        while not self._stopped.is_set():
            if self.heartbeats and self.link.up:
                try:
                    self.renew_lease()
                    if time.monotonic() - last_status >= STATUS_REPORT_S:
                        self.post_status()
                        last_status = time.monotonic()
                except Exception as e:  # the API may be briefly away; the next beat retries
                    log.warning("heartbeat of node %s failed: %s", self.name, e)
            self._wake.wait(LEASE_RENEW_S)
            if self._wake.is_set():
                self._wake.clear()
                last_status = 0.0  # a state change is posted at once

    def stop_heartbeats(self) -> None:
        log.warning("node %s: heartbeats stopped (simulated node loss)", self.name)
        self.heartbeats = False

    def resume(self) -> None:
        log.warning("node %s: heartbeats resumed, reporting Ready", self.name)
        if not self.ready:
            self._ready_since = now()
        self.ready = True
        self.heartbeats = True
        self._wake.set()

    def reconnected(self) -> None:
        """The link is back: beat at once. The node-lifecycle controller has likely marked the
        node ``Unknown`` meanwhile, so Ready=True is a transition again."""
        if self.ready:
            self._ready_since = now()
        self._wake.set()

    def report_not_ready(self, message: str = "container runtime is down (simulated)") -> None:
        log.warning("node %s: reporting Ready=False: %s", self.name, message)
        if self.ready:
            self._ready_since = now()
        self.ready = False
        self.not_ready_message = message
        self._wake.set()

    def stop(self, message: str) -> None:
        """Ends the heartbeat; posts ``Ready=False`` with ``message`` (kubelet's shutdown)."""
        self._stopped.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=15)
        if self.heartbeats and self.link.up:
            self.report_not_ready(message)
            try:
                self.post_status()
            except Exception as e:
                log.warning("final status of node %s not posted: %s", self.name, e)
