"""What the shared-operator tests (test_tenants.py) stand on: an operator of their own at
``--verbose`` with the admin's allowlists, an endpoint that never answers, and a witness run in
a namespace of its own whose preemptions are timed while the other tenants misbehave."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from tests.e2e.example import on_nodes
from tests.integration.support import Runs, commit_checkpoint, trainingrun
from tests.localenv import LocalEnv
from trainingrun.contract import TRAINER_CONTAINER

MISSING_BUCKET = "trainingrun-no-such-bucket"  # allowed by the admin, never created
# Seconds of nothing but access denied before the tests' sync sidecars exit (300 by default).
ACCESS_DENIED_SECONDS = 5


class Blackhole:
    """A loopback TCP port that takes connections and never answers: every call to it waits
    out the caller's whole timeout (a tenant's endpoint made to hold the operator's workers)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)  # connections wait in the backlog, never accepted or read
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()


def base_uri(env: LocalEnv, namespace: str) -> str:
    """The folder the tests' admin allows a namespace's runs (``TRAININGRUN_ALLOWED_URIS``)."""
    return f"s3://{env.bucket}/tenants/{namespace}"


def operator_env(env: LocalEnv, blackhole: Blackhole, missing_bucket: str) -> dict[str, str]:
    """The admin's settings of the tests' operator: the environment's S3 endpoint and the
    blackhole allowed, each namespace kept to its own folder (and one of a bucket that does not
    exist), and sidecars that give up on access denied after ``ACCESS_DENIED_SECONDS``."""
    return {
        "TRAININGRUN_ALLOWED_ENDPOINTS": f"{env.s3_endpoint},{blackhole.url}",
        "TRAININGRUN_ALLOWED_URIS": ",".join(
            [base_uri(env, "{namespace}"), f"s3://{missing_bucket}/{{namespace}}"]
        ),
        "TRAININGRUN_AGENT_ACCESS_DENIED_SECONDS": str(ACCESS_DENIED_SECONDS),
        # Every run looked at every 2 s (10 by default), so a running attempt's newest
        # checkpoint reaches its status soon: the tests wait for it.
        "TRAININGRUN_RESYNC_SECONDS": "2",
    }


def tenant_run(name: str, env: LocalEnv, namespace: str, **kwargs: Any) -> dict[str, Any]:
    """A run under its namespace's allowed folder (``trainingrun`` otherwise)."""
    body = trainingrun(name, env, "", **kwargs)
    body["spec"]["checkpoint"]["storage"]["uri"] = base_uri(env, namespace)
    return body


def run_key(namespace: str, name: str) -> str:
    """Where a ``tenant_run``'s checkpoints live in the bucket."""
    return f"tenants/{namespace}/{namespace}/{name}"


@dataclass
class Witness:
    """A well-behaved run in a namespace of its own, on a kwok node: each ``preempt`` evicts its
    pod (after it committed a checkpoint, so the attempt made progress and no backoff applies)
    and returns the seconds until the operator had the next attempt's pod created."""

    runs: Runs
    env: LocalEnv
    s3: Any
    name: str = "witness"
    attempt: int = 1
    step: int = 0
    seconds: list[float] = field(default_factory=list)

    def start(self, node: str) -> None:
        self.runs.create(tenant_run(self.name, self.env, self.runs.namespace, node=node))
        self.wait_running()

    def wait_running(self) -> None:
        self.runs.wait_pod_running(f"{self.name}-{self.attempt}", 60)

    def preempt(self) -> float:
        self.step += 1
        key = run_key(self.runs.namespace, self.name)
        commit_checkpoint(self.s3, self.env.bucket, key, self.step, {"w.bin": b"x" * 64})
        self.runs.wait_status(
            self.name,
            lambda s: (s.get("latestCheckpoint") or {}).get("step") == self.step,
            30,
            f"the witness's checkpoint {self.step}",
        )
        pod = f"{self.name}-{self.attempt}"
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod))
        started = time.monotonic()
        self.runs.core.create_namespaced_pod_eviction(pod, self.runs.namespace, body)
        self.attempt += 1
        nxt = f"{self.name}-{self.attempt}"
        deadline = started + 120
        # Polled every 0.1 s, finer than wait_for: the seconds it takes are the figure.
        while self.runs.pod(nxt) is None:
            assert time.monotonic() < deadline, f"the witness's {nxt} not created in 120 s"
            time.sleep(0.1)
        took = time.monotonic() - started
        self.seconds.append(took)
        self.wait_running()
        return took


def on_runner(body: dict[str, Any], node: str, script: str) -> dict[str, Any]:
    """``body`` with a pod template whose trainer runs the Python ``script`` on the pod runner
    ``node``."""
    trainer = {"name": TRAINER_CONTAINER, "image": "t:1", "command": ["python", "-c", script]}
    body["spec"]["template"]["spec"] = {**on_nodes([node]), "containers": [trainer]}
    return body
