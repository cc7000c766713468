"""Kueue on the local environment, started on demand: the manager binary and the CRDs of one
Kueue release (hack/kueue, built by hack/build-tools.sh), run as a process on the host against the
environment's control plane.

- Everything listens on 127.0.0.1 on free ports: the webhook server, metrics, health probes (the
  visibility API server, another listener, is switched off with its feature gate).
- Webhooks: the apiserver runs on the host too, so it calls Kueue at ``https://127.0.0.1:<port>``.
  A CA and a serving certificate for IP 127.0.0.1 are made here, Kueue's own certificate
  management is off, and Kueue's webhook configurations (from its module) are installed with
  ``url`` client configs, keeping only the webhooks of Kueue's own types: no integration is
  enabled, so nothing intercepts Pods or Jobs. The CRDs Kueue converts between v1beta1 and v1beta2
  get the same treatment for their conversion webhook.
- Kueue reads its metrics certificate from a fixed path, /etc/kueue/metrics/certs, once its
  certificate management is off: it runs in a private mount namespace where a read-only overlay
  adds that folder to /etc, so nothing is written outside the state folder.
- Integrations: none that manage Pods or batch Jobs; ``TrainingRun.v1alpha1.trainingrun.dev`` is
  an external framework, whose controller (the operator) creates and owns Workloads itself.

State lives in ``state_dir(env.name) / "kueue"`` (pid file, kueue.log, certificates, config).
``python -m tests.localenv down`` stops Kueue with the rest. Command line:
``python -m tests.kueue up|down|status``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import ipaddress
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests import localenv
from tests.localenv import LocalEnv, state_dir

NAMESPACE = "kueue-system"
API_VERSION = "kueue.x-k8s.io/v1beta2"  # the storage version of v0.17; v1beta1 is converted
EXTERNAL_FRAMEWORK = "TrainingRun.v1alpha1.trainingrun.dev"  # Kind.version.group
# Kueue fills an empty framework list with batch/job. The AppWrapper API is not installed, so
# its integration never starts (Kueue waits for the API to appear) and nothing is managed.
PLACEHOLDER_FRAMEWORK = "workload.codeflare.dev/appwrapper"
# How long the CRDs (and their objects) may take to go when Kueue is taken down.
CRDS_GONE_S = 180.0

# The CRDs Kueue serves conversions for (pkg/util/cert/cert.go, the CRD kustomization's patches).
CONVERTED_CRDS = (
    "localqueues.kueue.x-k8s.io",
    "clusterqueues.kueue.x-k8s.io",
    "workloads.kueue.x-k8s.io",
    "cohorts.kueue.x-k8s.io",
    "multikueueclusters.kueue.x-k8s.io",
)
WEBHOOK_CONFIGURATIONS = {  # kind: name (Kueue's kustomize prefix)
    "MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
    "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration",
}
METRICS_CERT_DIR = "kueue/metrics/certs"  # under /etc, fixed in cmd/kueue/main.go
READY_TIMEOUT_S = 90
FIELD_MANAGER = "tests.kueue"
PID_FILE = "kueue.pid"  # localenv.down reads it too
LOG_FILE = "kueue.log"
# libyaml's loader when PyYAML has it: the pure-Python one takes 0.8 s for the Workload CRD.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Kueue:
    """A running Kueue manager of one environment."""

    env_name: str
    pid: int
    webhook_port: int
    health_port: int
    metrics_port: int
    version: str

    @property
    def log_path(self) -> Path:
        return kueue_dir(self.env_name) / LOG_FILE

    def log_tail(self, chars: int = 4000) -> str:
        return _tail(self.log_path, chars)


def _log(msg: str) -> None:
    print(f"[kueue] {msg}", file=sys.stderr, flush=True)


def _tail(path: Path, chars: int) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return "(no log)"


def kueue_dir(env_name: str) -> Path:
    return state_dir(env_name) / "kueue"


# ---------------------------------------------------------------------------------------------
# what hack/build-tools.sh installed


def _install_dir(env: LocalEnv) -> Path:
    """The keyed build folder of the Kueue binary, which also holds the module's CRDs (crds/)
    and webhook definitions (webhooks.yaml); builds it when an older build-tools run left none."""
    binary = Path(env.bin_dir) / "kueue"
    if not binary.exists():
        binary = localenv.build_tools() / "kueue"
    folder = binary.resolve().parent
    if not (folder / "crds").is_dir() or not (folder / "webhooks.yaml").is_file():
        raise RuntimeError(f"{folder} lacks crds/ or webhooks.yaml; rerun hack/build-tools.sh")
    return folder


def _version() -> str:
    """The Kueue version the wrapper module pins (the build folder is keyed by its go.mod)."""
    for line in (localenv.REPO / "hack" / "kueue" / "go.mod").read_text().splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[:2] == ["require", "sigs.k8s.io/kueue"]:
            return fields[2]
    return "unknown"


# ---------------------------------------------------------------------------------------------
# certificates


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_certs(folder: Path) -> bytes:
    """A CA and a serving certificate for 127.0.0.1 (what the apiserver dials) in ``folder``
    (ca.crt, tls.crt, tls.key: the names controller-runtime's webhook server reads). Returns the
    CA in PEM, the webhooks' caBundle."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = _key(), _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainingrun-test-kueue-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    serving = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    (folder / "ca.crt").write_bytes(ca_pem)
    (folder / "tls.crt").write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    (folder / "tls.key").write_bytes(_pem_key(key))
    (folder / "tls.key").chmod(0o600)
    return ca_pem


# ---------------------------------------------------------------------------------------------
# manifests


def _configuration(certs: Path, webhook: int, health: int, metrics: int) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2, apis/config/v1beta2)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
        "webhook": {"host": "127.0.0.1", "port": webhook, "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {
            "frameworks": [PLACEHOLDER_FRAMEWORK],
            "externalFrameworks": [EXTERNAL_FRAMEWORK],
        },
        # waitForPodsReady is left out: off. The visibility API is an aggregated API server
        # listening on 0.0.0.0 unless configured; nothing here uses it.
        "featureGates": {"VisibilityOnDemand": False},
    }


def _crds(folder: Path, webhook: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """The module's CRDs; those Kueue converts call its conversion webhook on loopback."""
    crds = []
    for path in sorted((folder / "crds").glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=_LOADER)
        if crd["metadata"]["name"] in CONVERTED_CRDS:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": _client_config(webhook, "/convert", ca_pem),
                    "conversionReviewVersions": ["v1"],
                },
            }
        crds.append(crd)
    return crds


def _client_config(port: int, path: str, ca_pem: bytes) -> dict[str, str]:
    return {
        "url": f"https://127.0.0.1:{port}{path}",
        "caBundle": base64.b64encode(ca_pem).decode(),
    }


def _only_kueue_types(hook: dict[str, Any]) -> bool:
    """A webhook of Kueue's own API group; the others are for integrations (Pods, Jobs,
    JobSets, ...), which are off."""
    rules = hook.get("rules") or []
    return bool(rules) and all(r.get("apiGroups") == ["kueue.x-k8s.io"] for r in rules)


def _webhook_configurations(folder: Path, webhook: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """Kueue's Mutating/ValidatingWebhookConfigurations from its module
    (config/components/webhook/manifests.yaml), keeping the webhooks of Kueue's types and
    pointing them at the loopback server. failurePolicy stays Fail, as Kueue ships it: while
    Kueue is down, writes of its types fail, as on a real cluster."""
    configs = []
    for doc in yaml.load_all((folder / "webhooks.yaml").read_text(), Loader=_LOADER):
        if not doc:
            continue
        hooks = [h for h in doc["webhooks"] if _only_kueue_types(h)]
        for hook in hooks:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = _client_config(webhook, path, ca_pem)
        doc["metadata"] = {"name": WEBHOOK_CONFIGURATIONS[doc["kind"]]}
        doc["webhooks"] = hooks
        configs.append(doc)
    return configs


def _apply(env: LocalEnv, docs: list[dict[str, Any]]) -> None:
    """Server-side apply, of a List in JSON: the Workload CRD (1.4 MB) is too big for
    client-side apply's last-applied annotation, and too slow to write as YAML in Python."""
    env.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        f"--field-manager={FIELD_MANAGER}",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
    )


def _install(env: LocalEnv, folder: Path, webhook: int, ca_pem: bytes) -> None:
    crds = _crds(folder, webhook, ca_pem)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    _apply(env, [*crds, namespace, *_webhook_configurations(folder, webhook, ca_pem)])
    env.wait_established(*(c["metadata"]["name"] for c in crds))


# ---------------------------------------------------------------------------------------------
# process


def _start(env: LocalEnv, binary: Path, kdir: Path, config: Path) -> int:
    """Starts the manager in a private mount namespace whose /etc has the metrics certificate
    folder added (a read-only overlay); returns its pid (unshare and sh exec into it)."""
    mount_and_exec = 'mount -t overlay -o "lowerdir=$1:/etc" kueue-etc /etc && shift && exec "$@"'
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare.append("--map-root-user")  # a user namespace lets an unprivileged user mount
    log = (kdir / LOG_FILE).open("ab")
    proc = subprocess.Popen(
        [
            *unshare,
            "sh",
            "-c",
            mount_and_exec,
            "kueue-mount",
            str(kdir / "etc"),
            str(binary),
            f"--config={config}",
        ],
        env={**os.environ, "KUBECONFIG": env.kubeconfig},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=kdir,
    )
    (kdir / PID_FILE).write_text(str(proc.pid))
    return proc.pid


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


PROBE_FLAVOR = {
    "apiVersion": API_VERSION,
    "kind": "ResourceFlavor",
    "metadata": {"name": "tests-kueue-ready-probe"},
}


def _webhook_answers(env: LocalEnv) -> bool:
    """A server-side dry-run create goes through Kueue's mutating and validating webhooks:
    the apiserver reached the loopback server and trusted its certificate."""
    proc = env.kubectl_run("create", "--dry-run=server", "-f", "-", stdin=json.dumps(PROBE_FLAVOR))
    return proc.returncode == 0


def _wait_ready(env: LocalEnv, kueue: Kueue) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if not localenv._pid_alive(kueue.pid):
            raise RuntimeError(f"Kueue exited during start; end of kueue.log:\n{kueue.log_tail()}")
        if _healthy(kueue.health_port) and _webhook_answers(env):
            return
        time.sleep(0.3)
    raise RuntimeError(
        f"Kueue not ready after {READY_TIMEOUT_S}s (readyz on 127.0.0.1:{kueue.health_port}, "
        f"webhook on 127.0.0.1:{kueue.webhook_port}); end of kueue.log:\n{kueue.log_tail()}"
    )


# ---------------------------------------------------------------------------------------------
# public API


def load(env_name: str) -> Kueue | None:
    """The running Kueue of environment ``env_name``, or None when it does not run (ready)."""
    path = kueue_dir(env_name) / "kueue.json"
    try:
        kueue = Kueue(**json.loads(path.read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None
    if not localenv._pid_alive(kueue.pid) or not _healthy(kueue.health_port):
        return None
    return kueue


def up(env: LocalEnv) -> Kueue:
    """Starts Kueue against the environment and waits (bounded) until its readyz answers and
    the apiserver gets through its webhooks; returns the running one as it is when there is
    one."""
    existing = load(env.name)
    if existing:
        return existing
    down(env.name, quiet=True)  # what a crashed one left: its process group, stale hooks
    folder = _install_dir(env)
    kdir = kueue_dir(env.name)
    kdir.mkdir(parents=True, exist_ok=True)
    kdir.chmod(0o700)
    webhook, health, metrics = localenv.free_ports(3)
    ca_pem = _write_certs(kdir / "certs")
    metrics_certs = kdir / "etc" / METRICS_CERT_DIR
    metrics_certs.mkdir(parents=True, exist_ok=True)
    for name in ("tls.crt", "tls.key"):
        (metrics_certs / name).write_bytes((kdir / "certs" / name).read_bytes())
    config = kdir / "config.yaml"
    config.write_text(yaml.safe_dump(_configuration(kdir / "certs", webhook, health, metrics)))
    _install(env, folder, webhook, ca_pem)
    started = time.monotonic()
    pid = _start(env, folder / "kueue", kdir, config)
    kueue = Kueue(env.name, pid, webhook, health, metrics, _version())
    _log(f"Kueue {kueue.version} starting (pid {pid}, log {kueue.log_path})")
    try:
        _wait_ready(env, kueue)
    except Exception:
        down(env.name, quiet=True)
        raise
    (kdir / "kueue.json").write_text(json.dumps(asdict(kueue), indent=2))
    _log(f"Kueue ready in {time.monotonic() - started:.1f}s")
    return kueue


def down(env_name: str | None = None, quiet: bool = False) -> None:
    """Removes the environment's webhook configurations and its CRDs (with their objects), then
    stops its Kueue: the conversion webhook of a CRD left behind would fail every read of it,
    and with no CRD the cluster is one without Kueue, as an operator sees it. The CRDs go while
    Kueue still answers their conversions (their objects' cleanup reads them through it), and
    are waited for until gone: a CRD still terminating when the next ``up`` applies it would
    vanish under the new Kueue. Raises when they do not go within the bound."""
    name = env_name or localenv.env_name()
    kdir = kueue_dir(name)
    kubeconfig = state_dir(name) / "kubeconfig"
    kubectl = localenv.CACHE / "bin" / "kubectl"

    def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        command = [str(kubectl), "--kubeconfig", str(kubeconfig), "--request-timeout=10s"]
        return subprocess.run(
            [*command, *args], capture_output=True, text=True, timeout=timeout, check=False
        )

    def ours() -> list[str]:
        crds = run("get", "crd", "-o", "name").stdout.split()
        return [c for c in crds if c.endswith(".kueue.x-k8s.io")]

    reachable, crds = kubeconfig.exists() and kubectl.exists(), []
    if reachable:
        hooks = (f"{kind.lower()}/{hook}" for kind, hook in WEBHOOK_CONFIGURATIONS.items())
        run("delete", "--ignore-not-found", *hooks)
        crds = ours()
        if crds:
            run("delete", "--wait=false", "--ignore-not-found", *crds)
            deadline = time.monotonic() + CRDS_GONE_S
            while crds and time.monotonic() < deadline:
                time.sleep(1)
                crds = ours()
    with contextlib.suppress(FileNotFoundError, ValueError):
        localenv.stop_pid(int((kdir / PID_FILE).read_text() or 0))
    (kdir / PID_FILE).unlink(missing_ok=True)
    (kdir / "kueue.json").unlink(missing_ok=True)
    if crds:
        raise RuntimeError(
            f"Kueue's CRDs still there {CRDS_GONE_S:.0f} s after their delete: {', '.join(crds)}"
            " (kubectl get crd -o yaml shows what holds them)"
        )
    if not quiet:
        _log(f"Kueue of {name} down")


def queue_setup(
    env: LocalEnv, name: str, namespace: str, cpu: str = "1", memory: str = "1Gi"
) -> str:
    """A ResourceFlavor and a ClusterQueue named ``name`` with this much quota (preempting
    lower priorities within itself), and a LocalQueue ``name`` in ``namespace`` pointing at it.
    Returns the LocalQueue's name (a Workload's ``spec.queueName``) once the queues are active."""
    flavor = {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": name}}
    cluster_queue = {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [
                        {
                            "name": name,
                            "resources": [
                                {"name": "cpu", "nominalQuota": cpu},
                                {"name": "memory", "nominalQuota": memory},
                            ],
                        }
                    ],
                }
            ],
            "preemption": {"withinClusterQueue": "LowerPriority"},
        },
    }
    local_queue = {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": name},
    }
    env.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([flavor, cluster_queue, local_queue]))
    env.kubectl("wait", "--for=condition=Active", "--timeout=30s", f"clusterqueue/{name}")
    env.kubectl(
        "wait", "--for=condition=Active", "--timeout=30s", "-n", namespace, f"localqueue/{name}"
    )
    return name


def priority_class(env: LocalEnv, name: str, value: int) -> str:
    """A WorkloadPriorityClass; a Workload names it in ``spec.priorityClassRef`` (group
    kueue.x-k8s.io, kind WorkloadPriorityClass) and carries its value in ``spec.priority``."""
    wpc = {
        "apiVersion": API_VERSION,
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name},
        "value": value,
        "description": f"test priority {value}",
    }
    env.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(wpc))
    return name


@dataclass(frozen=True)
class QueueQuota:
    """The queue a test module gets from the ``queue`` fixture (tests/conftest.py), which reads
    it from the module's ``QUEUE_QUOTA``: its ClusterQueue's quota, and a
    WorkloadPriorityClass ``<queue><suffix>`` of each value in ``priorities``."""

    cpu: str
    memory: str
    priorities: dict[str, int]


@contextlib.contextmanager
def queue_for_test(
    env: LocalEnv, namespace: str, cpu: str, memory: str, priorities: dict[str, int]
) -> Iterator[str]:
    """``queue_setup`` named after ``namespace``, with a WorkloadPriorityClass
    ``<queue><suffix>`` of each value in ``priorities``; the cluster-scoped objects go
    afterwards (the LocalQueue goes with its namespace)."""
    name = queue_setup(env, namespace, namespace, cpu=cpu, memory=memory)
    for suffix, value in priorities.items():
        priority_class(env, f"{name}{suffix}", value)
    yield name
    classes = [f"workloadpriorityclass/{name}{suffix}" for suffix in priorities]
    env.kubectl(
        "delete",
        "--wait=false",
        "--ignore-not-found",
        f"clusterqueue/{name}",
        f"resourceflavor/{name}",
        *classes,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.kueue", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    args = parser.parse_args(argv)
    if args.command == "down":
        down()
        return 0
    env = localenv.load()
    if env is None:
        print(
            f"environment {localenv.env_name()} is not running: python -m tests.localenv up",
            file=sys.stderr,
        )
        return 1
    if args.command == "up":
        started = up(env)
        print(f"Kueue {started.version}: pid {started.pid}, log {started.log_path}")
        return 0
    running = load(env.name)
    if running is None:
        print(f"Kueue is not running in environment {env.name}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(running), indent=2))
    print(env.kubectl("get", "clusterqueues,localqueues,workloads", "-A"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
