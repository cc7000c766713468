"""Benchmark: how fast the operator replaces a failed attempt, with many TrainingRuns.

Creates N TrainingRuns (default 500) spread over kwok nodes, waits until every attempt-1 pod
runs, then marks those pods Failed one by one at a fixed rate (as a kubelet would) and measures,
for each, the time from the Failed status write to the replacement pod ``<run>-2`` appearing in
a watch. Reports p50, p99 and max of that latency, the operator process's peak RSS (VmHWM), and
the CPU time the operator spent while the failures were handled, per replacement (a figure the
other load on a shared machine disturbs less than the latency).

    .venv/bin/python -m tests.bench_operator [--runs 500] [--rate 20] [--write docs/benchmarks.md]

Uses the local environment (``make cluster``), starting it when it is not up. Every loop is
bounded in count and time.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

from kubernetes import client, config, watch

from tests import localenv
from tests.benchutil import cpu_seconds, write_section
from tests.integration.support import (
    OperatorProcess,
    container_status,
    credentials_secret,
    trainingrun,
)
from trainingrun import api

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Operator: failed attempt to replacement pod"


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--rate", type=float, default=20.0, help="failures injected per second")
    parser.add_argument(
        "--resync", type=float, default=30.0, help="operator resync interval (s) during the run"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="bound on the whole run (s)")
    parser.add_argument(
        "--write", type=Path, help="replace the operator section of this markdown file"
    )
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout

    env = localenv.up()
    env.kubectl("apply", "-f", str(REPO / "crds" / "trainingrun.yaml"))
    env.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "crd/trainingruns.trainingrun.dev"
    )
    api_client = config.new_client_from_config(config_file=env.kubeconfig)
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)

    ns = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    core.create_namespaced_secret(ns, credentials_secret(env))
    nodes = [f"bench-{ns}-{i}" for i in range(args.nodes)]
    for n in nodes:
        core.create_node(
            client.V1Node(
                metadata=client.V1ObjectMeta(
                    name=n,
                    annotations={localenv.KWOK_NODE_ANNOTATION: "fake"},
                    labels={"type": "kwok", "bench": ns},
                ),
            )
        )

    log_path = REPO / "out" / "bench-operator.log"
    log_path.parent.mkdir(exist_ok=True)
    op = OperatorProcess(
        env,
        log_path,
        extra_env={
            "TRAININGRUN_RESYNC_SECONDS": str(args.resync),
            "TRAININGRUN_CHECKPOINT_REFRESH_SECONDS": str(args.resync),
        },
    )
    op.start()
    assert op.proc is not None
    created_at: dict[str, float] = {}
    stop = threading.Event()

    replacement = "trainingrun.dev/attempt=2"

    def watch_pods() -> None:
        # Only replacement pods, so the watcher keeps up; short watches, each starting with the
        # current list, so nothing created between two of them is missed.
        w = watch.Watch()
        while not stop.is_set() and time.monotonic() < deadline:
            for ev in w.stream(
                core.list_namespaced_pod, ns, label_selector=replacement, timeout_seconds=5
            ):
                if ev["type"] == "ADDED":
                    created_at.setdefault(ev["object"].metadata.name, time.monotonic())
                if stop.is_set():
                    break

    watcher = threading.Thread(target=watch_pods, daemon=True)
    try:
        names = [f"r{i:04d}" for i in range(args.runs)]
        t0 = time.monotonic()
        for name in names:
            body = trainingrun(
                name,
                env,
                f"bench-{ns}",
                restart_policy={
                    "maxRestarts": 10,
                    "crashLoopLimit": 10,
                    "backoff": {"initialSeconds": 0, "maxSeconds": 0},
                },
            )
            body["spec"]["template"]["spec"]["nodeSelector"] = {"bench": ns}
            custom.create_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL, body)
        print(f"created {args.runs} TrainingRuns in {time.monotonic() - t0:.1f}s", flush=True)

        def running() -> int:
            pods = core.list_namespaced_pod(ns, label_selector="trainingrun.dev/attempt=1").items
            return sum(1 for p in pods if p.status.phase == "Running")

        while (count := running()) < args.runs:
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"only {count}/{args.runs} attempt-1 pods running before the timeout"
                )
            print(f"  {count}/{args.runs} attempt-1 pods running", flush=True)
            time.sleep(3)
        print(
            f"all {args.runs} attempt-1 pods running after {time.monotonic() - t0:.1f}s", flush=True
        )
        watcher.start()
        time.sleep(1)

        failed_at: dict[str, float] = {}
        cpu_before = cpu_seconds(op.proc.pid)
        interval = 1.0 / args.rate
        exited = {"terminated": {"exitCode": 1, "reason": "Error"}}
        t_start = time.monotonic()
        for i, name in enumerate(names):
            target = t_start + i * interval
            time.sleep(max(0.0, target - time.monotonic()))
            resp = core.patch_namespaced_pod_status(
                f"{name}-1",
                ns,
                {
                    "status": {
                        "phase": "Failed",
                        "containerStatuses": [container_status("trainer", exited)],
                    }
                },
                _preload_content=False,
            )
            failed_at[name] = time.monotonic()
            resp.read()
            resp.release_conn()
        while (
            sum(1 for n in names if f"{n}-2" in created_at) < args.runs
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)
        latencies = [created_at[f"{n}-2"] - failed_at[n] for n in names if f"{n}-2" in created_at]
        missing = args.runs - len(latencies)
        rss = peak_rss_mb(op.proc.pid)
        cpu_ms = (cpu_seconds(op.proc.pid) - cpu_before) * 1000 / max(len(latencies), 1)
    finally:
        stop.set()
        op.stop()
        core.delete_namespace(ns)
        # Wait for the namespace to go, so a following run does not share the machine with it.
        gone_by = time.monotonic() + 300
        while time.monotonic() < gone_by:
            try:
                core.read_namespace(ns)
            except client.ApiException:
                break
            time.sleep(2)
        for n in nodes:
            with contextlib.suppress(client.ApiException):
                core.delete_node(n)

    p50, p99 = percentile(latencies, 0.50), percentile(latencies, 0.99)
    # In failure order: a tail that grows from fifth to fifth is a backlog, a flat one is not.
    ordered = [created_at[f"{n}-2"] - failed_at[n] for n in names if f"{n}-2" in created_at]
    fifth = max(len(ordered) // 5, 1)
    chunks = [ordered[i : i + fifth] for i in range(0, fifth * 5, fifth)]
    by_fifth = [percentile(chunk, 0.99) for chunk in chunks if chunk]
    lines = [
        f"- runs: {args.runs} on {args.nodes} kwok nodes; failures injected at {args.rate:g}/s",
        f"- failed pod to replacement pod: p50 {p50:.3f} s, p99 {p99:.3f} s, "
        f"max {max(latencies):.3f} s, mean {statistics.mean(latencies):.3f} s; "
        f"replacements missing: {missing}",
        "- p99 by fifth of the failures, in order: "
        + ", ".join(f"{v:.2f}" for v in by_fifth)
        + " s",
        f"- operator peak RSS (VmHWM): {rss:.0f} MB; operator CPU per replacement: {cpu_ms:.1f} ms",
        "- targets: p99 <= 2 s, RSS <= 200 MB: "
        + ("met" if p99 <= 2 and rss <= 200 and missing == 0 else "NOT met"),
    ]
    print("\n".join(lines))
    if args.write:
        cmd = "python -m tests.bench_operator " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        stamp = time.strftime("%Y-%m-%d", time.gmtime())
        text = (
            f"{SECTION} ({stamp})\n\n"
            f"Command: `{cmd.strip()}` (2 cores, local kwok control plane)\n\n"
            + "\n".join(lines)
            + "\n"
        )
        write_section(args.write, text)
    return 0 if missing == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
