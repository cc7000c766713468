"""Benchmark: how fast the operator replaces a failed attempt, with many TrainingRuns.

Creates N TrainingRuns (default 500) spread over kwok nodes, waits until every attempt-1 pod
runs, then marks those pods Failed one by one at a fixed rate (as a kubelet would) and measures,
for each, the time from the Failed status write to the replacement pod ``<run>-2`` appearing in
a watch. Reports p50, p99 and max of that latency, the operator process's peak RSS (VmHWM), and
the CPU time the operator spent while the failures were handled, per replacement (a figure the
other load on a shared machine disturbs less than the latency), and the operator's own calls per
replacement: to the API server (reads, writes, Events: its ``trainingrun_api_calls`` metric) and
to the bucket (``trainingrun_bucket_calls``); and the CPU per replacement of every other process
on the machine (control plane, kwok, SeaweedFS, the benchmark itself) against what the cores
have for one replacement at the failure rate.

``--runs`` takes several fleet sizes (``--runs 250,1000,5000``): each is measured in turn with a
fresh operator and namespace, and kwok nodes scaled to match (``--pods-per-node``); the table
compares them, and the CPU per replacement of the largest with that of the smallest.

With ``--replicas R`` above 1, each run is a gang of R pods ``<run>-<attempt>-<rank>`` on R
distinct nodes (at least R kwok nodes are made), and one member of each run (a rank drawn with
``--seed``) is marked Failed. Per run it measures the time from that write until the first, and
until all R, pods of attempt 2 appeared in the watch; then it checks, within ``--settle``
seconds, that the other R-1 pods of attempt 1 are gone (the failed one stays for its logs) and
that each run's status counts restarts 1 and preemptions 0, and counts the ERROR and WARNING
lines the operator logged meanwhile. Its own section of the markdown.

    .venv/bin/python -m tests.bench_operator [--runs 500[,1000,...]] [--replicas 1] [--rate 20]
        [--write docs/benchmarks.md]

Uses the local environment (``make cluster``), starting it when it is not up, in a namespace of
its own. Every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client, config
from kubernetes.watch.watch import iter_resp_lines

from tests import localenv
from tests.benchutil import cpu_by_name, cpu_seconds, stamped, write_section
from tests.integration.support import (
    OperatorProcess,
    container_status,
    credentials_secret,
    trainingrun,
)
from trainingrun import api
from trainingrun.checkpoint.progress import PROGRESS_RECORD, ProgressRecord, encode
from trainingrun.operator.settings import OperatorSettings

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Operator: failed attempt to replacement pod"
GANG_SECTION = "## Operator: failed gang member to the next attempt's pods"
# Their sections of docs/benchmarks.md (benchutil.markers)
NAME, GANG_NAME = "operator", "operator-gang"
OPERATOR_LOG = REPO / "out" / "bench-operator.log"  # appended to, run after run
EXITED = {"terminated": {"exitCode": 1, "reason": "Error"}}
REPLACEMENTS = "trainingrun.dev/attempt=2"
# The other processes on the machine while the failures are handled, by command name (cut at 15
# characters): the control plane, the kwok controller that plays the kubelets, and SeaweedFS.
BESIDE = frozenset(
    {"etcd", "kube-apiserver", "kube-controller", "kube-scheduler", "kwok-controller", "weed"}
)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def pod_name(run: str, attempt: int, rank: int, replicas: int) -> str:
    """The operator's name for a pod: ``<run>-<attempt>``, or ``<run>-<attempt>-<rank>``."""
    return f"{run}-{attempt}" if replicas == 1 else f"{run}-{attempt}-{rank}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[500],
        help="fleet sizes, comma-separated: each is measured in turn",
    )
    parser.add_argument(
        "--replicas", type=int, default=1, help="pods per attempt (spec.replicas) of every run"
    )
    parser.add_argument(
        "--nodes", type=int, default=20, help="kwok nodes at least; raised to --replicas"
    )
    parser.add_argument(
        "--pods-per-node",
        type=int,
        default=50,
        help="more kwok nodes for a larger fleet: at least runs x replicas / this many",
    )
    parser.add_argument("--rate", type=float, default=20.0, help="failures injected per second")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the failed member's rank (replicas > 1)"
    )
    parser.add_argument(
        "--resync", type=float, default=30.0, help="operator resync interval (s) during the run"
    )
    parser.add_argument(
        "--resync-rate",
        type=float,
        default=OperatorSettings.resync_rate,
        help="operator's bound on periodic passes a second (TRAININGRUN_RESYNC_RATE)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="bound on each fleet size's run up to the replacements (s)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=180.0,
        help="replicas > 1: bound on the wait for attempt 1's other pods to go and the counters",
    )
    parser.add_argument(
        "--progress",
        type=float,
        default=0.0,
        help="publish a progress record for every run (as rank 0's sidecar does) and count "
        "the operator's reads of them over this many seconds before the failures (0: off)",
    )
    parser.add_argument(
        "--write", type=Path, help="replace the operator section of this markdown file"
    )
    args = parser.parse_args(argv)
    if min(args.runs) < 1 or args.replicas < 1 or args.rate <= 0 or args.pods_per_node < 1:
        parser.error("--runs, --replicas and --pods-per-node must be at least 1, --rate above 0")
    if args.replicas > 1 and len(args.runs) > 1:
        parser.error("gangs (--replicas above 1) are measured at one fleet size")
    # The operator's anti-affinity puts the pods of one attempt on distinct nodes.
    args.nodes = max(args.nodes, args.replicas)
    return args


@dataclass
class Cluster:
    """The bench's handles on the local environment and what it created there."""

    env: localenv.LocalEnv
    core: client.CoreV1Api
    custom: client.CustomObjectsApi
    ns: str
    nodes: list[str] = field(default_factory=list)


def set_up(node_count: int) -> Cluster:
    env = localenv.up()
    env.kubectl("apply", "-f", str(REPO / "crds" / "trainingrun.yaml"))
    env.wait_established("trainingruns.trainingrun.dev")
    api_client = config.new_client_from_config(config_file=env.kubeconfig)
    core = client.CoreV1Api(api_client)
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    cluster = Cluster(env, core, client.CustomObjectsApi(api_client), ns)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=cluster.ns)))
    core.create_namespaced_secret(cluster.ns, credentials_secret(env))
    for i in range(node_count):
        name = f"bench-{cluster.ns}-{i}"
        core.create_node(
            client.V1Node(
                metadata=client.V1ObjectMeta(
                    name=name,
                    annotations={localenv.KWOK_NODE_ANNOTATION: "fake"},
                    labels={"type": "kwok", "bench": cluster.ns},
                ),
            )
        )
        cluster.nodes.append(name)
    return cluster


def tear_down(cluster: Cluster) -> None:
    core, ns = cluster.core, cluster.ns
    core.delete_namespace(ns)
    # Wait for the namespace to go, so a following run does not share the machine with it.
    gone_by = time.monotonic() + 300
    while time.monotonic() < gone_by:
        try:
            core.read_namespace(ns)
        except client.ApiException:
            break
        time.sleep(2)
    for n in cluster.nodes:
        with contextlib.suppress(client.ApiException):
            core.delete_node(n)


def start_operator(cluster: Cluster, resync: float, resync_rate: float) -> OperatorProcess:
    OPERATOR_LOG.parent.mkdir(exist_ok=True)
    op = OperatorProcess(
        cluster.env,
        OPERATOR_LOG,
        metrics_port=localenv.free_ports(1)[0],
        extra_env={
            "TRAININGRUN_RESYNC_SECONDS": str(resync),
            "TRAININGRUN_RESYNC_RATE": str(resync_rate),
            "TRAININGRUN_CHECKPOINT_REFRESH_SECONDS": str(resync),
        },
    )
    op.start()
    return op


class ReplacementWatch:
    """First sight, by pod name, of each attempt-2 pod in a watch of the namespace."""

    def __init__(self, cluster: Cluster, deadline: float) -> None:
        self.created_at: dict[str, float] = {}
        self._cluster = cluster
        self._deadline = deadline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        # Only replacement pods, as plain JSON: the client's models cost milliseconds a pod, and a
        # watcher that falls behind would count its own lag as the operator's. One list, then
        # short watches that go on from the last resourceVersion (a list again only when the
        # server no longer has it), so nothing is missed and nothing is parsed twice.
        version = ""
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            if not version:
                version = self._list()
            resp = self._cluster.core.list_namespaced_pod(
                self._cluster.ns,
                label_selector=REPLACEMENTS,
                watch=True,
                resource_version=version,
                timeout_seconds=5,
                _preload_content=False,
            )
            try:
                for line in iter_resp_lines(resp):
                    now = time.monotonic()
                    event = json.loads(line)
                    if event["type"] == "ERROR":  # 410: the version is too old
                        version = ""
                        break
                    meta = event["object"]["metadata"]
                    version = meta["resourceVersion"]
                    if event["type"] == "ADDED":
                        self.created_at.setdefault(meta["name"], now)
                    if self._stop.is_set():
                        break
            finally:
                resp.close()
                resp.release_conn()

    def _list(self) -> str:
        resp = self._cluster.core.list_namespaced_pod(
            self._cluster.ns, label_selector=REPLACEMENTS, _preload_content=False
        )
        now, listed = time.monotonic(), json.loads(resp.data)
        for pod in listed["items"]:
            self.created_at.setdefault(pod["metadata"]["name"], now)
        return str(listed["metadata"]["resourceVersion"])


def create_runs(cluster: Cluster, names: list[str], replicas: int) -> None:
    t0 = time.monotonic()
    for name in names:
        body = trainingrun(
            name,
            cluster.env,
            f"bench-{cluster.ns}",
            restart_policy={
                "maxRestarts": 10,
                "crashLoopLimit": 10,
                "backoff": {"initialSeconds": 0, "maxSeconds": 0},
            },
        )
        body["spec"]["template"]["spec"]["nodeSelector"] = {"bench": cluster.ns}
        if replicas > 1:
            body["spec"]["replicas"] = replicas
        cluster.custom.create_namespaced_custom_object(
            api.GROUP, api.VERSION, cluster.ns, api.PLURAL, body
        )
    print(f"created {len(names)} TrainingRuns in {time.monotonic() - t0:.1f}s", flush=True)


def wait_attempt_1_running(cluster: Cluster, expected: int, t0: float, deadline: float) -> None:
    def running() -> int:
        # Raw JSON: the client's models of 5,000 pods take seconds of CPU on these cores.
        resp = cluster.core.list_namespaced_pod(
            cluster.ns, label_selector="trainingrun.dev/attempt=1", _preload_content=False
        )
        pods = json.loads(resp.data)["items"]
        return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")

    while (count := running()) < expected:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {count}/{expected} attempt-1 pods running before the timeout")
        print(f"  {count}/{expected} attempt-1 pods running", flush=True)
        time.sleep(3)
    print(f"all {expected} attempt-1 pods running after {time.monotonic() - t0:.1f}s", flush=True)


def inject_failures(
    cluster: Cluster, victims: dict[str, str], rate: float, deadline: float
) -> dict[str, float]:
    """Marks each run's victim pod Failed, at ``rate`` per second; when each write returned."""
    failed_at: dict[str, float] = {}
    interval = 1.0 / rate
    failed = {
        "status": {"phase": "Failed", "containerStatuses": [container_status("trainer", EXITED)]}
    }
    t_start = time.monotonic()
    for i, (run, pod) in enumerate(victims.items()):
        target = t_start + i * interval
        if target > deadline:
            raise SystemExit(f"timed out injecting failures ({i}/{len(victims)} done)")
        time.sleep(max(0.0, target - time.monotonic()))
        resp = cluster.core.patch_namespaced_pod_status(
            pod,
            cluster.ns,
            failed,
            _preload_content=False,
        )
        failed_at[run] = time.monotonic()
        resp.read()
        resp.release_conn()
    return failed_at


class ProgressPublisher:
    """Every run's sidecar publishing progress: a new record for each run every minute (a step
    further), spread over the minute, so that each read the operator makes finds a change and
    writes the status, as it would for a fleet that trains."""

    def __init__(self, cluster: Cluster, names: list[str]) -> None:
        self._cluster, self._names = cluster, names
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.puts = 0

    def start(self) -> None:
        self.publish_all(0)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def publish_all(self, minute: int) -> None:
        s3 = localenv.s3_client(self._cluster.env)
        start, pace = time.monotonic(), 60.0 / max(len(self._names), 1)
        for i, name in enumerate(self._names):
            if minute and self._stop.wait(max(0.0, start + i * pace - time.monotonic())):
                return
            now = time.time()
            step = 100 + i + 60 * minute
            record = ProgressRecord(step, 1, 0, now - step, now, total_steps=100_000)
            key = f"bench-{self._cluster.ns}/{self._cluster.ns}/{name}/{PROGRESS_RECORD}"
            s3.put_object(Bucket=self._cluster.env.bucket, Key=key, Body=encode(record))
            self.puts += 1

    def _loop(self) -> None:
        minute = 1
        while not self._stop.is_set():
            self.publish_all(minute)
            minute += 1


def progress_reads(op: OperatorProcess, seconds: float) -> float:
    """The operator's reads of progress records a second over ``seconds`` of steady state (its
    only plain GETs to the bucket then: the manifests are read with their ETag)."""

    def gets() -> float:
        return sum(
            v
            for k, v in op.metrics().items()
            if k.startswith("trainingrun_bucket_calls_total") and 'operation="get"' in k
        )

    before, t0 = gets(), time.monotonic()
    time.sleep(seconds)
    return (gets() - before) / (time.monotonic() - t0)


@dataclass
class Latencies:
    """Per run, in failure order, from its Failed write: to the first and to the last pod of
    attempt 2 seen (runs with all ``replicas`` pods seen only, for the last)."""

    first: list[float]
    all: list[float]
    missing: int  # runs without every pod of attempt 2 seen


def wait_replacements(
    seen: dict[str, float],
    names: list[str],
    failed_at: dict[str, float],
    replicas: int,
    deadline: float,
) -> Latencies:
    wanted = [pod_name(n, 2, r, replicas) for n in names for r in range(replicas)]
    while sum(1 for p in wanted if p in seen) < len(wanted) and time.monotonic() < deadline:
        time.sleep(0.5)
    first, last = [], []
    for n in names:
        times = [seen[p] for r in range(replicas) if (p := pod_name(n, 2, r, replicas)) in seen]
        if times:
            first.append(min(times) - failed_at[n])
        if len(times) == replicas:
            last.append(max(times) - failed_at[n])
    return Latencies(first, last, len(names) - len(last))


@dataclass
class GangCheck:
    """What is left of attempt 1 and what the runs' statuses say, once settled or timed out."""

    others_present: int  # pods of attempt 1 other than the failed one still there
    others_not_deleted: int  # of those, without a deletionTimestamp (never asked to go)
    victims_kept: int  # failed pods still there, for their logs
    counter_mismatches: int  # runs whose status is not restarts 1, preemptions 0
    seconds: float  # from the start of the check until settled (or the bound)


def check_gangs(cluster: Cluster, victims: dict[str, str], bound: float) -> GangCheck:
    t0 = time.monotonic()
    failed = set(victims.values())
    while True:
        pods = cluster.core.list_namespaced_pod(
            cluster.ns, label_selector="trainingrun.dev/attempt=1"
        ).items
        others = [p for p in pods if p.metadata.name not in failed]
        runs = cluster.custom.list_namespaced_custom_object(
            api.GROUP, api.VERSION, cluster.ns, api.PLURAL
        )["items"]
        counters = [
            ((r.get("status") or {}).get("restarts"), (r.get("status") or {}).get("preemptions"))
            for r in runs
        ]
        result = GangCheck(
            others_present=len(others),
            others_not_deleted=sum(1 for p in others if not p.metadata.deletion_timestamp),
            victims_kept=sum(1 for p in pods if p.metadata.name in failed),
            counter_mismatches=sum(1 for c in counters if c != (1, 0)) + len(victims) - len(runs),
            seconds=time.monotonic() - t0,
        )
        if (result.others_present == 0 and result.counter_mismatches == 0) or (
            result.seconds > bound
        ):
            return result
        time.sleep(2)


def by_fifth(ordered: list[float], q: float = 0.99) -> list[float]:
    """A percentile by fifth, in failure order: a tail that grows from fifth to fifth is a
    backlog, a flat one is not."""
    fifth = max(len(ordered) // 5, 1)
    chunks = [ordered[i : i + fifth] for i in range(0, fifth * 5, fifth)]
    return [percentile(chunk, q) for chunk in chunks if chunk]


def log_problems(path: Path, start: int) -> tuple[int, int]:
    """ERROR and WARNING lines the operator logged from byte ``start`` of its log on."""
    with path.open("rb") as f:
        f.seek(start)
        lines = f.read().decode(errors="replace").splitlines()
    return sum(1 for x in lines if " ERROR " in x), sum(1 for x in lines if " WARNING " in x)


@dataclass
class Calls:
    """The operator's calls while the failures were handled, per replacement."""

    reads: float  # GETs to the API server
    writes: float  # creates, patches, deletes to the API server, Events aside
    events: float  # Events handed to the poster (posted from its own thread)
    bucket: float  # calls to the runs' bucket
    detail: dict[str, float]  # per replacement, by "VERB resource" and "bucket operation"

    @property
    def api(self) -> float:
        return self.reads + self.writes + self.events


def calls_between(before: dict[str, float], after: dict[str, float], replacements: int) -> Calls:
    """Per replacement, from two scrapes of the operator's metrics page."""
    per = max(replacements, 1)
    reads = writes = events = bucket = 0.0
    detail: dict[str, float] = {}
    for sample, value in after.items():
        name, _, labels = sample.partition("{")
        n = (value - before.get(sample, 0.0)) / per
        found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if name == "trainingrun_transitions_total":
            # Events handed to the poster: its own thread may still be posting some.
            events += n
            continue
        if name == "trainingrun_bucket_calls_total":
            bucket += n
            label = f"bucket {found['operation']}"
        elif name == "trainingrun_api_calls_total":
            label = f"{found['verb']} {found['resource']}"
            if found["resource"].endswith("/events"):
                continue  # counted as handed over, above
            if found["verb"] == "GET":
                reads += n
            else:
                writes += n
        else:
            continue
        if n:
            detail[label] = n
    if events:
        detail["Events handed over"] = events
    return Calls(reads, writes, events, bucket, detail)


@dataclass
class Measured:
    """One fleet size's figures."""

    runs: int
    nodes: int
    lat: Latencies
    rss: float
    cpu_ms: float
    calls: Calls
    check: GangCheck | None = None
    problems: tuple[int, int] = (0, 0)
    beside_ms: dict[str, float] = field(default_factory=dict)  # CPU per replacement, by process


def single_lines(args: argparse.Namespace, sizes: list[Measured]) -> tuple[list[str], bool]:
    """A table row per fleet size and the targets: p99 <= 1 s over the whole sequence (every
    fifth), RSS <= 150 MB up to 1,000 runs; p99 <= 2 s and RSS <= 300 MB above; the CPU per
    replacement of the largest fleet within 1.2x of the smallest's."""
    lines = [
        f"Failures injected at {args.rate:g}/s; resync {args.resync:g} s, at most "
        f"{args.resync_rate:g} periodic passes a second. Calls are the "
        "operator's own, per replacement: API reads (GET), writes (create, patch, delete), "
        "Events, and bucket calls.",
        "",
        "| runs | kwok nodes | p50 | p99 | max | p99 by fifth of the failures | peak RSS "
        "| CPU per replacement | API reads / writes / Events | bucket calls | missing |",
        "|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|",
    ]
    ok = True
    for m in sizes:
        lat = m.lat.all
        p99 = percentile(lat, 0.99) if lat else float("inf")
        fifths = by_fifth(lat) if lat else []
        c = m.calls
        lines.append(
            f"| {m.runs} | {m.nodes} | {percentile(lat, 0.5) if lat else float('nan'):.3f} s "
            f"| {p99:.3f} s | {max(lat, default=float('nan')):.3f} s "
            f"| {', '.join(f'{v:.2f}' for v in fifths)} s | {m.rss:.0f} MB | {m.cpu_ms:.1f} ms "
            f"| {c.reads:.2f} / {c.writes:.2f} / {c.events:.2f} | {c.bucket:.2f} "
            f"| {m.lat.missing} |"
        )
    lines.append("")
    for m in sizes:
        lat = m.lat.all
        small = m.runs <= 1000
        p99_limit, rss_limit = (1.0, 150.0) if small else (2.0, 300.0)
        worst = max(by_fifth(lat), default=float("inf")) if lat else float("inf")
        met = worst <= p99_limit and m.rss <= rss_limit and m.lat.missing == 0
        ok &= met
        lines.append(
            f"- {m.runs} runs: p99 <= {p99_limit:g} s in every fifth, peak RSS <= "
            f"{rss_limit:g} MB, no replacement missing: " + ("met" if met else "NOT met")
        )
    if len(sizes) > 1:
        first, last = sizes[0], sizes[-1]
        ratio = last.cpu_ms / first.cpu_ms if first.cpu_ms else float("inf")
        met = ratio <= 1.2
        ok &= met
        lines.append(
            f"- CPU per replacement at {last.runs} runs = {ratio:.2f}x that at {first.runs} "
            "(target <= 1.2x): " + ("met" if met else "NOT met")
        )
    lines += [beside_line(args, m) for m in sizes if m.beside_ms]
    biggest = sizes[-1]
    lines.append(
        f"- the calls of one replacement at {biggest.runs} runs: "
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(biggest.calls.detail.items()))
    )
    return lines, ok


def beside_line(args: argparse.Namespace, m: Measured) -> str:
    """Where the machine's CPU went per replacement: the operator and every process beside it,
    against what the cores have for one replacement at the failure rate."""
    total = m.cpu_ms + sum(m.beside_ms.values())
    budget = 1000 * (os.cpu_count() or 1) / args.rate
    parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(m.beside_ms.items(), key=lambda kv: -kv[1]))
    return (
        f"- CPU per replacement by process at {m.runs} runs: operator {m.cpu_ms:.1f}, {parts} ms; "
        f"{total:.0f} ms in all, of the {budget:.0f} ms the {os.cpu_count()} cores have for one "
        f"replacement at {args.rate:g}/s"
    )


def figures(values: list[float]) -> str:
    if not values:
        return "none seen"
    return (
        f"p50 {percentile(values, 0.50):.3f} s, p99 {percentile(values, 0.99):.3f} s, "
        f"max {max(values):.3f} s, mean {statistics.mean(values):.3f} s"
    )


def gang_lines(args: argparse.Namespace, m: Measured) -> tuple[list[str], bool]:
    assert m.check is not None
    lat, rss, cpu_ms, check, problems = m.lat, m.rss, m.cpu_ms, m.check, m.problems
    r, others = args.replicas, m.runs * (args.replicas - 1)
    p99 = percentile(lat.all, 0.99) if lat.all else float("inf")
    clean = lat.missing == 0 and check.others_present == 0 and check.counter_mismatches == 0
    lines = [
        f"- runs: {m.runs} of {r} pods (spec.replicas {r}) on {m.nodes} kwok nodes; "
        f"one member of each run (rank drawn with seed {args.seed}) failed at {args.rate:g}/s",
        f"- failed member to all {r} pods of the next attempt: {figures(lat.all)}; "
        f"runs without all {r}: {lat.missing}",
        f"- failed member to the first pod of the next attempt: {figures(lat.first)}",
        "- to all pods by fifth of the failures, in order: p50 "
        + ", ".join(f"{v:.2f}" for v in by_fifth(lat.all, 0.50))
        + " s; p99 "
        + ", ".join(f"{v:.2f}" for v in by_fifth(lat.all))
        + " s",
        f"- operator peak RSS (VmHWM): {rss:.0f} MB; operator CPU per replacement "
        f"(a gang of {r}): {cpu_ms:.1f} ms",
        f"- other pods of attempt 1 still there: {check.others_present} of {others} "
        f"({check.others_not_deleted} not asked to go), checked {check.seconds:.0f} s after "
        f"the replacements; failed pods kept for their logs: {check.victims_kept} of {m.runs}",
        f"- runs whose status is not restarts 1, preemptions 0: {check.counter_mismatches}",
        f"- operator log of the run: {problems[0]} ERROR lines, {problems[1]} WARNING lines",
        f"- operator calls per replacement (a gang of {r}): API reads {m.calls.reads:.2f}, "
        f"writes {m.calls.writes:.2f}, Events {m.calls.events:.2f}; bucket {m.calls.bucket:.2f}",
        "- targets (those of replicas 1, on all pods): p99 <= 2 s, RSS <= 200 MB, nothing left "
        "over, counters right: " + ("met" if clean and p99 <= 2 and rss <= 200 else "NOT met"),
    ]
    return lines, clean


def write(path: Path, name: str, section: str, argv: list[str] | None, lines: list[str]) -> None:
    """Replaces this benchmark's section of ``path`` (``name``'s markers)."""
    cmd = "python -m tests.bench_operator " + " ".join(argv if argv is not None else sys.argv[1:])
    text = f"{section}\n\nCommand: `{cmd.strip()}`\n\n" + "\n".join(lines) + "\n"
    write_section(path, name, stamped(text, "Local kwok control plane and SeaweedFS."))


def measure(args: argparse.Namespace, runs: int) -> Measured:
    """One fleet size: set up, attempt 1 running everywhere, the failures, the replacements."""
    deadline = time.monotonic() + args.timeout
    nodes = max(args.nodes, -(-runs * args.replicas // args.pods_per_node))
    cluster = set_up(nodes)
    log_from = OPERATOR_LOG.stat().st_size if OPERATOR_LOG.exists() else 0
    op = start_operator(cluster, args.resync, args.resync_rate)
    assert op.proc is not None
    watcher = ReplacementWatch(cluster, deadline)
    check = None
    publisher: ProgressPublisher | None = None
    try:
        names = [f"r{i:04d}" for i in range(runs)]
        t0 = time.monotonic()
        create_runs(cluster, names, args.replicas)
        wait_attempt_1_running(cluster, runs * args.replicas, t0, deadline)
        if args.progress:
            publisher = ProgressPublisher(cluster, names)
            publisher.start()
            reads = progress_reads(op, args.progress)
            print(f"progress reads: {reads:.2f}/s over {args.progress:g} s", flush=True)
        watcher.start()
        time.sleep(1)

        rng = random.Random(args.seed)
        victims = {n: pod_name(n, 1, rng.randrange(args.replicas), args.replicas) for n in names}
        cpu_before, calls_before = cpu_seconds(op.proc.pid), op.metrics()
        beside_before, bench_before = cpu_by_name(BESIDE), cpu_seconds(os.getpid())
        failed_at = inject_failures(cluster, victims, args.rate, deadline)
        lat = wait_replacements(watcher.created_at, names, failed_at, args.replicas, deadline)
        rss = peak_rss_mb(op.proc.pid)
        replacements = max(len(lat.all), 1)
        cpu_ms = (cpu_seconds(op.proc.pid) - cpu_before) * 1000 / replacements
        beside = {
            name: (cpu - beside_before.get(name, 0.0)) * 1000 / replacements
            for name, cpu in cpu_by_name(BESIDE).items()
        }
        beside["this benchmark"] = (cpu_seconds(os.getpid()) - bench_before) * 1000 / replacements
        calls = calls_between(calls_before, op.metrics(), replacements)
        if args.replicas > 1:
            check = check_gangs(cluster, victims, args.settle)
    finally:
        watcher.stop()
        if publisher is not None:
            publisher.stop()
        op.stop()
        tear_down(cluster)
    problems = log_problems(OPERATOR_LOG, log_from)
    return Measured(runs, nodes, lat, rss, cpu_ms, calls, check, problems, beside)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = []
    for runs in args.runs:
        m = measure(args, runs)
        print(
            f"{runs} runs: p99 {percentile(m.lat.all, 0.99) if m.lat.all else float('inf'):.3f} s,"
            f" RSS {m.rss:.0f} MB, CPU per replacement {m.cpu_ms:.1f} ms, API calls per "
            f"replacement {m.calls.api:.2f}, bucket calls {m.calls.bucket:.2f}",
            flush=True,
        )
        for what, n in sorted(m.calls.detail.items()):
            print(f"  {n:6.2f}  {what}", flush=True)
        if m.beside_ms:
            print(beside_line(args, m), flush=True)
        sizes.append(m)
    if args.replicas > 1:
        lines, ok = gang_lines(args, sizes[0])
    else:
        lines, ok = single_lines(args, sizes)
    print("\n".join(lines))
    if args.write:
        if args.replicas == 1:
            write(args.write, NAME, SECTION, argv, lines)
        else:
            write(args.write, GANG_NAME, GANG_SECTION, argv, lines)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
