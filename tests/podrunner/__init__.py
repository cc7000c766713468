"""The local pod runner: test and demo tooling that plays the kubelet for one node, so pods bound
to that node run their containers as real local processes. Not part of the product.

    python -m tests.podrunner --node NAME [--state-dir DIR] [--kubeconfig FILE] [--env NAME]

What it does, like a kubelet (``restartPolicy: Never`` pods only; probes, resources, images,
security contexts and restart policies other than Never are ignored):

- Registers Node NAME (labels ``kubernetes.io/hostname=NAME`` and ``type=local``; no kwok
  annotation, so kwok leaves it alone; taint ``trainingrun.dev/local-pod-runner:NoSchedule`` so
  other tests' pods never land here, ``--no-taint`` to drop it) and keeps it Ready: a Lease in
  ``kube-node-lease`` renewed every 10 s (40 s duration) and a node status heartbeat.
- Watches pods with ``spec.nodeName == NAME``; per pod: a folder
  ``<state-dir>/<namespace>_<pod>/`` with emptyDir, downwardAPI, secret and configMap volumes
  under ``volumes/`` (downwardAPI files are rewritten as soon as labels or annotations change),
  and per container ``<name>.log`` (stdout and stderr), ``<name>.pid`` (while it runs) and
  ``<name>.termination-log``.
- Runs init containers in order (each must exit 0, else the pod fails), starts native sidecars
  (init containers with ``restartPolicy: Always``, restarted when they exit) before what follows
  them, then the main containers; when every main container has exited it stops the sidecars
  (reverse order) and writes phase Succeeded or Failed.
- A container is ``command`` + ``args`` (with ``$(VAR)`` expansion) run as a local process in a
  new session and a private mount namespace where each volumeMount is bind-mounted at its
  ``mountPath`` and a per-container file at ``terminationMessagePath`` (default
  /dev/termination-log); missing mount points are created on the host as empty folders or files.
  PATH starts with the repo's ``.venv/bin``; ``workingDir`` is honoured. When a container's
  process ends or is killed, every process left in its mount namespace goes with it (a child in
  a session of its own, as torchrun's workers, too). Environment: ``value``,
  ``secretKeyRef``, ``configMapKeyRef``, ``fieldRef`` (metadata name/namespace/uid/labels/
  annotations, spec.nodeName, status.podIP/hostIP), ``envFrom``. A missing Secret or key leaves
  the container waiting with ``CreateContainerConfigError`` (retried); a command not found ends
  it with ``StartError`` (exit 128). A process killed by signal n exits 128 + n.
- Status as the kubelet writes it: phase, ``initContainerStatuses`` / ``containerStatuses``
  (waiting/running/terminated, exitCode, reason Completed/Error, startedAt/finishedAt, message
  from the termination file, or with ``FallbackToLogsOnError`` the end of the log), conditions
  PodScheduled, PodReadyToStartContainers, Initialized, ContainersReady, Ready, podIP (127.0.0.1,
  or the pod's own address, below), startTime. Conditions others own (``DisruptionTarget`` from
  an eviction) are kept.
- Deletion (``kubectl delete``, Eviction API): SIGTERM to the main containers, up to the
  deletion's grace, SIGKILL; then the sidecars the same way (at least 2 s); final status; then
  the pod object is deleted with grace 0.
- SIGTERM/SIGINT to the runner: a graceful node shutdown. Running pods are stopped within
  ``--shutdown-grace`` (default 30 s) and marked Failed with reason ``Terminated`` and a
  ``DisruptionTarget`` condition (``TerminationByKubelet``); they are not deleted. The node then
  reports Ready=False and the runner exits. Container processes also get SIGKILL if the runner
  dies (``setpriv --pdeathsig``).

Pods that set ``spec.subdomain`` (gang pods) get a network of their own, as on a real node
(``tests.podrunner.podnet``); every other pod shares the machine's network, podIP 127.0.0.1:

- A network namespace ``<env>-p<n>`` per pod with ``lo`` up and an address of 10.244.0.0/16,
  unique among all runners of the environment (claims under ``podnet/`` in its state folder),
  on a veth pair to bridge ``br0`` in the environment's hub namespace ``<env>-hub``, so pods of
  two runner nodes reach each other. Nothing changes in the machine's own network namespace.
- Every container of the pod runs in it (``nsenter --net``) with the pod's hostname
  (``spec.hostname`` or its name, in a UTS namespace of its own); podIP, podIPs and
  ``fieldRef status.podIP`` give the pod's address.
- ``/etc/hosts`` is the pod's own file, bind-mounted: localhost, the pod's hostname and, for it
  and each other pod of the namespace with the same subdomain and an address (on any node,
  watched from the API), ``<hostname>.<subdomain>``, ``….<ns>.svc`` and
  ``….<ns>.svc.cluster.local``; rewritten in place within a moment of a peer's change.
- Each loopback port named by a URL in a container's env (``http://127.0.0.1:P``,
  ``http://localhost:P``, such as ``AWS_ENDPOINT_URL``) is forwarded from the pod's loopback to
  the machine's, streaming both ways. Nothing else outside 10.244.0.0/16 is reachable (no
  default route: no internet, no API server).
- The namespace, veth and forwarders go once the pod's containers have stopped (also on the
  runner's SIGTERM); a runner starting up removes those of runners that died, and
  ``localenv down`` every namespace of the environment.

Simulating node trouble (signals to the runner process):

- SIGUSR1: stop heartbeats (lease and status). The node-lifecycle controller marks the node
  ``Ready=Unknown`` after ``--node-monitor-grace-period``; in the kwokctl environment that is
  200 s, checked every 25 s (kwokctl scales both by its heartbeat factor, 5 by default).
  Containers keep running, as on a partitioned node.
- SIGUSR2: resume heartbeats and report Ready.
- SIGHUP: keep heartbeats but report ``Ready=False`` (reason KubeletNotReady), as a kubelet whose
  runtime is down; the controller reacts at its next monitor period, no grace wait.
- SIGRTMIN (``partition()``): a network partition between the node and the API server. The
  runner makes no API call at all: no heartbeat or lease renewal, no pod status write, no final
  pod delete, no Secret, ConfigMap or token lookup (a container restarted meanwhile gets the
  values looked up before); pod events still arriving on an open watch are dropped unread. The
  pods' processes keep running and reach anything but the API server (the S3 endpoint, say).
  The controller marks the node ``Unknown`` after its grace, as for SIGUSR1; a test that cannot
  wait that long writes the condition itself, as the controller would.
- SIGRTMIN+1 (``heal()``): the link is back. The node posts Ready at once and renews its lease;
  the runner lists its pods again: pods deleted meanwhile (a force delete leaves no trace) have
  their processes stopped (SIGTERM, the pod's grace, SIGKILL), and status writes resume.

Where it differs from a real kubelet, as the real node's tests (tests/e2e/test_real_node*.py,
a kubelet v1.34 with containerd 1.6) showed:

- Users: every container runs as the runner's user (root); ``securityContext`` is ignored. On a
  real kubelet the agents and the trainer run as their own users, and a private file of one was
  unreadable to another (the product's fix: the agents follow the trainer's user); only the real
  node's users test covers that. Not imitated here.
- An evicted pod is deleted right after its final status: its trainer's terminated state
  (exit 143) is rarely seen before the pod is gone; a real kubelet reports it while the pod
  terminates (the demo prints "not seen" here, "exit code 143 (Error)" there).
- Downward-API files are rewritten at once; a real kubelet took 0.11-0.21 s at the median and up
  to 1.01 s, and never rewrites them for a pod that is terminating.
- Processes keep the machine's pids; in a container the main process is pid 1 every time (what
  made the operator's Lease identity repeat across restarts in a pod).
- Images are ignored: the clone's code and .venv run (torch 2.15 from PyPI); the example image
  has Debian's torch 2.6.

From Python (tests, demo): ``start_runner(env)`` returns a ``RunnerHandle``; pods go to its
node with ``placement(handle.node)`` in their spec (nodeSelector + toleration).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.localenv import RUNNER_PID_FILE as PID_FILE
from tests.localenv import LocalEnv, state_dir
from tests.podrunner.link import HEAL_SIGNAL, PARTITION_SIGNAL
from tests.podrunner.node import LEASE_NAMESPACE, TOLERATION

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 30


def default_state_dir(env_name: str, node: str) -> Path:
    """Inside the environment's state folder, so ``make cluster-down`` removes it."""
    return state_dir(env_name) / "podrunner" / node


def runner_pids(env_name: str) -> dict[str, int]:
    """Node name -> pid of each runner ``start_runner`` started in the environment (alive or
    not); ``make cluster-down`` stops them."""
    pids = {}
    for pid_file in sorted((state_dir(env_name) / "podrunner").glob(f"*/{PID_FILE}")):
        text = pid_file.read_text().strip()
        if text.isdigit():
            pids[pid_file.parent.name] = int(text)
    return pids


def running_runner(env: LocalEnv, node: str) -> bool:
    """True when a runner started by ``start_runner`` for ``node`` still runs."""
    pid = runner_pids(env.name).get(node)
    if pid is None:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    return b"tests.podrunner" in cmdline and node.encode() in cmdline


def placement(node: str) -> dict[str, Any]:
    """Pod spec fields that put a pod on the runner's node."""
    return {"nodeSelector": {"kubernetes.io/hostname": node}, "tolerations": [dict(TOLERATION)]}


def _delete_if_present(delete: Callable[..., Any], *args: str) -> None:
    try:
        delete(*args)
    except ApiException as e:
        if e.status != 404:
            raise


@dataclass
class RunnerHandle:
    """A runner process started by ``start_runner``."""

    env: LocalEnv
    node: str
    state_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes]

    def pod_dir(self, namespace: str, pod: str) -> Path:
        return self.state_dir / f"{namespace}_{pod}"

    def pid_of(self, namespace: str, pod: str, container: str) -> int | None:
        """The pid of the container's running process, None when it does not run."""
        try:
            return int((self.pod_dir(namespace, pod) / f"{container}.pid").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def wait_pid(self, namespace: str, pod: str, container: str, timeout_s: float = 30) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid = self.pid_of(namespace, pod, container)
            if pid:
                return pid
            time.sleep(0.1)
        raise AssertionError(f"container {container} of {namespace}/{pod} not running")

    def log_of(self, namespace: str, pod: str, container: str) -> str:
        path = self.pod_dir(namespace, pod) / f"{container}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def runner_log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def make_not_ready(self) -> None:
        """Stops the heartbeats: the controller marks the node Unknown after its grace."""
        self.proc.send_signal(signal.SIGUSR1)

    def make_ready(self) -> None:
        self.proc.send_signal(signal.SIGUSR2)

    def report_not_ready(self) -> None:
        """The node reports Ready=False itself, heartbeats go on."""
        self.proc.send_signal(signal.SIGHUP)

    def partition(self) -> None:
        """Cuts the runner off the API server; its pods' processes keep running."""
        self.proc.send_signal(PARTITION_SIGNAL)

    def heal(self) -> None:
        """Ends the partition: the node reports Ready, pods deleted meanwhile are stopped."""
        self.proc.send_signal(HEAL_SIGNAL)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 90, delete_node: bool = True) -> int | None:
        """SIGTERM (graceful node shutdown), wait, SIGKILL on timeout; then removes the Node
        and its Lease. Returns the runner's exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if delete_node:
            api = config.new_client_from_config(config_file=self.env.kubeconfig)
            _delete_if_present(client.CoreV1Api(api).delete_node, self.node)
            lease_api = client.CoordinationV1Api(api)
            _delete_if_present(lease_api.delete_namespaced_lease, self.node, LEASE_NAMESPACE)
        return self.proc.returncode

    def __enter__(self) -> RunnerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_runner(
    env: LocalEnv,
    node: str | None = None,
    state: Path | None = None,
    *,
    taint: bool = True,
    shutdown_grace_s: float = 30,
) -> RunnerHandle:
    """Starts ``python -m tests.podrunner`` for a new node and waits until the node is Ready."""
    node = node or f"local-{uuid.uuid4().hex[:8]}"
    state = state or default_state_dir(env.name, node)
    state.mkdir(parents=True, exist_ok=True)
    log_path = state / "runner.log"
    args = [
        sys.executable,
        "-m",
        "tests.podrunner",
        "--node",
        node,
        "--state-dir",
        str(state),
        "--kubeconfig",
        env.kubeconfig,
        "--shutdown-grace",
        str(shutdown_grace_s),
        "--env",
        env.name,
    ]
    if not taint:
        args.append("--no-taint")
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    (state / PID_FILE).write_text(str(proc.pid))
    handle = RunnerHandle(env=env, node=node, state_dir=state, log_path=log_path, proc=proc)
    core = client.CoreV1Api(config.new_client_from_config(config_file=env.kubeconfig))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if not handle.alive():
            raise RuntimeError(
                f"pod runner for node {node} exited ({proc.returncode}):\n"
                f"{handle.runner_log()[-3000:]}"
            )
        try:
            conditions = core.read_node(node).status.conditions or []
        except ApiException as e:
            if e.status != 404:
                raise
            conditions = []
        if any(c.type == "Ready" and c.status == "True" for c in conditions):
            return handle
        time.sleep(0.2)
    handle.stop()
    raise RuntimeError(f"node {node} not Ready after {READY_TIMEOUT_S}s; see {log_path}")
