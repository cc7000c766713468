"""What the chaos test watches while faults land: every pod, run and node of its namespace
through watches that resume where they stopped (an API server restart loses no event), the
bucket's committed checkpoints of the real trainers, and the operators' memory. Each invariant
that breaks is recorded as it breaks, with the time and what was seen."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from trainingrun import api
from trainingrun.checkpoint.manifest import parse_run_manifest
from trainingrun.contract import (
    ANNOTATION_RESUME_STEP,
    LABEL_ATTEMPT,
    LABEL_RANK,
    LABEL_RUN,
    RESTORE_CONTAINER,
    TRAINER_CONTAINER,
)

# Each invariant, as the report names it.
INVARIANTS = {
    "one-pod-per-attempt": "each pod of an attempt (each rank) is created once",
    "one-live-attempt": "a run's new attempt starts only when no older attempt's trainer runs "
    "on a Ready node outside deletion",
    "attempts-in-order": "attempt numbers are never skipped and never go back",
    "committed-immutable": "no committed object's bytes (ETag and size) ever change",
    "resumed-verified": "every resumed checkpoint was committed, and its restore exited 0 "
    "before the trainer ran",
    "progress-or-reason": "at the end every run is Succeeded, runs its pod, or says why not",
    "budgets": "attempt = 1 + restarts + preemptions + bad checkpoints, and a run failed on a "
    "budget has spent it",
    "weights": "each real trainer ends with its uninterrupted run's weights, bitwise",
    "memory-flat": "the leading operator's RSS in the last minute is within 10% of its first "
    "settled minute's (the first of the settle period, after the faults)",
}

# A node seen NotReady or gone this long before (or shortly after) a new attempt's pod
# appeared explains an older attempt's pod that still looked live there: the operator ends
# attempts on such nodes at once and deletes their pods without waiting for them.
NODE_FAULT_WINDOW_S = 120.0
JUDGE_DELAY_S = 3.0


@dataclass
class Break:
    at: float
    invariant: str
    detail: str


@dataclass
class PodView:
    run: str
    attempt: int
    rank: str
    name: str
    node: str
    deleting: bool
    phase: str
    trainer_started: bool
    trainer_ended: bool
    restore_exit: int | None
    resume_step: int  # from the pod's annotation; 0 for a fresh start (no restore)


def pod_view(pod: Any) -> PodView | None:
    labels = pod.metadata.labels or {}
    if LABEL_RUN not in labels:
        return None
    trainer_started = trainer_ended = False
    for cs in (pod.status and pod.status.container_statuses) or []:
        if cs.name == TRAINER_CONTAINER and cs.state:
            trainer_started = bool(cs.state.running or cs.state.terminated)
            trainer_ended = bool(cs.state.terminated)
    restore_exit = None
    for cs in (pod.status and pod.status.init_container_statuses) or []:
        if cs.name == RESTORE_CONTAINER and cs.state and cs.state.terminated:
            restore_exit = cs.state.terminated.exit_code
    return PodView(
        run=labels[LABEL_RUN],
        attempt=int(labels.get(LABEL_ATTEMPT, "0")),
        rank=labels.get(LABEL_RANK, "0"),
        name=pod.metadata.name,
        node=(pod.spec and pod.spec.node_name) or "",
        deleting=pod.metadata.deletion_timestamp is not None,
        phase=(pod.status and pod.status.phase) or "",
        trainer_started=trainer_started,
        trainer_ended=trainer_ended,
        restore_exit=restore_exit,
        resume_step=int((pod.metadata.annotations or {}).get(ANNOTATION_RESUME_STEP) or 0),
    )


def live(view: PodView) -> bool:
    """A pod whose trainer the API shows running (or about to) and nobody is ending."""
    return not view.deleting and view.phase in ("Pending", "Running") and not view.trainer_ended


def items(listed: Any) -> list[Any]:
    """The items of a list: a model's (core kinds) or a dict's (custom objects)."""
    return list(listed["items"] if isinstance(listed, dict) else listed.items)


def uid(obj: Any) -> str:
    """The uid of an object, model or dict."""
    if isinstance(obj, dict):
        return str(obj["metadata"]["uid"])
    return str(obj.metadata.uid)


def version(obj: Any) -> str:
    """The resource version of an object or list, model or dict."""
    if isinstance(obj, dict):
        return str(obj["metadata"]["resourceVersion"])
    return str(obj.metadata.resource_version)


class Resumable:
    """A watch that resumes from the last resource version it saw, so an API server restart
    loses no event; a 410 (history compacted) lists again and is counted as a gap. An object
    deleted during the gap has no DELETED event, only its absence from that list: it is handed
    over as DELETED (its last state), before the listed ones as ADDED, and counted as
    vanished."""

    def __init__(
        self,
        name: str,
        list_fn: Callable[..., Any],
        handle: Callable[[str, Any], None],
        stop: threading.Event,
        deadline: float,
        **kwargs: Any,
    ) -> None:
        self.name, self.list_fn, self.handle, self.kwargs = name, list_fn, handle, kwargs
        self.stop, self.deadline = stop, deadline
        self.gaps = self.reconnects = self.vanished = 0
        self.errors: Counter[str] = Counter()  # why it reconnected, by exception type
        self.known: dict[str, Any] = {}  # by uid, the last state of each object that exists
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"watch-{name}")

    def deliver(self, kind: str, obj: Any) -> None:
        if kind == "DELETED":
            self.known.pop(uid(obj), None)
        else:
            self.known[uid(obj)] = obj
        self.handle(kind, obj)

    def relist(self) -> str:
        """Lists, hands over what vanished since the last look and what is there; returns the
        list's resource version."""
        listed = self.list_fn(**self.kwargs)
        found = items(listed)
        there = {uid(obj) for obj in found}
        for gone in [obj for key, obj in self.known.items() if key not in there]:
            self.vanished += 1
            self.deliver("DELETED", gone)
        for obj in found:
            self.deliver("ADDED", obj)
        return version(listed)

    def _run(self) -> None:
        rv: str | None = None
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            try:
                if rv is None:
                    rv = self.relist()
                for ev in watch.Watch().stream(
                    self.list_fn, resource_version=rv, timeout_seconds=15, **self.kwargs
                ):
                    obj = ev["object"]
                    if ev["type"] == "ERROR":
                        code = obj.get("code", 500) if isinstance(obj, dict) else obj.code
                        raise client.ApiException(status=code or 500)
                    rv = version(obj)
                    self.deliver(ev["type"], obj)
                    if self.stop.is_set():
                        return
            except client.ApiException as e:
                if e.status == 410:
                    rv, self.gaps = None, self.gaps + 1
                self.reconnects += 1
                self.errors[f"HTTP {e.status}"] += 1
                time.sleep(1)
            except Exception as e:  # the API server restarting: connection refused, reset
                self.reconnects += 1
                self.errors[type(e).__name__] += 1
                time.sleep(1)


@dataclass
class Ledger:
    """Everything seen, under one lock."""

    t0: float
    breaks: list[Break] = field(default_factory=list)
    pods: dict[str, PodView] = field(default_factory=dict)  # by uid, while it exists
    seen: dict[str, PodView] = field(default_factory=dict)  # by uid, last view, ever
    uids: dict[tuple[str, int, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    attempts: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    status_attempt: dict[str, int] = field(default_factory=dict)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    node_ready: dict[str, bool] = field(default_factory=dict)
    node_faulted: dict[str, float] = field(default_factory=dict)  # last NotReady or gone
    resumed: list[tuple[str, int, int]] = field(default_factory=list)  # run, attempt, step
    # New attempts' pods seen beside live older ones: (when, its name, the older), to judge.
    pending: list[tuple[float, str, list[PodView]]] = field(default_factory=list)
    committed: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    objects: dict[str, tuple[str, int]] = field(default_factory=dict)  # key -> (etag, size)
    memory: list[tuple[float, int, float, bool]] = field(default_factory=list)
    checks: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def broke(self, invariant: str, detail: str) -> None:
        self.breaks.append(Break(round(self.now(), 1), invariant, detail))


class Observer:
    """The watches, the bucket scan and the memory samples, on threads of their own."""

    def __init__(
        self,
        core: client.CoreV1Api,
        custom: client.CustomObjectsApi,
        coordination: client.CoordinationV1Api,
        s3: Any,
        bucket: str,
        ns: str,
        real_runs: dict[str, str],  # run -> its key prefix in the bucket
        lease: str,
        pids: Callable[[], list[int]],
        deadline: float,
    ) -> None:
        self.core, self.custom, self.coordination = core, custom, coordination
        self.s3, self.bucket, self.ns, self.real_runs = s3, bucket, ns, real_runs
        self.lease, self.pids = lease, pids
        self.ledger = Ledger(time.monotonic())
        self.stop = threading.Event()
        self.watches = [
            Resumable(
                "pods", core.list_namespaced_pod, self.on_pod, self.stop, deadline, namespace=ns
            ),
            Resumable("nodes", core.list_node, self.on_node, self.stop, deadline),
            Resumable(
                "runs",
                custom.list_namespaced_custom_object,
                self.on_run,
                self.stop,
                deadline,
                group=api.GROUP,
                version=api.VERSION,
                namespace=ns,
                plural=api.PLURAL,
            ),
        ]
        self.loops = [
            threading.Thread(target=self._every, args=(1.0, self.judge, deadline), daemon=True),
            threading.Thread(target=self._every, args=(2.0, self._scan, deadline), daemon=True),
            threading.Thread(target=self._every, args=(5.0, self._sample, deadline), daemon=True),
        ]

    def start(self) -> None:
        for t in [w.thread for w in self.watches] + self.loops:
            t.start()

    def close(self) -> None:
        self.stop.set()
        for t in [w.thread for w in self.watches] + self.loops:
            t.join(timeout=30)

    def _every(self, period: float, work: Callable[[], None], deadline: float) -> None:
        while not self.stop.wait(period) and time.monotonic() < deadline:
            try:
                work()
            except Exception:  # the API server or the bucket is down: try at the next tick
                self.ledger.checks["observer ticks missed (API server or bucket down)"] += 1

    # -- watches ----------------------------------------------------------------------------

    def on_pod(self, kind: str, pod: Any) -> None:
        view = pod_view(pod)
        if view is None:
            return
        led, uid = self.ledger, pod.metadata.uid
        with led.lock:
            if kind == "DELETED":
                led.pods.pop(uid, None)
                led.seen[uid] = view
                return
            key = (view.run, view.attempt, view.rank)
            new = uid not in led.uids[key]
            if new:
                led.uids[key].add(uid)
                led.checks["pods created"] += 1
                if len(led.uids[key]) > 1:
                    led.broke("one-pod-per-attempt", f"{view.name}: {len(led.uids[key])} pods")
                before = led.attempts[view.run]
                top = max(before, default=0)
                if view.attempt not in before and view.attempt != top + 1 and view.attempt > top:
                    led.broke("attempts-in-order", f"{view.name} after attempt {top}")
                before.add(view.attempt)
                older = [
                    v
                    for v in led.pods.values()
                    if v.run == view.run and v.attempt < view.attempt and live(v)
                ]
                if older:
                    led.pending.append((led.now(), view.name, older))
                if view.resume_step:
                    led.resumed.append((view.run, view.attempt, view.resume_step))
            led.pods[uid] = view
            led.seen[uid] = view

    def on_node(self, kind: str, node: Any) -> None:
        led = self.ledger
        ready = kind != "DELETED" and any(
            c.type == "Ready" and c.status == "True"
            for c in (node.status and node.status.conditions) or []
        )
        with led.lock:
            led.node_ready[node.metadata.name] = ready
            if not ready:
                led.node_faulted[node.metadata.name] = led.now()

    def on_run(self, kind: str, run: dict[str, Any]) -> None:
        led = self.ledger
        name = run["metadata"]["name"]
        status = run.get("status") or {}
        with led.lock:
            led.runs[name] = run
            attempt = int(status.get("attempt") or 0)
            last = led.status_attempt.get(name, 0)
            if attempt < last:
                led.broke("attempts-in-order", f"{name}: status.attempt {last} -> {attempt}")
            led.status_attempt[name] = max(attempt, last)
            led.checks["run status writes seen"] += 1

    # -- periodic ---------------------------------------------------------------------------

    def judge(self) -> None:
        """An older attempt's pod that looked live when a new one appeared breaks the invariant
        unless its node was NotReady or gone around then (the watches of pods and nodes are
        separate streams, so the node's change may arrive a moment after the pod's)."""
        led = self.ledger
        with led.lock:
            judged_by = led.now() - JUDGE_DELAY_S
            due = [p for p in led.pending if p[0] <= judged_by]
            led.pending = [p for p in led.pending if p[0] > judged_by]
            for at, name, older in due:
                led.checks["new attempts judged with an older pod still listed"] += 1
                for v in older:
                    faulted = led.node_faulted.get(v.node)
                    if faulted is not None and at - NODE_FAULT_WINDOW_S <= faulted:
                        continue
                    led.broke("one-live-attempt", f"{name} created while {v.name} ran on {v.node}")

    def _scan(self) -> None:
        """The real trainers' manifests: every committed step, and each committed object's ETag
        and size the first time it is seen; a later difference breaks immutability."""
        led = self.ledger
        for run, key in self.real_runs.items():
            try:
                body = self.s3.get_object(Bucket=self.bucket, Key=f"{key}/manifest.json")
            except self.s3.exceptions.NoSuchKey:
                continue
            manifest = parse_run_manifest(body["Body"].read())
            for entry in manifest.entries:
                with led.lock:
                    led.committed[run].add(entry.step)
                for prefix in entry.part_prefixes:
                    pages = self.s3.get_paginator("list_objects_v2").paginate(
                        Bucket=self.bucket, Prefix=f"{key}/{prefix}"
                    )
                    for page in pages:
                        for obj in page.get("Contents", []):
                            self.see_object(obj["Key"], obj["ETag"], obj["Size"])

    def see_object(self, key: str, etag: str, size: int) -> None:
        led = self.ledger
        with led.lock:
            led.checks["committed object looks"] += 1
            first = led.objects.setdefault(key, (etag, size))
            if first != (etag, size):
                led.broke("committed-immutable", f"{key}: {first} -> {(etag, size)}")
                led.objects[key] = (etag, size)

    def _sample(self) -> None:
        try:
            lease = self.coordination.read_namespaced_lease(self.lease, self.ns)
            holder = (lease.spec and lease.spec.holder_identity) or ""
        except Exception:
            holder = ""
        for pid in self.pids():
            try:
                lines = Path(f"/proc/{pid}/status").read_text().splitlines()
            except FileNotFoundError:
                continue
            rss = next((int(ln.split()[1]) for ln in lines if ln.startswith("VmRSS:")), 0)
            leads = f"-{pid}-" in f"{holder}-"  # <host>-<pid>-<suffix>
            with self.ledger.lock:
                self.ledger.memory.append((round(self.ledger.now(), 1), pid, rss / 1024, leads))
