"""The runner process: registers the node, watches the pods bound to it and gives each one a
``PodWorker``; on SIGTERM it stops every pod as a graceful node shutdown does and exits. While
its link to the API server is cut (a simulated partition) it drops whatever the pod watch still
delivers; once healed it lists its pods again, so pods deleted meanwhile are stopped then. Pods
with a subdomain get networks of their own (``tests.podrunner.podnet``), shared with the other
runners of the environment ``env_name``."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config

from tests.podrunner.link import HEAL_SIGNAL, PARTITION_SIGNAL, Link, list_and_watch
from tests.podrunner.node import NodeAgent
from tests.podrunner.peers import PeerDirectory
from tests.podrunner.pod import Context, PodWorker
from tests.podrunner.podnet import Networks

log = logging.getLogger("podrunner")

WATCH_TIMEOUT_S = 30
RETRY_S = 1.0


def api_client(kubeconfig: str) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = 32  # one worker thread per pod, plus the watch and heartbeat
    return client.ApiClient(cfg)


class Runner:
    def __init__(
        self,
        kubeconfig: str,
        node: str,
        state_dir: Path,
        capacity: dict[str, str],
        taint: bool = True,
        shutdown_grace_s: float = 30,
        env_name: str | None = None,
    ) -> None:
        self.api = api_client(kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.link = Link()
        self.node = NodeAgent(self.api, node, capacity, taint=taint, link=self.link)
        state_dir.mkdir(parents=True, exist_ok=True)
        networks = Networks(env_name, PeerDirectory(self.core, self.link)) if env_name else None
        self.ctx = Context(
            core=self.core,
            node=node,
            state_dir=state_dir,
            shutdown_grace_s=shutdown_grace_s,
            link=self.link,
            networks=networks,
        )
        self.workers: dict[str, PodWorker] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    # -- pods ----------------------------------------------------------------------------------

    def _dispatch(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        with self._lock:
            worker = self.workers.get(uid)
            if kind == "DELETED":
                if worker:
                    worker.mark_gone()
                return
            if worker is None:
                if self._stop.is_set():
                    return
                worker = PodWorker(self.ctx, pod)
                self.workers[uid] = worker
                worker.thread.start()
                return
        worker.update(pod)

    def _selector(self) -> str:
        return f"spec.nodeName={self.node.name}"

    def _relist(self) -> str:
        pods = self.api.sanitize_for_serialization(
            self.core.list_pod_for_all_namespaces(field_selector=self._selector())
        )
        seen = set()
        for pod in pods["items"]:
            seen.add(pod["metadata"]["uid"])
            self._dispatch("MODIFIED", pod)
        with self._lock:
            vanished = [w for uid, w in self.workers.items() if uid not in seen and not w.gone]
        for w in vanished:
            w.mark_gone()
        return str(pods["metadata"]["resourceVersion"])

    def _watch_pods(self) -> None:
        list_and_watch(
            self.link,
            self._stop,
            self._relist,
            self.core.list_pod_for_all_namespaces,
            self._dispatch,
            "pod",
            WATCH_TIMEOUT_S,
            RETRY_S,
            field_selector=self._selector(),
        )

    # -- the process ---------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def partition(self) -> None:
        self.link.cut()

    def heal(self) -> None:
        self.link.heal()
        self.node.reconnected()

    def install_signals(self) -> None:
        """SIGTERM/SIGINT stop; SIGUSR1 stops heartbeats (node lost), SIGUSR2 resumes them
        (Ready), SIGHUP reports Ready=False while heartbeats go on; PARTITION_SIGNAL cuts the
        link to the API server, HEAL_SIGNAL restores it."""
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        signal.signal(signal.SIGINT, lambda *_: self.request_stop())
        signal.signal(signal.SIGUSR1, lambda *_: self.node.stop_heartbeats())
        signal.signal(signal.SIGUSR2, lambda *_: self.node.resume())
        signal.signal(signal.SIGHUP, lambda *_: self.node.report_not_ready())
        signal.signal(PARTITION_SIGNAL, lambda *_: self.partition())
        signal.signal(HEAL_SIGNAL, lambda *_: self.heal())

    def run(self) -> None:
        if self.ctx.networks:
            self.ctx.networks.reclaim()  # what runners killed with SIGKILL left
        self.node.register()
        self.node.start()
        threading.Thread(target=self._watch_pods, name="pod-watch", daemon=True).start()
        log.info("node %s registered; state in %s", self.node.name, self.ctx.state_dir)
        while not self._stop.wait(1.0):
            pass
        self.shutdown()

    def shutdown(self) -> None:
        """Stops every pod (graceful node shutdown), reports the node not ready, returns."""
        log.info("shutting down: stopping %d pod(s)", len(self.workers))
        with self._lock:
            workers = list(self.workers.values())
        for w in workers:
            w.request_shutdown()
        deadline = time.monotonic() + self.ctx.shutdown_grace_s + 15
        for w in workers:
            w.thread.join(timeout=max(0.1, deadline - time.monotonic()))
        stuck = [f"{w.namespace}/{w.name}" for w in workers if w.thread.is_alive()]
        if stuck:
            log.error("pods still stopping at exit (their processes die with us): %s", stuck)
        self.node.stop("node is shutting down")
        log.info("stopped")
