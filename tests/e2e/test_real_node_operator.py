"""The operator in pods on the environment's real node (tests/localnode.py), installed by the chart
as shipped with the local images: 2 replicas electing a leader on a Lease, the chart's
ServiceAccount, RBAC and ValidatingAdmissionPolicy. Facts measured there:

- both replicas Ready on the real node under the chart's ServiceAccount; one holds the Lease;
- the admission policy installed and bound, and denying the operator's ServiceAccount a change of
  a run pod's labels with its message (a ``trainingrun.dev/`` annotation is let through);
- the leader's container SIGKILLed on the node (through containerd): a live operator holds the
  Lease again within 15 s (the figure is printed); during the 30 s after the kill the run keeps
  its one pod, and the run then ends Succeeded with that pod, its status written by the new
  leader; no RBAC or policy refusal in either replica's log;
- the standby takes the Lease (expected to fail today: see ``test_the_standby_takes_the_lease``).

Only the chart's operators act on the module's run: ``make demo``'s operator is stopped and the
session's paused meanwhile. A tier of its own with tests/e2e/test_real_node.py:
``make test-real-node``.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from tests import localenv as localenv_mod
from tests import localnode
from tests.conftest import paused_session_operators
from tests.integration.support import Runs, credentials_secret, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "trainingrun"
OPERATOR_IMAGE, AGENT_IMAGE, IMAGE_TAG = (
    "ghcr.io/trainingrun/operator",
    "ghcr.io/trainingrun/agent",
    "dev",
)
FAILOVER_LIMIT_S = 15.0  # issue 46: the standby leads within 15 s
WATCH_AFTER_KILL_S = 30.0  # no second pod of the run meanwhile
POLICY_MESSAGE = (
    "the trainingrun operator may change a pod only in its trainingrun.dev/ annotations"
)
# RBAC's refusal of the operator's ServiceAccount, and the admission policy's.
REFUSED = re.compile(r'forbidden: User "system:serviceaccount:[^"]*" cannot|' + POLICY_MESSAGE)
RUN = "sleeper"
STEPS, SAVE_EVERY = 60, 10  # one step a second: the run lasts about a minute
# The trainer: the agent image's python, writing a checkpoint folder every SAVE_EVERY steps
# (trainer_state.json last, as transformers does), then exiting 0.
TRAINER = f"""
import json, os, pathlib, time
root = pathlib.Path(os.environ["TRAININGRUN_CHECKPOINT_DIR"])
for step in range(1, {STEPS} + 1):
    time.sleep(1)
    if step % {SAVE_EVERY} == 0:
        folder = root / f"checkpoint-{{step}}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "weights.bin").write_bytes(os.urandom(4096))
        (folder / "trainer_state.json").write_text(json.dumps({{"global_step": step}}))
        print("saved", step, flush=True)
"""


@dataclass
class Release:
    """The chart installed in a namespace of its own, where the module's run lives too."""

    env: localenv_mod.LocalEnv
    api: Any
    core: client.CoreV1Api
    runs: Runs
    namespace: str
    name: str
    helm: Path
    logs: dict[str, str] = field(default_factory=dict)  # pod -> its operator log at the end

    @property
    def fullname(self) -> str:
        return f"{self.name}-trainingrun"

    def helm_run(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            [str(self.helm), *args, "--kubeconfig", self.env.kubeconfig, "-n", self.namespace],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0 or not check, f"helm {args[0]} failed: {proc.stderr}"
        return proc.stdout

    def operator_pods(self) -> list[Any]:
        selector = f"app.kubernetes.io/instance={self.name}"
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def lease(self) -> Any:
        """The chart's Lease, or None before the first replica created it."""
        coordination = client.CoordinationV1Api(self.api)
        try:
            return coordination.read_namespaced_lease(self.fullname, self.namespace)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    def holder(self) -> str | None:
        lease = self.lease()
        return (lease.spec.holder_identity or None) if lease is not None else None

    def collect_logs(self) -> None:
        """Each replica's log: the current container's and, after a restart, the killed one's."""
        for pod in self.operator_pods():
            name = pod.metadata.name
            text = self.core.read_namespaced_pod_log(name, self.namespace)
            restarted = any(c.restart_count for c in pod.status.container_statuses or [])
            if restarted:
                before = self.core.read_namespaced_pod_log(name, self.namespace, previous=True)
                text = before + text
            self.logs[name] = text


def chart_values() -> dict[str, Any]:
    """The chart's defaults (2 replicas, leader election, its ServiceAccount, RBAC and pod-patch
    policy) with the local images, never pulled, and the real node's placement."""
    return {
        "image": {"repository": OPERATOR_IMAGE, "tag": IMAGE_TAG, "pullPolicy": "Never"},
        "agent": {"image": {"repository": AGENT_IMAGE, "tag": IMAGE_TAG, "pullPolicy": "Never"}},
        **localnode.placement(),
    }


@pytest.fixture(scope="module")
def node_release(localenv: localenv_mod.LocalEnv, helm: Path) -> Iterator[Release]:
    """The chart installed on the real node in a namespace of its own; the host's operators stopped
    (``make demo``'s) or paused (the session's) meanwhile, so only the chart's act."""
    assert localnode.wanted(), "the real node's tier runs with make test-real-node"
    env = localenv_mod.ensure_real_node(localenv)
    localenv_mod.stop_operator(env)
    # helm skips a CRD that exists: apply the current one, as `make kind-install` does.
    env.kubectl("apply", "--server-side", "-f", str(REPO / "crds" / "trainingrun.yaml"))
    env.wait_established("trainingruns.trainingrun.dev")
    api = config.new_client_from_config(config_file=env.kubeconfig)
    core = client.CoreV1Api(api)
    namespace = f"real-op-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    core.create_namespaced_secret(namespace, credentials_secret(env, "s3-credentials"))
    rel = Release(
        env, api, core, Runs(api, namespace), namespace, f"op-{uuid.uuid4().hex[:6]}", helm
    )
    with paused_session_operators():
        try:
            rel.helm_run(
                "install",
                rel.name,
                str(CHART),
                "--values",
                "-",
                "--wait",
                "--timeout",
                "180s",
                stdin=json.dumps(chart_values()),
            )
            yield rel
        finally:
            # The run goes while its operator still runs (its finalizer), then the release.
            for run in rel.runs.custom.list_namespaced_custom_object(
                "trainingrun.dev", "v1alpha1", namespace, "trainingruns"
            )["items"]:
                rel.runs.delete(run["metadata"]["name"])
            wait_for(
                lambda: (
                    not rel.core.list_namespaced_pod(
                        namespace, label_selector="trainingrun.dev/run"
                    ).items
                ),
                90,
                "the run's pods to go",
            )
            rel.helm_run("uninstall", rel.name, "--wait", "--timeout", "120s", check=False)
            core.delete_namespace(namespace)


def sleeper_run(env: localenv_mod.LocalEnv, prefix: str) -> dict[str, Any]:
    """A cheap run on the real node: the agent image as its trainer (TRAINER)."""
    trainer = {
        "name": "trainer",
        "image": f"{AGENT_IMAGE}:{IMAGE_TAG}",
        "imagePullPolicy": "Never",
        "command": ["python", "-c", TRAINER],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
    }
    return {
        "apiVersion": "trainingrun.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": RUN},
        "spec": {
            "template": {"spec": {**localnode.placement(), "containers": [trainer]}},
            "checkpoint": {
                "storage": {
                    "uri": f"s3://{env.bucket}/{prefix}",
                    "endpoint": env.node_s3_endpoint,
                    "region": env.s3_region,
                    "credentialsSecret": "s3-credentials",
                }
            },
        },
    }


def rfc3339(stamp: Any) -> float:
    """A Lease's MicroTime (datetime from the client, or a string) as seconds since the epoch."""
    if isinstance(stamp, datetime):
        return stamp.timestamp()
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).replace(tzinfo=UTC).timestamp()


def as_service_account(rel: Release) -> client.CoreV1Api:
    """A client authenticated as the chart's ServiceAccount (a TokenRequest token)."""
    token = rel.core.create_namespaced_service_account_token(
        rel.fullname,
        rel.namespace,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)
        ),
    ).status.token
    admin = rel.api.configuration
    conf = client.Configuration()
    conf.host, conf.ssl_ca_cert = admin.host, admin.ssl_ca_cert
    conf.api_key = {"authorization": f"Bearer {token}"}
    return client.CoreV1Api(client.ApiClient(conf))


def refusal(patch: Any) -> str | None:
    """The API server's message when it refuses the patch with 403, None when it accepts it."""
    try:
        patch()
    except client.ApiException as e:
        assert e.status == 403, (e.status, e.body)
        return str(json.loads(e.body)["message"])
    return None


def kill_container(container_id: str) -> None:
    """SIGKILL to a container of the real node, through its containerd (as an OOM kill or a
    crash would end it: no grace, no SIGTERM)."""
    sock = localnode.state_dir() / "containerd.sock"
    cid = container_id.removeprefix("containerd://")
    subprocess.run(
        [
            "ctr",
            "--address",
            str(sock),
            "--namespace",
            "k8s.io",
            "task",
            "kill",
            "-s",
            "SIGKILL",
            cid,
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )


@dataclass
class Failover:
    killed_pod: str
    standby_pod: str
    holder_before: str
    seconds: float  # SIGKILL to the first Lease write by a live replica
    taker: str  # the holder of that write ("" when none came)
    holders_after: list[str]  # every holder seen in the WATCH_AFTER_KILL_S after the kill
    pods_seen: set[str]  # the run's pods seen in the WATCH_AFTER_KILL_S after the kill
    final: dict[str, Any]  # the run's status at its end
    pods_at_end: set[str]


@pytest.fixture(scope="module")
def installed(node_release: Release) -> Release:
    """Both replicas Ready on the real node."""
    deployment = client.AppsV1Api(node_release.api).read_namespaced_deployment(
        node_release.fullname, node_release.namespace
    )
    assert deployment.spec.replicas == 2, "the chart's default: 2 replicas, one leading"

    def ready() -> bool:
        pods = node_release.operator_pods()
        return len(pods) == 2 and all(
            any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            for p in pods
        )

    wait_for(ready, 120, "both operator replicas Ready")
    return node_release


@pytest.fixture(scope="module")
def running(installed: Release) -> Release:
    """The module's run, its attempt's pod Running on the real node."""
    prefix = f"real-op-{uuid.uuid4().hex[:8]}"
    installed.runs.create(sleeper_run(installed.env, prefix))
    installed.runs.wait_status(RUN, lambda s: s.get("activePod") == f"{RUN}-1", 60, "attempt 1")
    installed.runs.wait_pod_running(f"{RUN}-1", timeout_s=120)
    return installed


@pytest.fixture(scope="module")
def failover(running: Release, request: pytest.FixtureRequest) -> Failover:
    """The leader's container SIGKILLed while the run trains; the Lease and the run's pods
    watched for WATCH_AFTER_KILL_S, then the run followed to its end."""
    rel = running

    holder = wait_for(rel.holder, 30, "a Lease holder")
    pods = {p.metadata.name: p for p in rel.operator_pods()}
    leader = next(name for name in pods if holder.startswith(f"{name}-"))
    standby = next(name for name in pods if name != leader)
    container = next(c for c in pods[leader].status.container_statuses if c.name == "operator")
    killed_at = time.time()
    kill_container(container.container_id)
    started = time.monotonic()

    first: tuple[float, str] | None = None
    holders: list[str] = []
    seen: set[str] = set()
    while time.monotonic() - started < WATCH_AFTER_KILL_S:
        spec = rel.lease().spec
        if spec.holder_identity not in holders:
            holders.append(spec.holder_identity)
        # A renewTime after the kill: written by a live replica (the writer's own clock, this
        # machine's).
        if first is None and rfc3339(spec.renew_time) > killed_at:
            first = (rfc3339(spec.renew_time) - killed_at, spec.holder_identity)
        seen |= {p.metadata.name for p in rel.runs.pods_of(RUN)}
        time.sleep(0.1)
    seconds, taker = first or (math.inf, "")  # inf: no write in WATCH_AFTER_KILL_S

    final = rel.runs.wait_status(
        RUN, lambda s: s.get("phase") in ("Succeeded", "Failed"), 180, "the run's end"
    )
    rel.collect_logs()
    result = Failover(
        killed_pod=leader,
        standby_pod=standby,
        holder_before=holder,
        seconds=seconds,
        taker=taker,
        holders_after=holders,
        pods_seen=seen,
        final=final,
        pods_at_end={p.metadata.name for p in rel.runs.pods_of(RUN)},
    )
    who = (
        "no replica"
        if not taker
        else "the standby"
        if taker.startswith(f"{standby}-")
        else "the killed leader's pod"
    )
    say(
        request,
        f"[real node] leader container SIGKILLed: {who} ({result.taker}) held the Lease "
        f"{result.seconds:.2f} s later; holders seen: {', '.join(holders)}",
    )
    return result


def say(request: pytest.FixtureRequest, message: str) -> None:
    """A figure on the terminal, past pytest's capture."""
    print(message)
    plugins = request.config.pluginmanager
    reporter = plugins.get_plugin("terminalreporter")
    capture = plugins.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\n{message}")


def test_replicas_run_under_the_charts_service_account_and_one_leads(installed: Release) -> None:
    pods = installed.operator_pods()
    assert len(pods) == 2
    for pod in pods:
        assert pod.spec.node_name == localnode.NAME
        assert pod.spec.service_account_name == installed.fullname
        assert pod.spec.containers[0].image == f"{OPERATOR_IMAGE}:{IMAGE_TAG}"
        assert pod.spec.containers[0].image_pull_policy == "Never"
    names = [p.metadata.name for p in pods]

    def held_by_a_replica() -> str | None:
        holder = installed.holder()
        return holder if holder and any(holder.startswith(f"{n}-") for n in names) else None

    wait_for(held_by_a_replica, 30, f"one of {names} holding the Lease")
    # The holder keeps renewing it (every 2 s).
    renewed = rfc3339(installed.lease().spec.renew_time)
    wait_for(lambda: rfc3339(installed.lease().spec.renew_time) > renewed, 10, "a renewal")


def test_the_pod_patch_policy_is_bound_and_denies_the_operator_a_label_change(
    running: Release,
) -> None:
    installed = running
    admission = client.AdmissionregistrationV1Api(installed.api)
    name = f"{installed.fullname}-pod-patches"
    policy = admission.read_validating_admission_policy(name)
    assert policy.spec.failure_policy == "Fail"
    binding = admission.read_validating_admission_policy_binding(name)
    assert binding.spec.policy_name == name and binding.spec.validation_actions == ["Deny"]
    # The run's pod, patched as the operator.
    as_operator = as_service_account(installed)
    pod = f"{RUN}-1"

    def patch(metadata: dict[str, Any]) -> Any:
        return lambda: as_operator.patch_namespaced_pod(
            pod, installed.namespace, {"metadata": metadata}
        )

    denied = refusal(patch({"labels": {"team": uuid.uuid4().hex[:8]}}))
    assert denied is not None and POLICY_MESSAGE in denied and "changes its labels" in denied
    assert name in denied, denied
    assert refusal(patch({"annotations": {"trainingrun.dev/e2e-probe": "x"}})) is None


def test_a_live_leader_within_15s_of_the_leaders_sigkill(failover: Failover) -> None:
    assert failover.seconds <= FAILOVER_LIMIT_S, (
        f"{failover.seconds:.2f} s from the SIGKILL to a Lease write by a live replica; "
        f"holders seen: {failover.holders_after}"
    )


def test_the_run_keeps_one_pod_and_succeeds_across_the_failover(failover: Failover) -> None:
    assert failover.pods_seen == {f"{RUN}-1"}, failover
    assert failover.pods_at_end <= {f"{RUN}-1"}, failover
    assert failover.final.get("phase") == "Succeeded", failover.final
    assert failover.final.get("activePod") in (None, "", f"{RUN}-1"), failover.final


def test_no_rbac_or_policy_refusal_in_the_operators_logs(
    installed: Release, failover: Failover
) -> None:
    assert len(installed.logs) == 2, installed.logs.keys()
    leading = [name for name, log in installed.logs.items() if ": leading (lease" in log]
    assert leading, "no replica logged that it leads"
    for name, log in installed.logs.items():
        found = REFUSED.search(log)
        assert found is None, f"{name}: {found.group(0) if found else ''}\n{log[-3000:]}"


def test_a_new_process_takes_the_lease(failover: Failover) -> None:
    """The Lease goes to a process that did not hold it: the standby, or the killed leader's
    container restarted by the kubelet (a new identity of its own, which waits out the Lease
    like the standby), never the dead process's name renewed."""
    live = (f"{failover.standby_pod}-", f"{failover.killed_pod}-")
    assert failover.taker and failover.taker != failover.holder_before, (
        f"{failover.taker or 'no replica'} took the Lease after {failover.holder_before} was "
        f"killed; holders seen: {failover.holders_after}"
    )
    assert failover.taker.startswith(live), failover.taker
    who = "the standby" if failover.taker.startswith(live[0]) else "the restarted leader"
    print(f"taken by {failover.taker} ({who})")
