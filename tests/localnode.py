"""The local environment's real node: a real kubelet, containerd, runc, CNI, kube-proxy and CoreDNS.

Opt-in: ``TRAININGRUN_REAL_NODE=1 python -m tests.localenv up`` (``make cluster`` with it set,
``make demo``) starts it beside the kwok and pod-runner nodes with ``hack/node-up.sh``;
``python -m tests.localenv down`` removes it with ``hack/node-down.sh`` (every container, mount,
network namespace, cgroup and iptables rule it made). Its tools come from ``make node-packages``
and ``make node-tools``, its images from ``make images``; nothing is pulled.

- Name ``trainingrun-real-0``, label and taint ``trainingrun.dev/real-node=true`` (NoSchedule): a
  pod lands there only when it selects the label and tolerates the taint (``placement()``), so
  tests that pick any node never get it.
- Its address is the CNI bridge's gateway, 10.245.0.1: the kubelet, CoreDNS and
  ``hack/node-forward.py`` listen there or on loopback, never on the machine's interfaces. The
  forwarder carries the gateway's ports of the API server and of SeaweedFS to their loopback
  listeners, so a pod reaches the API server through the ``kubernetes`` Service (the API server
  advertises the gateway, and its certificate names the gateway and the Service's ClusterIP) and
  S3 at ``s3_endpoint()``.
- Images are imported into containerd from buildah's storage once per image ID: containerd's root
  is kept in the cache (``<cache>/node``) across starts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parent.parent
WANTED_ENV = "TRAININGRUN_REAL_NODE"  # "1": localenv.up() starts the real node
IMAGES_ENV = "TRAININGRUN_NODE_IMAGES"  # space-separated image references to import
NAME = "trainingrun-real-0"
LABEL = "trainingrun.dev/real-node"
# hack/node-up.sh's defaults: the pod subnet's first address is the bridge's gateway.
GATEWAY = "10.245.0.1"
# The control plane's first ClusterIP (kwokctl's service range 10.0.0.0/24): the `kubernetes`
# Service a pod's in-cluster client dials.
KUBERNETES_SERVICE_IP = "10.0.0.1"
# The agent for every TrainingRun, the example trainer for make demo, the operator for the chart
# installed on the node (tests/e2e/test_real_node_operator.py).
DEFAULT_IMAGES = (
    "ghcr.io/trainingrun/agent:dev",
    "ghcr.io/trainingrun/finetune-example:dev",
    "ghcr.io/trainingrun/finetune-example:dev-user",
    "ghcr.io/trainingrun/operator:dev",
)
OWNER_FILE = "environment"  # in the state folder: the environment's name
UP_TIMEOUT_S = 900  # bounds a cold start: the images' first import
DOWN_TIMEOUT_S = 180


def wanted() -> bool:
    return os.environ.get(WANTED_ENV, "") == "1"


def state_dir() -> Path:
    """The node's state folder (hack/node-up.sh's default): sockets, logs, pid files, mounts."""
    return Path(os.environ.get("TMPDIR") or "/tmp") / "trainingrun-node" / NAME


def owner() -> str:
    """The environment the node belongs to (one node per machine: its bridge, subnet and
    cgroups are fixed), or "" when none is recorded."""
    try:
        return (state_dir() / OWNER_FILE).read_text().strip()
    except OSError:
        return ""


def running() -> bool:
    """The node's kubelet runs."""
    try:
        pid = int((state_dir() / "kubelet.pid").read_text())
    except (OSError, ValueError):
        return False
    return Path(f"/proc/{pid}").exists()


def apiserver_args(pki: Path) -> list[tuple[str, str]]:
    """kube-apiserver flags the real node needs, as (name, value): its client
    certificate for the kubelet (``kubectl logs``/``exec``; the kubelet refuses anonymous
    requests), the node's InternalIP rather than its name (which no DNS resolves), and the
    gateway as the address the ``kubernetes`` Service's endpoint names."""
    return [
        ("kubelet-client-certificate", str(pki / "admin.crt")),
        ("kubelet-client-key", str(pki / "admin.key")),
        ("kubelet-preferred-address-types", "InternalIP"),
        ("advertise-address", GATEWAY),
    ]


def cert_sans() -> list[str]:
    """Names the API server's certificate must carry beside kwokctl's for a pod's client."""
    return [KUBERNETES_SERVICE_IP, GATEWAY]


def port_of(url: str) -> int:
    port = urlsplit(url if "://" in url else f"https://{url}").port
    if port is None:
        raise ValueError(f"no port in {url}")
    return port


def s3_endpoint(loopback_endpoint: str) -> str:
    """The S3 endpoint a pod on the node uses for the environment's SeaweedFS at
    ``loopback_endpoint`` (the host's processes may use it too)."""
    return f"http://{GATEWAY}:{port_of(loopback_endpoint)}"


def images() -> list[str]:
    """The images to import: ``TRAININGRUN_NODE_IMAGES`` or ``DEFAULT_IMAGES``, those buildah
    has (``make images``)."""
    refs = os.environ.get(IMAGES_ENV, "").split() or list(DEFAULT_IMAGES)
    buildah = shutil.which("buildah")
    if not buildah:
        return []
    present = []
    for ref in refs:
        proc = subprocess.run(
            [buildah, "images", "-q", ref], capture_output=True, text=True, check=False
        )
        if proc.returncode == 0 and proc.stdout.strip():
            present.append(ref)
        else:
            print(f"[localnode] image {ref} not built (make images): not imported", flush=True)
    return present


def placement() -> dict[str, object]:
    """Pod spec fields that put a pod on the real node."""
    return {
        "nodeSelector": {LABEL: "true"},
        "tolerations": [{"key": LABEL, "operator": "Exists", "effect": "NoSchedule"}],
    }


def start(env_name: str, kubeconfig: str, forward_ports: list[int]) -> None:
    """Starts the node for environment ``env_name`` (or finds it up) with ``hack/node-up.sh``;
    raises when it did not get Ready or belongs to another environment."""
    other = owner()
    if other and other != env_name and (running() or state_dir().exists()):
        raise RuntimeError(
            f"the real node {NAME} belongs to environment {other} (one per machine): "
            f"TRAININGRUN_ENV_NAME={other} python -m tests.localenv down removes it"
        )
    state_dir().mkdir(parents=True, exist_ok=True)
    (state_dir() / OWNER_FILE).write_text(env_name)
    proc = subprocess.run(
        ["bash", str(REPO / "hack" / "node-up.sh"), *images()],
        env={
            **os.environ,
            "KUBECONFIG": kubeconfig,
            "NODE_NAME": NAME,
            "NODE_STATE": str(state_dir()),
            "FORWARD_PORTS": " ".join(str(p) for p in forward_ports),
            "NODE_TAINTS": f"{LABEL}=true:NoSchedule",
        },
        timeout=UP_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"hack/node-up.sh failed; its output above and {state_dir()}")


def stop(env_name: str, kubeconfig: str | None) -> bool:
    """Removes the node of environment ``env_name`` with ``hack/node-down.sh`` when anything of
    it is left (another environment's node stays); whether all went."""
    if not state_dir().exists() or owner() not in ("", env_name):
        return True
    env = {**os.environ, "NODE_NAME": NAME, "NODE_STATE": str(state_dir())}
    if kubeconfig and Path(kubeconfig).exists():
        env["KUBECONFIG"] = kubeconfig  # its pods go through the kubelet and the CRI first
    else:
        env.pop("KUBECONFIG", None)
    proc = subprocess.run(
        ["bash", str(REPO / "hack" / "node-down.sh")], env=env, timeout=DOWN_TIMEOUT_S, check=False
    )
    return proc.returncode == 0
