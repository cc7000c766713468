"""One chaos run: the fleet set up, the faults injected while the observer watches, a settle
period, the checks at the end, and the report (faults by kind, invariants checked, breaks,
memory over time). ``tests.chaos`` (make chaos) and tests/e2e/test_chaos.py both call ``run``."""

from __future__ import annotations

import contextlib
import json
import math
import random
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median
from typing import Any

from kubernetes import client, config

from tests import localenv
from tests.chaos import evidence, processes
from tests.chaos.faults import Fleet, Injector
from tests.chaos.observe import INVARIANTS, Ledger, Observer
from tests.e2e.example import pod_spec, uninterrupted
from tests.integration.support import (
    OperatorProcess,
    credentials_secret,
    evict,
    read_committed,
    s3_reader,
    trainingrun,
)
from tests.podrunner import RunnerHandle, start_runner
from trainingrun import api
from trainingrun.checkpoint.manifest import parse_run_manifest

REPO = Path(__file__).resolve().parents[2]
BUDGET_REASONS = {"RestartBudgetExhausted", "CrashLoop", "PreemptionBudgetExhausted"}


@dataclass(frozen=True)
class Config:
    runs: int = 200  # TrainingRuns on kwok nodes
    real: int = 6  # TrainingRuns of examples/finetune.py on two pod runner nodes
    fault_minutes: float = 10.0
    mean_gap_s: float = 1.5  # between two faults, on average (exponential)
    max_steps: int = 1200
    save_steps: int = 20
    step_delay: float = 0.5
    settle_s: float = 120.0  # at least this long after the faults end
    finish_timeout_s: float = 900.0  # the real trainers end within this after the faults
    seed: int = 20261126
    runs_per_node: int = 20
    kill_until: float = 0.6  # operator SIGKILLs in this first fraction of the fault window
    memory_window_s: float = 60.0  # the settle period's first and last, the final leader's
    real_share: float = 0.3  # of the pod faults, the share aimed at the real trainers


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Setup:
    """The namespace, nodes, runners, operator replicas and runs of one chaos run."""

    def __init__(self, cfg: Config, work: Path) -> None:
        self.cfg, self.work = cfg, work
        self.env = localenv.up()
        localenv.stop_operator(self.env)  # make demo's, if it runs: ours are the only ones
        self.env.kubectl("apply", "-f", str(REPO / "crds" / "trainingrun.yaml"))
        self.env.wait_established("trainingruns.trainingrun.dev")
        api_client = config.new_client_from_config(config_file=self.env.kubeconfig)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.ns = f"chaos-{uuid.uuid4().hex[:6]}"
        self.prefix = f"chaos/{self.ns}"
        self.lease = "trainingrun-chaos"
        self.kwok_nodes: dict[str, dict[str, str]] = {}
        self.runners: list[RunnerHandle] = []
        self.replicas: list[OperatorProcess] = []
        self.s3 = localenv.s3_client(self.env)

    def up(self) -> None:
        cfg, core = self.cfg, self.core
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=self.ns)))
        core.create_namespaced_secret(self.ns, credentials_secret(self.env))
        for i in range(max(3, math.ceil(cfg.runs / cfg.runs_per_node))):
            name = f"{self.ns}-{i}"
            labels = {"type": "kwok", "kubernetes.io/hostname": name, "chaos": self.ns}
            meta = client.V1ObjectMeta(
                name=name, annotations={localenv.KWOK_NODE_ANNOTATION: "fake"}, labels=labels
            )
            core.create_node(client.V1Node(metadata=meta))
            self.kwok_nodes[name] = labels
        if cfg.real:
            self.runners = [start_runner(self.env), start_runner(self.env)]
        self.replicas = [self.replica(), self.replica()]

    def replica(self) -> OperatorProcess:
        op = OperatorProcess(
            self.env,
            self.work / f"operator-{len(list(self.work.glob('operator-*.log')))}.log",
            args=["--leader-lease", f"{self.ns}/{self.lease}"],
            extra_env={
                "TRAININGRUN_RESYNC_SECONDS": "10",
                "TRAININGRUN_CHECKPOINT_REFRESH_SECONDS": "10",
            },
        )
        op.log_path.touch()
        op.start()
        return op

    def kwok_run(self, name: str) -> dict[str, Any]:
        body = trainingrun(
            name,
            self.env,
            self.prefix,
            restart_policy={
                "maxRestarts": 10000,
                "crashLoopLimit": 1000,
                "backoff": {"initialSeconds": 1, "maxSeconds": 5},
            },
        )
        body["spec"]["template"]["spec"]["nodeSelector"] = {"chaos": self.ns}
        return body

    def real_run(self, name: str) -> dict[str, Any]:
        cfg = self.cfg
        body = self.kwok_run(name)
        loss_dir = self.work / f"loss-{name}"
        loss_dir.mkdir()
        nodes = [h.node for h in self.runners]
        body["spec"]["template"]["spec"] = pod_spec(
            loss_dir, nodes, cfg.max_steps, cfg.save_steps, cfg.step_delay
        )
        body["spec"]["preemption"] = {"terminationGracePeriodSeconds": 60}
        body["spec"]["checkpoint"]["keep"] = 5
        return body

    def run_key(self, name: str) -> str:
        return f"{self.prefix}/{self.ns}/{name}"

    def create_runs(self) -> tuple[list[str], list[str]]:
        kwok = [f"k{i:04d}" for i in range(self.cfg.runs)]
        real = [f"real{i}" for i in range(self.cfg.real)]
        for name in real:
            self.create(self.real_run(name))
        for name in kwok:
            self.create(self.kwok_run(name))
        return kwok, real

    def create(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(
            api.GROUP, api.VERSION, self.ns, api.PLURAL, body
        )

    def down(self) -> None:
        for op in self.replicas:
            op.stop()
        for handle in self.runners:
            handle.stop()
        with contextlib.suppress(client.ApiException):
            self.core.delete_namespace(self.ns)
        gone_by = time.monotonic() + 300
        while time.monotonic() < gone_by:
            try:
                self.core.read_namespace(self.ns)
            except client.ApiException:
                break
            time.sleep(2)
        for node in self.kwok_nodes:
            with contextlib.suppress(client.ApiException):
                self.core.delete_node(node)


class Supervisor:
    """Starts again, every 2 s, each control plane component that exited (processes.supervise),
    as a node's supervisor would; counts the restarts by component."""

    def __init__(self, env: localenv.LocalEnv, deadline: float) -> None:
        self.env, self.deadline = env, deadline
        self.restarts: dict[str, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="supervisor")

    def _run(self) -> None:
        while not self.stop.wait(2.0) and time.monotonic() < self.deadline:
            self.once()

    def once(self) -> None:
        for name in processes.supervise(self.env):
            self.restarts[name] = self.restarts.get(name, 0) + 1
            log(f"{name} had exited: started again")


def wait_running(setup: Setup, expected: int, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        pods = setup.core.list_namespaced_pod(setup.ns).items
        running = sum(1 for p in pods if p.status and p.status.phase == "Running")
        if running >= expected:
            return time.monotonic() - started
        time.sleep(3)
    raise RuntimeError(f"only {running}/{expected} attempt pods running after {timeout_s:.0f} s")


def run(cfg: Config, work: Path | None = None) -> dict[str, Any]:
    work = work or Path(tempfile.mkdtemp(prefix="chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(cfg.seed)
    reference: dict[str, Any] = {}

    def make_reference() -> None:
        ref = work / "reference"
        ref.mkdir()
        reference["weights"], _ = uninterrupted(ref, cfg.max_steps, cfg.save_steps)

    ref_thread = threading.Thread(target=make_reference, daemon=True)
    if cfg.real:
        ref_thread.start()
    setup = Setup(cfg, work)
    report: dict[str, Any] = {"config": asdict(cfg), "namespace": setup.ns, "work": str(work)}
    window = cfg.fault_minutes * 60
    horizon = time.monotonic() + 600 + window + cfg.finish_timeout_s + cfg.settle_s
    supervisor = Supervisor(setup.env, horizon)
    supervisor.once()  # an earlier run may have left a component down
    supervisor.restarts.clear()
    supervisor.thread.start()
    try:
        setup.up()
        keys = {name: setup.run_key(name) for name in (f"real{i}" for i in range(cfg.real))}
        observer = Observer(
            setup.core,
            setup.custom,
            setup.coordination,
            setup.s3,
            setup.env.bucket,
            setup.ns,
            keys,
            setup.lease,
            lambda: [op.proc.pid for op in setup.replicas if op.proc and op.alive()],
            horizon,
        )
        observer.start()
        kwok, real = setup.create_runs()
        log(f"{len(kwok)} runs on {len(setup.kwok_nodes)} kwok nodes, {len(real)} real trainers")
        took = wait_running(setup, len(kwok) + len(real), 300 + len(kwok))
        log(f"every attempt-1 pod running after {took:.0f} s; faults for {window:.0f} s")
        fleet = Fleet(
            setup.env,
            setup.core,
            setup.ns,
            setup.lease,
            setup.kwok_nodes,
            setup.runners,
            set(real),
            setup.replicas,
            setup.replica,
            observer,
        )
        injector = Injector(fleet, rng, window, cfg.kill_until, cfg.real_share)
        faults_from = observer.ledger.now()
        injector.run(cfg.mean_gap_s)
        faults_to = observer.ledger.now()
        log(f"faults over: {sum(injector.injected.values())} injected; settling")
        report["resume_forced"] = ensure_a_resume(setup, observer, real)
        while len([op for op in setup.replicas if op.alive()]) < 2:
            setup.replicas.append(setup.replica())
        # the memory check compares the settle period's first and last windows
        settle_until = time.monotonic() + max(cfg.settle_s, 2 * cfg.memory_window_s + 5)
        finish_by = time.monotonic() + cfg.finish_timeout_s
        ended = False
        while time.monotonic() < finish_by:
            statuses = [observer.ledger.runs.get(name, {}).get("status") or {} for name in real]
            ended = all(s.get("phase") in ("Succeeded", "Failed") for s in statuses)
            if ended and time.monotonic() >= settle_until:
                break
            time.sleep(5)
        if cfg.real:
            ref_thread.join(timeout=600)
        final = final_checks(setup, observer, reference.get("weights"), real, kwok)
        if observer.ledger.breaks:  # kept before the namespace and the runners go
            kept = evidence.keep(
                setup.core, setup.custom, setup.ns, setup.runners, real, work / "evidence"
            )
            report["evidence"] = evidence.summary(kept)
            log(f"invariants broke: evidence kept in {kept}")
        observer.close()
        report.update(
            summary(
                observer.ledger,
                cfg.memory_window_s,
                injector,
                final,
                faults_from,
                faults_to,
                observer,
            )
        )
        report["control_plane_restarts"] = dict(supervisor.restarts)
    finally:
        setup.down()
        supervisor.stop.set()
        supervisor.thread.join(timeout=10)
        supervisor.once()  # the next user of the environment finds every component up
    return report


def ensure_a_resume(setup: Setup, observer: Observer, real: list[str]) -> bool:
    """When no real trainer has resumed from a checkpoint yet (every fault landed before a
    first commit), evicts one that has committed since, so the resume checks have something
    to check; True when it did. Bounded to 5 minutes."""
    led = observer.ledger
    deadline = time.monotonic() + 300
    evicted = False
    while real and time.monotonic() < deadline:
        with led.lock:
            if any(run in real for run, _, _ in led.resumed):
                return evicted
            statuses = [led.runs.get(name, {}).get("status") or {} for name in real]
        if not evicted:
            for status in statuses:
                pod = status.get("activePod")
                if status.get("phase") == "Running" and pod and status.get("latestCheckpoint"):
                    try:
                        evict(setup.core, setup.ns, pod)
                    except client.ApiException:
                        continue
                    log(f"no real trainer had resumed yet: evicted {pod}")
                    evicted = True
                    break
        time.sleep(2)
    return evicted


def final_checks(
    setup: Setup, observer: Observer, weights: bytes | None, real: list[str], kwok: list[str]
) -> dict[str, Any]:
    """The checks at the end, each recorded as a break in the ledger when it fails."""
    led = observer.ledger
    for check in ("resumes checked", "real trainer starts checked for their restore"):
        led.checks[check] += 0  # shown as 0 in the report when there were none
    runs = setup.custom.list_namespaced_custom_object(api.GROUP, api.VERSION, setup.ns, api.PLURAL)[
        "items"
    ]
    pods = {p.metadata.name: p for p in setup.core.list_namespaced_pod(setup.ns).items}
    phases: dict[str, int] = {}
    with led.lock:
        for run in runs:
            name, spec, status = run["metadata"]["name"], run["spec"], run.get("status") or {}
            phase = status.get("phase", "")
            phases[phase] = phases.get(phase, 0) + 1
            led.checks["runs checked at the end"] += 1
            active = pods.get(status.get("activePod") or "")
            runs_pod = phase == "Running" and active and active.status.phase == "Running"
            says_why = status.get("reason") and status.get("message")
            if not (phase == "Succeeded" or runs_pod or says_why):
                led.broke("progress-or-reason", f"{name}: {phase} with no reason ({status})")
            attempt = int(status.get("attempt") or 0)
            counted = 1 + int(status.get("restarts") or 0) + int(status.get("preemptions") or 0)
            counted += len(status.get("badCheckpoints") or [])
            if attempt != counted:
                led.broke("budgets", f"{name}: attempt {attempt} but 1 + endings = {counted}")
            policy = spec.get("restartPolicy") or {}
            if status.get("reason") == "RestartBudgetExhausted" and int(
                status.get("restarts") or 0
            ) <= int(policy.get("maxRestarts", 3)):
                led.broke("budgets", f"{name}: RestartBudgetExhausted within its budget")
            seen = led.attempts.get(name, set())
            if seen and seen != set(range(1, max(seen) + 1)):
                led.broke("attempts-in-order", f"{name}: attempts {sorted(seen)}")
            if seen and not max(seen) <= attempt <= max(seen) + 1:
                led.broke("attempts-in-order", f"{name}: status {attempt}, pods to {max(seen)}")
        for run_name, attempt, step in led.resumed:
            if run_name in real and step and step not in led.committed.get(run_name, set()):
                led.broke("resumed-verified", f"{run_name}-{attempt} resumed {step}, never seen")
            led.checks["resumes checked"] += 1
        for view in led.seen.values():
            if view.run in real and view.trainer_started and view.resume_step:
                led.checks["real trainer starts checked for their restore"] += 1
                if view.restore_exit != 0:
                    led.broke("resumed-verified", f"{view.name}: restore exit {view.restore_exit}")
    endings = {}
    get = s3_reader(setup.s3, setup.env.bucket)
    for name in real:
        status = next((r.get("status") or {} for r in runs if r["metadata"]["name"] == name), {})
        endings[name] = {k: status.get(k) for k in ("phase", "attempt", "restarts", "preemptions")}
        if status.get("phase") != "Succeeded" or weights is None:
            led.broke("weights", f"{name}: {status.get('phase')}, no final weights to compare")
            continue
        key = setup.run_key(name)
        manifest = parse_run_manifest(get(f"{key}/manifest.json"))
        entry = next((e for e in manifest.entries if e.step == setup.cfg.max_steps), None)
        led.checks["final weights compared"] += 1
        if entry is None:
            led.broke("weights", f"{name}: step {setup.cfg.max_steps} not committed")
        elif read_committed(get, f"{key}/{entry.part_prefixes[0]}", "model.safetensors") != weights:
            led.broke("weights", f"{name}: final weights differ from the uninterrupted run's")
    return {"phases": phases, "real": endings}


def memory_check(led: Ledger, end: float, window: float, settled_from: float) -> dict[str, Any]:
    """The final leader's RSS: the median of its last ``window`` seconds against that of its
    first settled window, the first of the settle period (``settled_from``: the faults over),
    or its second as leader when it took over later. A step up during the faults (a burst's
    high-water mark, the heap kept) is reported, not judged: a leak keeps growing after them.
    """
    leading = [m for m in led.memory if m[3]]
    if not leading:
        led.broke("memory-flat", "no leader was ever sampled")
        return {}
    pid = leading[-1][1]
    mine = [m for m in leading if m[1] == pid]
    since = mine[0][0]
    start = max(settled_from, since + window)
    first = [m[2] for m in mine if start <= m[0] < start + window]
    last = [m[2] for m in mine if m[0] >= end - window]
    led_second = [m[2] for m in mine if since + window <= m[0] < since + 2 * window]
    result: dict[str, Any] = {
        "pid": pid,
        "led_from_s": since,
        "led_for_s": round(end - since),
        "settled_from_s": round(start),
    }
    if led_second:
        result["second_minute_led_mb"] = round(median(led_second), 1)
    if not first or not last or end - start < 2 * window:
        led.broke("memory-flat", f"settled {end - start:.0f} s under the final leader: too short")
        return result
    result.update(first_minute_mb=round(median(first), 1), last_minute_mb=round(median(last), 1))
    led.checks["memory judged"] += 1
    if median(last) > 1.10 * median(first):
        led.broke("memory-flat", f"RSS {median(first):.0f} -> {median(last):.0f} MB")
    return result


def summary(
    led: Ledger,
    window: float,
    injector: Injector,
    final: dict[str, Any],
    faults_from: float,
    faults_to: float,
    observer: Observer,
) -> dict[str, Any]:
    end = led.now()
    memory = memory_check(led, end, window, faults_to)
    by_half_minute: dict[int, float] = {}
    for t, _, rss, leads in led.memory:
        if leads:
            by_half_minute[int(t // 30)] = max(rss, by_half_minute.get(int(t // 30), 0))
    breaks = [asdict(b) for b in led.breaks]
    return {
        "faults_window_s": [round(faults_from), round(faults_to)],
        "duration_s": round(end),
        "faults_injected": dict(injector.injected),
        "faults_missed": dict(injector.missed),
        "fault_log": injector.log,
        "invariants": INVARIANTS,
        "checks": dict(led.checks),
        "breaks": breaks,
        "breaks_by_invariant": {k: sum(b["invariant"] == k for b in breaks) for k in INVARIANTS},
        "memory": memory,
        "leader_rss_mb_by_30s": [[k * 30, round(v, 1)] for k, v in sorted(by_half_minute.items())],
        "watches": {
            w.name: {
                "reconnects": w.reconnects,
                "gaps": w.gaps,
                "vanished": w.vanished,
                "why": dict(w.errors),
            }
            for w in observer.watches
        },
        **final,
    }


def save(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str))
