"""The faults, injected at random and overlapping: each kind is a function of the fleet and a
random source, run on a thread of its own, bounded in time, and its outcome counted by kind
(injected, or missed with why: the API server down, the pod already gone)."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from tests.chaos import processes
from tests.chaos.observe import Observer
from tests.integration.support import OperatorProcess, container_status, evict, mark_unknown
from tests.localenv import KWOK_NODE_ANNOTATION, LocalEnv
from tests.podrunner import RunnerHandle
from trainingrun.contract import SYNC_CONTAINER, TRAINER_CONTAINER

NOTICE_TAINT = "aws-node-termination-handler/spot-itn"
KILLED = {"terminated": {"exitCode": 137, "reason": "Error"}}
SEAWEEDFS_DOWN_S = 60.0
# Each kind of fault: its weight in the random draw (after one of each), and the Injector's
# method that injects it.
KINDS = {
    "eviction": (5.0, "evict"),
    "trainer SIGKILL": (5.0, "kill_trainer"),
    "sidecar SIGKILL mid-upload": (2.0, "kill_sidecar"),
    "notice taint": (2.0, "notice_taint"),
    "node NotReady": (2.0, "not_ready"),
    "node deleted": (1.5, "delete_node"),
    "operator SIGKILL (leader)": (1.0, "kill_leader"),
    "kube-apiserver restart": (0.7, "restart_apiserver"),
    "SeaweedFS stopped 60 s": (0.5, "stop_seaweedfs"),
}


def brief(message: str, head: int = 120, tail: int = 400) -> str:
    """A missed fault's error for the fault log: its start, and its end, where a process's log
    tail (the reason it exited) is."""
    if len(message) <= head + tail:
        return message
    return f"{message[:head]} [...] {message[-tail:]}"


@dataclass
class Fleet:
    """What the faults act on. ``replicas`` changes as operators are killed and replaced."""

    env: LocalEnv
    core: client.CoreV1Api
    ns: str
    lease: str
    kwok_nodes: dict[str, dict[str, str]]  # name -> labels, to create it again
    runners: list[RunnerHandle]
    real_runs: set[str]
    replicas: list[OperatorProcess]
    new_replica: Callable[[], OperatorProcess]
    observer: Observer


@dataclass
class Injector:
    fleet: Fleet
    rng: random.Random
    window_s: float
    kill_until: float = 0.6  # operator SIGKILLs only in this first fraction of the window
    real_share: float = 0.3  # of the pod faults, the share aimed at the real trainers
    injected: Counter[str] = field(default_factory=Counter)
    missed: Counter[str] = field(default_factory=Counter)
    in_flight: Counter[str] = field(default_factory=Counter)
    # (at, kind, outcome, target): the target a pod (and its node) or a node
    log: list[tuple[float, str, str, str]] = field(default_factory=list)
    target: threading.local = field(default_factory=threading.local)  # each fault thread's
    busy_nodes: set[str] = field(default_factory=set)
    s3_down: bool = False
    last: dict[str, float] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # -- the loop ---------------------------------------------------------------------------

    def run(self, mean_gap_s: float) -> None:
        """Picks and starts faults until the window ends; then waits for those under way."""
        start = time.monotonic()
        end = start + self.window_s
        names = list(KINDS)
        weights = [weight for weight, _ in KINDS.values()]
        first = list(names)  # one of each kind first, in random order
        self.rng.shuffle(first)
        while time.monotonic() < end:
            elapsed = time.monotonic() - start
            with self.lock:  # a kind that has not landed yet (no target then) is tried again
                owed = [n for n in names if not self.injected[n] and n not in self.in_flight]
            if first:
                name = first.pop()
            elif owed and self.rng.random() < 0.5:
                name = self.rng.choice(owed)
            else:
                name = self.rng.choices(names, weights)[0]
            fault: Callable[[float], bool] = getattr(self, KINDS[name][1])
            with self.lock:
                self.in_flight[name] += 1
            t = threading.Thread(target=self._one, args=(name, fault, elapsed), daemon=True)
            t.start()
            self.threads.append(t)
            time.sleep(self.rng.expovariate(1 / mean_gap_s))
        for t in self.threads:
            t.join(timeout=max(1.0, SEAWEEDFS_DOWN_S + 120 - (time.monotonic() - end)))

    def _one(self, name: str, fault: Callable[[float], bool], elapsed: float) -> None:
        at = round(self.fleet.observer.ledger.now(), 1)
        self.target.name = ""
        try:
            done = fault(elapsed)
            outcome = "injected" if done else "skipped"
        except Exception as e:  # the API server down, a pod gone meanwhile: counted, not fatal
            done, outcome = False, f"missed: {type(e).__name__}: {brief(str(e))}"
        with self.lock:
            (self.injected if done else self.missed)[name] += 1
            self.in_flight[name] -= 1
            if not self.in_flight[name]:
                del self.in_flight[name]
            self.log.append((at, name, outcome, self.target.name))

    def _gate(self, kind: str, every_s: float) -> bool:
        """True (and the time noted) when ``kind`` has not happened in the last ``every_s``."""
        with self.lock:
            now = time.monotonic()
            if now - self.last.get(kind, -1e9) < every_s:
                return False
            self.last[kind] = now
            return True

    # -- targets ----------------------------------------------------------------------------

    def _victim(self, real: bool | None = None) -> tuple[str, str] | None:
        """(pod, node) of a live attempt pod; ``real_share`` of the time one of the real
        trainers'."""
        led = self.fleet.observer.ledger
        want_real = self.rng.random() < self.real_share if real is None else real
        with led.lock:
            pods = [
                (v.name, v.node)
                for v in led.pods.values()
                if v.phase == "Running"
                and not v.deleting
                and not v.trainer_ended
                and (v.run in self.fleet.real_runs) == want_real
            ]
        if not pods:
            return None
        pod, node = self.rng.choice(sorted(pods))
        self.target.name = f"{pod} on {node}"
        return pod, node

    def _runner(self, node: str) -> RunnerHandle | None:
        return next((h for h in self.fleet.runners if h.node == node), None)

    def _node(self) -> str | None:
        """A node no other node fault holds: a runner node 40% of the time (one at a time, so
        the real trainers always have somewhere to go), else a kwok node (at most a third of
        them at once, so the runs have somewhere to go)."""
        with self.lock:
            runners = [h.node for h in self.fleet.runners if h.node not in self.busy_nodes]
            kwok = [n for n in self.fleet.kwok_nodes if n not in self.busy_nodes]
            busy_runners = len(self.fleet.runners) - len(runners)
            if self.rng.random() < 0.4 and runners and busy_runners == 0:
                node = self.rng.choice(runners)
            elif kwok and len(self.busy_nodes) - busy_runners < self._kwok_limit():
                node = self.rng.choice(kwok)
            else:
                return None
            self.busy_nodes.add(node)
            self.target.name = node
            return node

    def _kwok_limit(self) -> int:
        return max(1, len(self.fleet.kwok_nodes) // 3)

    def _release(self, node: str) -> None:
        with self.lock:
            self.busy_nodes.discard(node)

    # -- pod faults -------------------------------------------------------------------------

    def evict(self, _: float) -> bool:
        victim = self._victim()
        if not victim:
            return False
        evict(self.fleet.core, self.fleet.ns, victim[0])
        return True

    def kill_trainer(self, _: float) -> bool:
        victim = self._victim()
        if not victim:
            return False
        pod, node = victim
        runner = self._runner(node)
        if runner is None:  # a kwok pod: its trainer "exits 137", as the kubelet would report
            failed = {
                "status": {
                    "phase": "Failed",
                    "containerStatuses": [container_status(TRAINER_CONTAINER, KILLED)],
                }
            }
            self.fleet.core.patch_namespaced_pod_status(pod, self.fleet.ns, failed)
            return True
        pid = runner.pid_of(self.fleet.ns, pod, TRAINER_CONTAINER)
        if not pid:
            return False
        os.kill(pid, signal.SIGKILL)
        return True

    def kill_sidecar(self, _: float) -> bool:
        """SIGKILLs a real trainer's sync sidecar while it uploads (its log shows more uploads
        begun than ended), waiting up to 45 s for one; else not at all."""
        victim = self._victim(real=True)
        if not victim:
            return False
        pod, node = victim
        runner = self._runner(node)
        if runner is None:
            return False
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            log = runner.log_of(self.fleet.ns, pod, SYNC_CONTAINER)
            begun = log.count(": uploading ")
            ended = log.count(" committed (epoch") + log.count(" is committed already")
            pid = runner.pid_of(self.fleet.ns, pod, SYNC_CONTAINER)
            if pid and begun > ended:
                os.kill(pid, signal.SIGKILL)
                return True
            time.sleep(0.02)
        return False

    # -- node faults ------------------------------------------------------------------------

    def notice_taint(self, _: float) -> bool:
        node = self._node()
        if node is None:
            return False
        try:
            self._taint(node, add=True)
            time.sleep(self.rng.uniform(20, 40))
            self._taint(node, add=False)
        finally:
            self._release(node)
        return True

    def _taint(self, node: str, add: bool) -> None:
        core = self.fleet.core

        def write() -> None:
            now = core.read_node(node).spec.taints or []
            taints = [t for t in now if t.key != NOTICE_TAINT]
            if add:
                taints.append(client.V1Taint(key=NOTICE_TAINT, effect="NoSchedule"))
            core.patch_node(node, {"spec": {"taints": [t.to_dict() for t in taints]}})

        self._retry(write, ok=(404,), tries=30)  # a node deleted meanwhile has no taint left

    def not_ready(self, _: float) -> bool:
        """The node reports NotReady and is cordoned (a failing node drained), for 20-40 s."""
        node = self._node()
        if node is None:
            return False
        core = self.fleet.core
        try:
            core.patch_node(node, {"spec": {"unschedulable": True}})
            runner = self._runner(node)
            if runner:
                runner.report_not_ready()
            else:
                mark_unknown(core, node)
            time.sleep(self.rng.uniform(20, 40))
            if runner:
                runner.make_ready()
            self._retry(lambda: core.patch_node(node, {"spec": {"unschedulable": False}}))
        finally:
            self._release(node)
        return True

    def delete_node(self, _: float) -> bool:
        """A kwok node deleted (the VM gone), and a node of the same name back 15-30 s later."""
        with self.lock:
            free = [n for n in self.fleet.kwok_nodes if n not in self.busy_nodes]
            busy = len([n for n in self.busy_nodes if n in self.fleet.kwok_nodes])
            if not free or busy >= self._kwok_limit():
                return False
            node = self.rng.choice(free)
            self.busy_nodes.add(node)
        self.target.name = node
        try:
            self.fleet.core.delete_node(node)
            time.sleep(self.rng.uniform(15, 30))
            body = client.V1Node(
                metadata=client.V1ObjectMeta(
                    name=node,
                    annotations={KWOK_NODE_ANNOTATION: "fake"},
                    labels=self.fleet.kwok_nodes[node],
                )
            )
            self._retry(lambda: self.fleet.core.create_node(body), ok=(409,))
        finally:
            self._release(node)
        return True

    @staticmethod
    def _retry(call: Callable[[], Any], ok: tuple[int, ...] = (), tries: int = 60) -> None:
        """``call`` until it succeeds or fails with a status in ``ok``, every 2 s while the API
        server restarts, at most ``tries`` times."""
        for _ in range(tries):
            try:
                call()
                return
            except client.ApiException as e:
                if e.status in ok:
                    return
            except Exception:
                pass
            time.sleep(2)
        raise RuntimeError(f"gave up after {tries} tries")

    # -- servers ----------------------------------------------------------------------------

    def kill_leader(self, elapsed: float) -> bool:
        """SIGKILLs the replica that leads, in the first ``kill_until`` of the window only (so the
        leader at the end has led long enough for its memory to be judged), at most every
        25 s; a new standby replaces it 3 s later."""
        if elapsed > self.kill_until * self.window_s or not self._gate("operator", 25):
            return False
        fleet = self.fleet
        lease = fleet.observer.coordination.read_namespaced_lease(fleet.lease, fleet.ns)
        holder = (lease.spec and lease.spec.holder_identity) or ""
        with self.lock:
            leader = next(
                (r for r in fleet.replicas if r.proc and f"-{r.proc.pid}-" in f"{holder}-"), None
            )
            if leader is None or not leader.alive():
                return False
            leader.kill()
        time.sleep(3)
        with self.lock:
            fleet.replicas.remove(leader)
            fleet.replicas.append(fleet.new_replica())
        return True

    def restart_apiserver(self, _: float) -> bool:
        if not self._gate("apiserver", 60):
            return False
        processes.restart_apiserver(self.fleet.env)
        return True

    def stop_seaweedfs(self, _: float) -> bool:
        with self.lock:
            if self.s3_down:
                return False
            self.s3_down = True
        if not self._gate("seaweedfs", SEAWEEDFS_DOWN_S + 60):
            with self.lock:
                self.s3_down = False
            return False
        try:
            launch, _pid = processes.stop_seaweedfs(self.fleet.env)
            time.sleep(SEAWEEDFS_DOWN_S)
            processes.start_seaweedfs(self.fleet.env, launch)
        finally:
            with self.lock:
                self.s3_down = False
        return True
