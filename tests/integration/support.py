"""Helpers for operator integration tests: the operator as a real process, TrainingRun manifests,
kubelet-like pod status writes, and checkpoints committed to the real bucket the way the sync
sidecar commits them (objects, then MANIFEST.json create-only, then manifest.json)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client

from tests.localenv import LocalEnv
from trainingrun import api
from trainingrun.checkpoint.manifest import (
    CHECKPOINT_MANIFEST,
    MANIFEST_VERSION,
    RUN_MANIFEST,
    CheckpointManifest,
    FileEntry,
    ManifestEntry,
    RunManifest,
    checkpoint_prefix,
    parse_run_manifest,
)
from trainingrun.storage.opener import S3Store, Store

T = TypeVar("T")


def wait_for(predicate: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """Polls ``predicate`` (bounded by ``timeout_s``) until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


# How long the tests' operator waits for a missing credentials Secret before the run fails.
SECRET_WAIT_SECONDS = 20


@dataclass
class OperatorProcess:
    """``trainingrun operator`` as a real process against the local control plane."""

    env: LocalEnv
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    metrics_port: int = 0  # serve /metrics on 127.0.0.1 at this port (0: off)
    args: list[str] = field(default_factory=list)  # more arguments of `trainingrun operator`

    def start(self) -> None:
        env = {
            **os.environ,
            "KUBECONFIG": self.env.kubeconfig,
            "TRAININGRUN_RESYNC_SECONDS": "600",
            "TRAININGRUN_CHECKPOINT_REFRESH_SECONDS": "1",
            "TRAININGRUN_PROGRESS_REFRESH_SECONDS": "1",
            "TRAININGRUN_SECRET_WAIT_SECONDS": str(SECRET_WAIT_SECONDS),
            **self.extra_env,
        }
        log = self.log_path.open("ab")
        metrics = (
            ["--metrics-port", str(self.metrics_port), "--metrics-address", "127.0.0.1"]
            if self.metrics_port
            else []
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainingrun.cli", "operator", *metrics, *self.args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        """SIGKILL: no chance to finish anything."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def metrics(self) -> dict[str, float]:
        """The samples of its /metrics page: ``name{labels}`` -> value."""
        page = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10)
        samples = {}
        for line in page.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples


def credentials_secret(
    env: LocalEnv, name: str = "s3creds", identity: str | None = None
) -> client.V1Secret:
    """A Secret with the environment's S3 keys (or those of one of its other ``identity``), as
    ``credentialsSecret`` expects them. Created through the API, never as kubectl arguments, so
    the key never shows in a process list."""
    key, secret = env.identity(identity) if identity else (env.s3_access_key, env.s3_secret_key)
    return client.V1Secret(
        metadata=client.V1ObjectMeta(name=name),
        string_data={"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret},
    )


def trainingrun(
    name: str,
    env: LocalEnv,
    prefix: str,
    *,
    secret: str = "s3creds",
    restart_policy: dict[str, Any] | None = None,
    preemption: dict[str, Any] | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "containers": [{"name": "trainer", "image": "example.invalid/trainer:1"}]
    }
    if node:
        pod_spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    spec: dict[str, Any] = {
        "template": {"spec": pod_spec},
        "checkpoint": {
            "storage": {
                "uri": f"s3://{env.bucket}/{prefix}",
                "endpoint": env.s3_endpoint,
                "region": env.s3_region,
                "credentialsSecret": secret,
            }
        },
        "restartPolicy": {
            "backoff": {"initialSeconds": 1, "maxSeconds": 2},
            **(restart_policy or {}),
        },
    }
    if preemption:
        spec["preemption"] = preemption
    return {
        "apiVersion": f"{api.GROUP}/{api.VERSION}",
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": spec,
    }


class Runs:
    """TrainingRun calls of one test namespace."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace

    @classmethod
    def with_credentials(cls, api_client: Any, namespace: str, env: LocalEnv) -> Runs:
        """The namespace's runs, with the Secret ``s3creds`` of the environment's keys."""
        runs = cls(api_client, namespace)
        runs.core.create_namespaced_secret(namespace, credentials_secret(env))
        return runs

    def create(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(
            api.GROUP, api.VERSION, self.namespace, api.PLURAL, body
        )

    def get(self, name: str) -> dict[str, Any]:
        run: dict[str, Any] = self.custom.get_namespaced_custom_object(
            api.GROUP, api.VERSION, self.namespace, api.PLURAL, name
        )
        return run

    def patch(self, name: str, body: dict[str, Any]) -> None:
        """A merge patch of the run (its spec; the status is the operator's)."""
        self.custom.patch_namespaced_custom_object(
            api.GROUP, api.VERSION, self.namespace, api.PLURAL, name, body
        )

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(
            api.GROUP, api.VERSION, self.namespace, api.PLURAL, name
        )

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def wait_status(
        self, name: str, check: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
    ) -> dict[str, Any]:
        return wait_for(lambda: (s := self.status(name)) and check(s) and s, timeout_s, what)

    def pod(self, name: str) -> Any:
        try:
            return self.core.read_namespaced_pod(name, self.namespace)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    def wait_pod_running(self, name: str, timeout_s: float = 30) -> Any:
        return wait_for(
            lambda: (p := self.pod(name)) and p.status.phase == "Running" and p,
            timeout_s,
            f"pod {name} Running",
        )

    def pods_of(self, run: str) -> list[Any]:
        return list(
            self.core.list_namespaced_pod(
                self.namespace, label_selector=f"trainingrun.dev/run={run}"
            ).items
        )

    def events(self, run: str) -> list[Any]:
        return [
            e
            for e in self.core.list_namespaced_event(self.namespace).items
            if e.involved_object.name == run and e.involved_object.kind == api.KIND
        ]

    def wait_events(self, run: str, reason: str, timeout_s: float = 15) -> list[Any]:
        """The run's Events with ``reason``, once there is at least one: the operator posts
        Events from a thread of its own after the status write they report, so a test that saw
        the status change waits for them."""
        return wait_for(
            lambda: [e for e in self.events(run) if e.reason == reason],
            timeout_s,
            f"a {reason} Event on {run}",
        )

    def end_pod(
        self, name: str, exit_code: int, reason: str = "", container: str = "trainer"
    ) -> None:
        """Writes a terminated container and the pod phase, as the kubelet does."""
        pod = self.core.read_namespaced_pod(name, self.namespace)
        term = {
            "exitCode": exit_code,
            "reason": reason or ("Completed" if exit_code == 0 else "Error"),
        }
        statuses = [container_status(container, {"terminated": term})]
        key = "containerStatuses"
        if container != "trainer":
            key = "initContainerStatuses"
        body = {
            "status": {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                key: statuses,
            }
        }
        del pod
        self.core.patch_namespaced_pod_status(name, self.namespace, body)

    def pull_failing(
        self, name: str, reason: str, message: str, scheduled_ago_s: float | None = None
    ) -> None:
        """Writes the trainer waiting on an image pull, as the kubelet does while it retries;
        with ``scheduled_ago_s``, also moves the pod's PodScheduled time that far back."""
        waiting = {"waiting": {"reason": reason, "message": message}}
        status: dict[str, Any] = {"containerStatuses": [container_status("trainer", waiting)]}
        if scheduled_ago_s is not None:
            at = datetime.now(UTC) - timedelta(seconds=scheduled_ago_s)
            status["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastTransitionTime": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            ]
        self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})

    def env_of(self, pod: Any, container: str = "trainer") -> dict[str, str]:
        for c in pod.spec.containers + (pod.spec.init_containers or []):
            if c.name == container:
                return {e.name: e.value for e in c.env or [] if e.value is not None}
        raise AssertionError(f"no container {container} in {pod.metadata.name}")


def evict(core: Any, namespace: str, pod: str) -> None:
    """The Eviction API on ``pod``, as a drain or a spot handler asks for it."""
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
    core.create_namespaced_pod_eviction(pod, namespace, body)


def container_status(name: str, state: dict[str, Any]) -> dict[str, Any]:
    """A container's status entry, not ready, in ``state``, as the kubelet writes it."""
    return {
        "name": name,
        "ready": False,
        "restartCount": 0,
        "image": "example.invalid/trainer:1",
        "imageID": "",
        "state": state,
    }


def commit_checkpoint(
    s3: Any,
    bucket: str,
    run_key: str,
    step: int,
    files: dict[str, bytes],
    upload_seconds: float | None = None,
) -> None:
    """``commit_checkpoint_to`` the S3 bucket of the boto3 client ``s3``."""
    commit_checkpoint_to(S3Store(s3, bucket), run_key, step, files, upload_seconds)


def commit_checkpoint_to(
    store: Store,
    run_key: str,
    step: int,
    files: dict[str, bytes],
    upload_seconds: float | None = None,
) -> None:
    """Commits a checkpoint in the version-1 layout (``checkpoint-<step>/`` with its files),
    as a run begun before the upgrade has them: objects, MANIFEST.json, manifest.json.
    ``upload_seconds``: the upload time its sidecar would have recorded."""
    prefix = f"{run_key}/{checkpoint_prefix(step)}"
    entries = []
    for path, data in files.items():
        store.put(prefix + path, data, content_type="application/octet-stream")
        digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
        # Not validated: a test may plant names the sidecar would never commit.
        entries.append(
            FileEntry.model_construct(
                path=path, size=len(data), checksum_algorithm="SHA256", checksum=digest
            )
        )
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ckpt = CheckpointManifest(version=MANIFEST_VERSION, step=step, files=entries, created=now)
    store.put(prefix + CHECKPOINT_MANIFEST, ckpt.model_dump_json().encode(), if_none_match=True)
    body = store.get(f"{run_key}/{RUN_MANIFEST}")
    current = parse_run_manifest(body) if body is not None else RunManifest()
    entry = ManifestEntry(
        step=step,
        prefix=checkpoint_prefix(step),
        committed=now,
        files=len(entries),
        bytes=sum(len(d) for d in files.values()),
        upload_seconds=upload_seconds,
    )
    # The fence the operator took stays: only the entries change.
    manifest = current.model_copy(update={"entries": [*current.entries, entry]})
    store.put(f"{run_key}/{RUN_MANIFEST}", manifest.to_json())


def pid_alive(pid: int) -> bool:
    """Running or stopped; a zombie waiting for init to reap it counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def node_ready(core: Any, node: str) -> str:
    """The status of the node's Ready condition: True, False, Unknown or missing."""
    for c in core.read_node(node).status.conditions or []:
        if c.type == "Ready":
            return str(c.status)
    return "missing"


def mark_unknown(core: Any, node: str) -> None:
    """What the node-lifecycle controller writes once a node's grace has passed without a
    heartbeat (200 s in this environment: too long to wait for in a test)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    core.patch_node_status(node, {"status": {"conditions": [ready]}})


@dataclass(frozen=True)
class CommittedFile:
    """Where a committed file's bytes are: its own object, or the pack that holds it (a
    part's small files are packed, trainingrun.agent.packs)."""

    key: str
    offset: int
    size: int


def committed_file(get: Callable[[str], bytes], part: str, path: str) -> CommittedFile:
    """File ``path`` of the part whose keys start with ``part`` (ending in /), by its
    MANIFEST.json; ``get`` reads an object's bytes."""
    record = json.loads(get(part + "MANIFEST.json"))
    found = next(f for f in record["files"] if f["path"] == path)
    if found.get("pack"):
        return CommittedFile(part + found["pack"], found["offset"], found["size"])
    return CommittedFile(part + path, 0, found["size"])


def read_committed(get: Callable[[str], bytes], part: str, path: str) -> bytes:
    """The bytes of file ``path`` of a committed part, from its own object or its pack."""
    where = committed_file(get, part, path)
    return get(where.key)[where.offset : where.offset + where.size]


def s3_reader(s3: Any, bucket: str) -> Callable[[str], bytes]:
    """``get`` for committed_file over a boto3 client."""
    return lambda key: bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
