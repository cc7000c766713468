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

With ``--progress SECONDS`` every run's sidecar publishes a progress record that changes each
minute, and the operator's progress reads a second are counted over SECONDS of steady state
before the failures. ``--compare-progress`` measures, in one invocation so that the ratios come
from one state of a shared machine, the first fleet size three times, each with a fresh
operator: without progress, with it, and with it while a share of the runs (``--hostile``)
publish hostile records instead (100 MB, just under the store's cap, random bytes, a step of
10^18, NaN and infinite rates); then each further size with progress on, for its reads a second.
It checks that no hostile run's status shows a figure of its record while the good runs'
progress moves, and writes its own section of the markdown.

    .venv/bin/python -m tests.bench_operator [--runs 500[,1000,...]] [--replicas 1] [--rate 20]
        [--progress SECONDS [--compare-progress [--hostile 0.1]]] [--write docs/benchmarks.md]

Uses the local environment (``make cluster``), starting it when it is not up, in a namespace of
its own. Every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
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
from typing import Any

from kubernetes import client, config
from kubernetes.watch.watch import iter_resp_lines

from tests import localenv
from tests.benchutil import cpu_seconds, stamped, write_section
from tests.integration.support import (
    OperatorProcess,
    container_status,
    credentials_secret,
    trainingrun,
)
from trainingrun import api
from trainingrun.checkpoint.progress import PROGRESS_RECORD, ProgressRecord, encode
from trainingrun.operator.settings import OperatorSettings
from trainingrun.storage.base import MAX_GET_BYTES

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Operator: failed attempt to replacement pod"
GANG_SECTION = "## Operator: failed gang member to the next attempt's pods"
PROGRESS_SECTION = "## Operator: progress reporting on and off, and hostile records"
# Their sections of docs/benchmarks.md (benchutil.markers)
NAME, GANG_NAME, PROGRESS_NAME = "operator", "operator-gang", "operator-progress"
OPERATOR_LOG = REPO / "out" / "bench-operator.log"  # appended to, run after run
EXITED = {"terminated": {"exitCode": 1, "reason": "Error"}}
REPLACEMENTS = "trainingrun.dev/attempt=2"
# The other processes on the machine while the failures are handled, by command name (cut at 15
# characters): the control plane, the kwok controller that plays the kubelets, and SeaweedFS.
BESIDE = frozenset(
    {"etcd", "kube-apiserver", "kube-controller", "kube-scheduler", "kwok-controller", "weed"}
)
# The machine's CPU outside this environment (other checkouts' builds and tests).
OTHER_WORK = "other work on the machine"
# Hostile progress records (--hostile): what a trainer, or anyone who can write to the run's
# prefix, might put where the sidecar puts its ~250 bytes. All but the NaN rates are refused
# whole; a record with NaN, infinite or negative rates is shown without them.
HUGE, BIG, GARBAGE, STEP, NAN = "huge", "big", "garbage", "step", "nan"
HOSTILE_KINDS = (HUGE, BIG, GARBAGE, STEP, NAN)
HOSTILE_WORDS = {
    HUGE: f"100 MB, over the store's {MAX_GET_BYTES >> 20} MiB cap",
    BIG: f"{(MAX_GET_BYTES >> 20) - 1} MiB of JSON, under it",
    GARBAGE: "1 KiB of random bytes",
    STEP: "a step of 10^18",
    NAN: "NaN, infinite or negative rates",
}
HUGE_BYTES = 100_000_000
BIG_BYTES = MAX_GET_BYTES - (1 << 20)
# 100 MB objects put into SeaweedFS, at most: 1 GB of the machine's disk.
HUGE_RUNS = 10
# Put once, when the publisher starts; the others are put again each minute.
PUT_ONCE = frozenset({HUGE, BIG})
# Bound on the wait for the replacements' status writes after their pods.
SHOWN_SETTLE = 60.0


def env_cpu_by_name(names: frozenset[str], env_name: str) -> dict[str, float]:
    """CPU seconds so far of this environment's processes whose command name is in ``names``,
    summed by name. Only this environment's: another checkout's environment on the machine runs
    the same programs, and its paths name its own environment (``tr-<hash>``)."""
    totals: dict[str, float] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            comm = (proc / "comm").read_text().strip()
            if comm in names and env_name in (proc / "cmdline").read_text(errors="replace"):
                totals[comm] = totals.get(comm, 0.0) + cpu_seconds(int(proc.name))
        except OSError:  # gone meanwhile
            continue
    return totals


def machine_busy_seconds(stat: Path = Path("/proc/stat")) -> float:
    """CPU seconds every core of the machine spent busy so far (all but idle and I/O wait)."""
    ticks = [int(t) for t in stat.read_text().splitlines()[0].split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    # guest time is counted in user time already
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


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
        "--compare-progress",
        action="store_true",
        help="the first --runs size without progress, with it, and with it and hostile records "
        "(--hostile), each size after with progress on; needs --progress",
    )
    parser.add_argument(
        "--hostile",
        type=float,
        default=0.1,
        help="--compare-progress: share of the runs that publish hostile records instead",
    )
    parser.add_argument(
        "--write", type=Path, help="replace the operator section of this markdown file"
    )
    args = parser.parse_args(argv)
    if min(args.runs) < 1 or args.replicas < 1 or args.rate <= 0 or args.pods_per_node < 1:
        parser.error("--runs, --replicas and --pods-per-node must be at least 1, --rate above 0")
    if args.replicas > 1 and len(args.runs) > 1:
        parser.error("gangs (--replicas above 1) are measured at one fleet size")
    if args.compare_progress and (args.progress <= 0 or args.replicas > 1):
        parser.error("--compare-progress needs --progress SECONDS and one pod per run")
    if not 0 < args.hostile < 1:
        parser.error("--hostile is a share of the runs, above 0 and below 1")
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
            # The product's, not the integration tests' 1 s: the reads are those of a fleet.
            "TRAININGRUN_PROGRESS_REFRESH_SECONDS": str(OperatorSettings.progress_refresh_seconds),
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


def good_step(index: int, minute: int) -> int:
    """The step the ``index``-th run's record says in the publisher's ``minute``."""
    return 100 + index + 60 * minute


def good_record(index: int, minute: int, now: float) -> ProgressRecord:
    step = good_step(index, minute)
    return ProgressRecord(step, 1, 0, now - step, now, total_steps=100_000)


def hostile_plan(names: list[str], share: float, huge_at_most: int = HUGE_RUNS) -> dict[str, str]:
    """The runs that publish hostile records, spread evenly over ``names`` (so over the
    failures, which go in name order), and the kind each publishes: every kind in turn, the
    100 MB one at most ``huge_at_most`` times."""
    count = round(len(names) * share)
    if count < 1:
        return {}
    stride = len(names) / count
    picked = [names[int((j + 1) * stride) - 1] for j in range(count)]
    others = [k for k in HOSTILE_KINDS if k != HUGE]
    plan, huge, turn = {}, 0, 0
    for j, name in enumerate(picked):
        if j % len(HOSTILE_KINDS) == 0 and huge < huge_at_most:
            plan[name], huge = HUGE, huge + 1
        else:
            plan[name], turn = others[turn % len(others)], turn + 1
    return plan


def hostile_body(kind: str, index: int, minute: int, now: float) -> bytes:
    """What the ``index``-th run, a hostile one of ``kind``, publishes in ``minute``."""
    if kind == HUGE:
        return bytes(HUGE_BYTES)
    if kind == BIG:
        # A well-formed record padded to just under the store's cap: the store reads it whole.
        raw = dict(json.loads(encode(good_record(index, minute, now))), pad="")
        raw["pad"] = "x" * (BIG_BYTES - len(json.dumps(raw)))
        return json.dumps(raw).encode()
    if kind == GARBAGE:
        return random.Random(f"{index}/{minute}").randbytes(1024)
    if kind == STEP:
        return encode(ProgressRecord(10**18 + minute, 1, 0, now - 100, now, total_steps=100_000))
    if kind == NAN:
        # json writes them as NaN, Infinity and -Infinity, which Python's json reads back.
        samples, tokens = (math.nan, math.inf) if index % 2 else (-math.inf, -5.0)
        step = good_step(index, minute)
        return encode(
            ProgressRecord(
                step,
                1,
                0,
                now - step,
                now,
                total_steps=100_000,
                samples_per_second=samples,
                tokens_per_second=tokens,
            )
        )
    raise ValueError(f"no hostile record of kind {kind!r}")


class ProgressPublisher:
    """Every run's sidecar publishing progress: a new record for each run every minute (a step
    further), spread over the minute, so that each read the operator makes finds a change and
    writes the status, as it would for a fleet that trains. The runs in ``hostile`` publish
    their kind of hostile record instead: the large ones once, the others each minute."""

    def __init__(
        self, cluster: Cluster, names: list[str], hostile: dict[str, str] | None = None
    ) -> None:
        self._cluster, self._names = cluster, names
        self._hostile = hostile or {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.puts = 0

    def start(self) -> None:
        self.publish_once()
        self.publish_all(0)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _key(self, name: str) -> str:
        return f"bench-{self._cluster.ns}/{self._cluster.ns}/{name}/{PROGRESS_RECORD}"

    def publish_once(self) -> None:
        s3 = localenv.s3_client(self._cluster.env)
        bodies: dict[str, bytes] = {}
        for i, name in enumerate(self._names):
            kind = self._hostile.get(name)
            if kind in PUT_ONCE:
                body = bodies.setdefault(kind, hostile_body(kind, i, 0, time.time()))
                s3.put_object(Bucket=self._cluster.env.bucket, Key=self._key(name), Body=body)
                self.puts += 1

    def publish_all(self, minute: int) -> None:
        s3 = localenv.s3_client(self._cluster.env)
        start, pace = time.monotonic(), 60.0 / max(len(self._names), 1)
        for i, name in enumerate(self._names):
            if minute and self._stop.wait(max(0.0, start + i * pace - time.monotonic())):
                return
            kind, now = self._hostile.get(name), time.time()
            if kind in PUT_ONCE:
                continue
            body = (
                hostile_body(kind, i, minute, now) if kind else encode(good_record(i, minute, now))
            )
            s3.put_object(Bucket=self._cluster.env.bucket, Key=self._key(name), Body=body)
            self.puts += 1

    def _loop(self) -> None:
        minute = 1
        while not self._stop.is_set():
            self.publish_all(minute)
            minute += 1


@dataclass
class Rest:
    """The operator at steady state before the failures, a second over ``seconds``."""

    seconds: float
    progress_reads: float  # its plain GETs to the bucket (the manifests are read with an ETag)
    status_writes: float  # PATCHes of the runs' status
    cpu_ms: float  # its CPU


def rest_between(
    before: dict[str, float], after: dict[str, float], seconds: float, cpu_seconds_used: float
) -> Rest:
    """A second, from two scrapes of the operator's metrics page ``seconds`` apart."""

    def grown(wanted: str, *labels: str) -> float:
        return sum(
            v - before.get(k, 0.0)
            for k, v in after.items()
            if k.startswith(wanted + "{") and all(label in k for label in labels)
        )

    per = max(seconds, 1e-9)
    reads = grown("trainingrun_bucket_calls_total", 'operation="get"')
    writes = grown("trainingrun_api_calls_total", 'verb="PATCH"', "trainingruns", '/status"')
    return Rest(seconds, reads / per, writes / per, cpu_seconds_used * 1000 / per)


def at_rest(op: OperatorProcess, seconds: float) -> Rest:
    """The operator's progress reads, status writes and CPU a second over ``seconds``."""
    assert op.proc is not None
    t0, cpu0, before = time.monotonic(), cpu_seconds(op.proc.pid), op.metrics()
    time.sleep(seconds)
    t1, cpu1, after = time.monotonic(), cpu_seconds(op.proc.pid), op.metrics()
    return rest_between(before, after, t1 - t0, cpu1 - cpu0)


@dataclass
class Shown:
    """What the runs' statuses show of their progress records."""

    good: int  # runs that publish well-formed records
    good_shown: int  # of those, showing progress
    good_moved: int  # of those, showing a step published after their first
    nan: int  # runs whose records have NaN, infinite or negative rates
    nan_shown: int  # of those, showing their step (their rates dropped)
    refused: int  # runs whose records are refused whole
    wrong: list[str] = field(default_factory=list)  # runs that show what no valid record said


def check_shown(
    statuses: dict[str, dict[str, Any]],
    names: list[str],
    plan: dict[str, str],
) -> Shown:
    """Reads each run's status against what it published: a well-formed record (or one with
    NaN rates) shows a step the run published, without the bad rates; a refused one shows no
    progress, and no step in the run's attempts either (the goodput ledger's)."""
    shown = Shown(0, 0, 0, 0, 0, 0)
    for i, name in enumerate(names):
        status = statuses.get(name) or {}
        progress = status.get("progress")
        kind = plan.get(name)
        if kind not in (None, NAN):
            shown.refused += 1
            steps = [
                a
                for a in status.get("attempts") or []
                if a.get("firstStep") is not None or a.get("lastStep") is not None
            ]
            if progress is not None or steps:
                shown.wrong.append(name)
            continue
        step, first = (progress or {}).get("step"), good_step(i, 0)
        # The steps the publisher gives this run: its first, then one more minute's each time.
        ours = isinstance(step, int) and step >= first and (step - first) % 60 == 0
        rates = progress is not None and (
            progress.get("samplesPerSecond") is not None
            or progress.get("tokensPerSecond") is not None
        )
        if progress is not None and (not ours or (kind == NAN and rates)):
            shown.wrong.append(name)
        moved = ours and step != first
        if kind == NAN:
            shown.nan += 1
            shown.nan_shown += progress is not None
        else:
            shown.good += 1
            shown.good_shown += progress is not None
            shown.good_moved += moved
    return shown


def settled_shown(cluster: Cluster, names: list[str], plan: dict[str, str], bound: float) -> Shown:
    """The statuses once every good run shows a step past its first, or after ``bound``
    seconds: the pass that creates a replacement reads the run's newest record (an attempt's
    end reads it whatever the interval) and writes the status just after the pod."""
    give_up = time.monotonic() + bound
    while True:
        shown = check_shown(run_statuses(cluster), names, plan)
        if shown.good_moved == shown.good or time.monotonic() > give_up:
            return shown
        time.sleep(2)


def run_statuses(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """Every run's status, by name, as plain JSON."""
    resp = cluster.custom.list_namespaced_custom_object(
        api.GROUP, api.VERSION, cluster.ns, api.PLURAL, _preload_content=False
    )
    items = json.loads(resp.data)["items"]
    return {r["metadata"]["name"]: r.get("status") or {} for r in items}


REFUSAL = re.compile(r"[\w.-]+/([\w.-]+): no progress shown: (.*)$")


def refusals(lines: list[str], plan: dict[str, str]) -> tuple[dict[str, int], list[str]]:
    """The operator's "no progress shown" log lines: how many for each reason (object names
    left out), and the runs they name that published well-formed records."""
    reasons: dict[str, int] = {}
    others: list[str] = []
    for line in lines:
        found = REFUSAL.search(line)
        if not found:
            continue
        run, why = found.groups()
        why = re.sub(r"\S+://\S+", "the object", why)
        reasons[why] = reasons.get(why, 0) + 1
        if plan.get(run) in (None, NAN):
            others.append(run)
    return reasons, others


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
    variant: Variant | None = None
    load: float = float("nan")  # the machine's 1-minute load as the failures began
    rest: Rest | None = None  # with --progress: the steady state before the failures
    # With progress published: the statuses after the steady state, and after the replacements
    # (whose passes read each run's record at its attempt's end).
    shown: Shown | None = None
    shown_after: Shown | None = None
    hostile_lat: Latencies | None = None  # the replacements of the hostile runs alone
    reasons: dict[str, int] = field(default_factory=dict)  # "no progress shown", by reason
    refused_good: list[str] = field(default_factory=list)  # runs refused that should not be


@dataclass(frozen=True)
class Variant:
    """What the runs publish in one measurement: nothing, progress, or progress with a share of
    hostile records."""

    progress: bool = False
    hostile: float = 0.0

    def label(self) -> str:
        if not self.progress:
            return "progress off"
        if not self.hostile:
            return "progress on"
        return f"progress on, {self.hostile:.0%} of runs hostile"


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
    ours = {k: v for k, v in m.beside_ms.items() if k != OTHER_WORK}
    total = m.cpu_ms + sum(ours.values())
    budget = 1000 * (os.cpu_count() or 1) / args.rate
    parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(ours.items(), key=lambda kv: -kv[1]))
    other = m.beside_ms.get(OTHER_WORK)
    beside = f"; {OTHER_WORK} {other:.0f} ms" if other is not None else ""
    return (
        f"- CPU per replacement by process at {m.runs} runs: operator {m.cpu_ms:.1f}, {parts} ms; "
        f"{total:.0f} ms in all{beside}, of the {budget:.0f} ms the {os.cpu_count()} cores have "
        f"for one replacement at {args.rate:g}/s"
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


def measure(args: argparse.Namespace, runs: int, variant: Variant) -> Measured:
    """One fleet size: set up, attempt 1 running everywhere, the steady state (with
    ``--progress``), the failures, the replacements."""
    deadline = time.monotonic() + args.timeout
    nodes = max(args.nodes, -(-runs * args.replicas // args.pods_per_node))
    print(f"{runs} runs, {variant.label()}: load {os.getloadavg()[0]:.2f}", flush=True)
    cluster = set_up(nodes)
    log_from = OPERATOR_LOG.stat().st_size if OPERATOR_LOG.exists() else 0
    op = start_operator(cluster, args.resync, args.resync_rate)
    assert op.proc is not None
    watcher = ReplacementWatch(cluster, deadline)
    check = rest = shown = shown_after = hostile_lat = None
    publisher: ProgressPublisher | None = None
    try:
        names = [f"r{i:04d}" for i in range(runs)]
        plan = hostile_plan(names, variant.hostile) if variant.hostile else {}
        t0 = time.monotonic()
        create_runs(cluster, names, args.replicas)
        wait_attempt_1_running(cluster, runs * args.replicas, t0, deadline)
        if variant.progress:
            publisher = ProgressPublisher(cluster, names, plan)
            publisher.start()
        if args.progress:
            rest = at_rest(op, args.progress)
            print(
                f"at rest over {rest.seconds:.0f} s: {rest.progress_reads:.2f} progress reads/s, "
                f"{rest.status_writes:.2f} status writes/s, operator CPU {rest.cpu_ms:.0f} ms/s",
                flush=True,
            )
        if publisher is not None:
            shown = check_shown(run_statuses(cluster), names, plan)
            print(f"statuses at rest: {shown}", flush=True)
        watcher.start()
        time.sleep(1)

        load = os.getloadavg()[0]
        rng = random.Random(args.seed)
        victims = {n: pod_name(n, 1, rng.randrange(args.replicas), args.replicas) for n in names}
        cpu_before, calls_before = cpu_seconds(op.proc.pid), op.metrics()
        beside_before = env_cpu_by_name(BESIDE, cluster.env.name)
        bench_before, machine_before = cpu_seconds(os.getpid()), machine_busy_seconds()
        failed_at = inject_failures(cluster, victims, args.rate, deadline)
        lat = wait_replacements(watcher.created_at, names, failed_at, args.replicas, deadline)
        rss = peak_rss_mb(op.proc.pid)
        replacements = max(len(lat.all), 1)
        cpu_ms = (cpu_seconds(op.proc.pid) - cpu_before) * 1000 / replacements
        beside = {
            name: (cpu - beside_before.get(name, 0.0)) * 1000 / replacements
            for name, cpu in env_cpu_by_name(BESIDE, cluster.env.name).items()
        }
        beside["this benchmark"] = (cpu_seconds(os.getpid()) - bench_before) * 1000 / replacements
        machine_ms = (machine_busy_seconds() - machine_before) * 1000 / replacements
        beside[OTHER_WORK] = max(machine_ms - cpu_ms - sum(beside.values()), 0.0)
        calls = calls_between(calls_before, op.metrics(), replacements)
        if plan:
            hostile = [n for n in names if n in plan]
            hostile_lat = wait_replacements(
                watcher.created_at, hostile, failed_at, args.replicas, deadline
            )
        if publisher is not None:
            shown_after = settled_shown(cluster, names, plan, SHOWN_SETTLE)
            print(f"statuses after the replacements: {shown_after}", flush=True)
        if args.replicas > 1:
            check = check_gangs(cluster, victims, args.settle)
    finally:
        watcher.stop()
        if publisher is not None:
            publisher.stop()
        op.stop()
        tear_down(cluster)
    problems = log_problems(OPERATOR_LOG, log_from)
    with OPERATOR_LOG.open("rb") as f:
        f.seek(log_from)
        reasons, refused_good = refusals(f.read().decode(errors="replace").splitlines(), plan)
    return Measured(
        runs,
        nodes,
        lat,
        rss,
        cpu_ms,
        calls,
        check,
        problems,
        beside,
        variant,
        load,
        rest,
        shown,
        shown_after,
        hostile_lat,
        reasons,
        refused_good,
    )


def progress_plan(args: argparse.Namespace) -> list[tuple[int, Variant]]:
    """What --compare-progress measures, in order: the first size off, on, and on with hostile
    records; each further size on."""
    first, *more = args.runs
    side_by_side = [Variant(), Variant(progress=True), Variant(True, args.hostile)]
    return [(first, v) for v in side_by_side] + [(n, Variant(progress=True)) for n in more]


def progress_lines(args: argparse.Namespace, done: list[Measured]) -> tuple[list[str], bool]:
    """One table for --compare-progress, and its targets: at the first size with progress on,
    p99 <= 0.5 s; at every size, progress reads under 20 a second and status writes at most one
    a minute per run; hostile records shown by no run, the good runs' progress moving, and the
    operator's memory, CPU and reaction as with progress alone."""
    lines = [
        f"Each row a fresh operator and namespace; resync {args.resync:g} s, at most "
        f"{args.resync_rate:g} periodic passes a second, progress read at most once a minute "
        "per run. With progress on, every run publishes a record whose step changes each "
        f"minute. At rest: {args.progress:g} s of steady state, then failures at {args.rate:g}/s; "
        "the latency is from a pod's failure to its replacement's creation. Load: the machine's "
        "1-minute load average as the failures began. Peak RSS and CPU are the operator's; at "
        "rest, a second: its CPU, its progress reads (GETs of the record, found or not) and its "
        "status writes.",
        "",
        "| runs | progress | load | p50 | p99 | max | peak RSS | CPU per replacement "
        "| operator CPU at rest | progress reads | status writes |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def row(runs: int, what: str, load: str, values: list[float], m: Measured | None) -> str:
        p50, p99, top = (
            (percentile(values, 0.5), percentile(values, 0.99), max(values))
            if values
            else (math.nan, math.inf, math.nan)
        )
        cells = [str(runs), what, load, f"{p50:.3f} s", f"{p99:.3f} s", f"{top:.3f} s"]
        if m is None:
            cells += [""] * 5
        else:
            rest = m.rest or Rest(0, math.nan, math.nan, math.nan)
            cells += [
                f"{m.rss:.0f} MB",
                f"{m.cpu_ms:.1f} ms",
                f"{rest.cpu_ms:.0f} ms/s",
                f"{rest.progress_reads:.1f}/s",
                f"{rest.status_writes:.1f}/s",
            ]
        return "| " + " | ".join(cells) + " |"

    for m in done:
        assert m.variant is not None
        lines.append(row(m.runs, m.variant.label(), f"{m.load:.1f}", m.lat.all, m))
        if m.hostile_lat is not None:
            lines.append(row(m.runs, "of which the hostile runs", "", m.hostile_lat.all, None))
    lines.append("")
    ok = True

    def target(text: str, met: bool) -> None:
        nonlocal ok
        ok &= met
        lines.append(f"- {text}: " + ("met" if met else "NOT met"))

    first = done[0].runs
    on = [m for m in done if m.variant == Variant(progress=True)]
    off = next((m for m in done if m.variant == Variant()), None)
    hostile = next((m for m in done if m.variant and m.variant.hostile), None)
    for m in on:
        if m.runs == first:
            p99 = percentile(m.lat.all, 0.99) if m.lat.all else math.inf
            beside = f" (without progress {percentile(off.lat.all, 0.99):.3f} s)" if off else ""
            target(
                f"{m.runs} runs, progress on: p99 {p99:.3f} s <= 0.5 s{beside}, no replacement "
                f"missing ({m.lat.missing})",
                p99 <= 0.5 and m.lat.missing == 0,
            )
    published = [(m, m.rest) for m in done if m.rest and m.variant and m.variant.progress]
    target(
        "progress reads under 20 a second, status writes at most one a minute per run: "
        + "; ".join(
            f"{m.runs} runs, {m.variant.label() if m.variant else ''}: "
            f"{rest.progress_reads:.1f} and {rest.status_writes:.1f}/s "
            f"(at most {m.runs / 60:.1f}/s)"
            for m, rest in published
        ),
        all(
            rest.progress_reads < 20 and rest.status_writes <= m.runs / 60 for m, rest in published
        ),
    )
    checked = [(m, m.shown, m.shown_after) for m in done if m.shown and m.shown_after]
    wrong = sorted({name for _, a, b in checked for name in a.wrong + b.wrong})
    named = f" ({', '.join(wrong[:5])})" if wrong else ""
    target(
        f"statuses showing a figure no valid record of their own run gave: {len(wrong)}{named}; "
        "the well-formed runs' progress past their first record after the replacements: "
        + "; ".join(
            f"{b.good_moved} of {b.good} ({m.runs} runs, {m.variant.label() if m.variant else ''})"
            for m, _, b in checked
        ),
        not wrong and all(b.good_moved == b.good for _, _, b in checked),
    )
    if hostile is not None and hostile.shown_after is not None:
        after = hostile.shown_after
        kinds: dict[str, int] = {}
        for kind in hostile_plan([f"{i}" for i in range(hostile.runs)], args.hostile).values():
            kinds[kind] = kinds.get(kind, 0) + 1
        count = after.refused + after.nan
        logged = "; ".join(f"{why}: {n}" for why, n in sorted(hostile.reasons.items()))
        lines.append(
            f"- the hostile runs, {count} of {hostile.runs} (every {hostile.runs // max(count, 1)}"
            "th), published: " + "; ".join(f"{HOSTILE_WORDS[k]}: {n}" for k, n in kinds.items())
        )
        target(
            "hostile records change only their run's display: the refused ones show no progress "
            f"and no step in the goodput ledger ({after.refused} runs), the NaN-rate ones their "
            f"step without the rates ({after.nan_shown} of {after.nan}), no other run's record "
            f"is refused ({len(hostile.refused_good)}); the operator logs one line a refused "
            f"read: {logged or 'none'}",
            not after.wrong and not hostile.refused_good and after.nan_shown == after.nan,
        )
        base = next((m for m in on if m.runs == hostile.runs), None)
        if base is not None:
            p99 = percentile(hostile.lat.all, 0.99) if hostile.lat.all else math.inf
            rss, cpu = hostile.rss / base.rss, hostile.cpu_ms / base.cpu_ms
            target(
                f"with hostile records as with progress alone: peak RSS {rss:.2f}x "
                f"({hostile.rss - base.rss:+.0f} MB; <= 1.1x), CPU per replacement {cpu:.2f}x "
                f"(<= 1.2x), p99 {p99:.3f} s <= 0.5 s, no replacement missing "
                f"({hostile.lat.missing})",
                rss <= 1.1 and cpu <= 1.2 and p99 <= 0.5 and hostile.lat.missing == 0,
            )
    budget = 1000 * (os.cpu_count() or 1) / args.rate
    lines.append(
        "- CPU per replacement, this environment (operator, control plane, kwok, SeaweedFS, the "
        f"benchmark) + {OTHER_WORK}, against the {budget:.0f} ms the {os.cpu_count()} cores have "
        f"per replacement at {args.rate:g}/s (above it the replacements queue, whatever the "
        "operator does): "
        + "; ".join(
            f"{m.runs} runs, {m.variant.label() if m.variant else ''}: "
            f"{m.cpu_ms + sum(v for k, v in m.beside_ms.items() if k != OTHER_WORK):.0f} + "
            f"{m.beside_ms.get(OTHER_WORK, math.nan):.0f} ms"
            for m in done
        )
    )
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.compare_progress:
        plan = progress_plan(args)
    else:
        plan = [(runs, Variant(progress=args.progress > 0)) for runs in args.runs]
    sizes = []
    for runs, variant in plan:
        m = measure(args, runs, variant)
        print(
            f"{runs} runs: p99 by fifth of the failures "
            f"{', '.join(f'{v:.2f}' for v in by_fifth(m.lat.all))} s",
            flush=True,
        )
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
    if args.compare_progress:
        lines, ok = progress_lines(args, sizes)
    elif args.replicas > 1:
        lines, ok = gang_lines(args, sizes[0])
    else:
        lines, ok = single_lines(args, sizes)
    print("\n".join(lines))
    if args.write:
        if args.compare_progress:
            write(args.write, PROGRESS_NAME, PROGRESS_SECTION, argv, lines)
        elif args.replicas == 1:
            write(args.write, NAME, SECTION, argv, lines)
        else:
            write(args.write, GANG_NAME, GANG_SECTION, argv, lines)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
