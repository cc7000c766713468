"""What the shared-operator tests (test_tenants.py) stand on: an operator of their own at
``--verbose`` with the admin's allowlists, an endpoint that never answers, and a witness run in
a namespace of its own whose preemptions are timed while the other tenants misbehave."""

from __future__ import annotations

import socket
import threading
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


class Trickle:
    """A loopback HTTP port that answers each connection one byte every ``every`` seconds, for
    at most ``lifetime`` seconds and ``most`` connections at once, and counts the connections:
    an endpoint that keeps a call going forever unless the caller ends it by the wall clock, or,
    never to be called, a trap whose ``connections`` must stay 0."""

    ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100_000

    def __init__(self, every: float = 2.0, lifetime: float = 120.0, most: int = 64) -> None:
        self.every, self.lifetime, self.most = every, lifetime, most
        self.connections = 0
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.sock.settimeout(0.5)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:  # the 0.5 s timeout, or closed
                continue
            with self._lock:
                self.connections += 1
                if len(self._open) >= self.most:
                    conn.close()
                    continue
                self._open.append(conn)
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        ends = time.monotonic() + self.lifetime
        try:
            for byte in self.ANSWER:
                if self._stop.wait(self.every) or time.monotonic() > ends:
                    break
                conn.sendall(bytes([byte]))
        except OSError:  # the caller gave up and closed
            pass
        finally:
            with self._lock:
                self._open.remove(conn)
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(timeout=5)


def base_uri(env: LocalEnv, namespace: str) -> str:
    """The folder the tests' admin allows a namespace's runs (``TRAININGRUN_ALLOWED_URIS``)."""
    return f"s3://{env.bucket}/tenants/{namespace}"


GCS_BUCKET = "trainingrun-tenants-gcs"  # allowed by the admin on Google's own service


def operator_env(
    env: LocalEnv, blackhole: Blackhole, trickle: Trickle, missing_bucket: str
) -> dict[str, str]:
    """The admin's settings of the tests' operator: the environment's S3 endpoint, the
    blackhole, the trickling endpoint and Google Cloud Storage itself allowed, each namespace
    kept to its own folder (and one of a bucket that does not exist, and one on Cloud Storage),
    and sidecars that give up on access denied after ``ACCESS_DENIED_SECONDS``."""
    return {
        "TRAININGRUN_ALLOWED_ENDPOINTS": f"{env.s3_endpoint},{blackhole.url},{trickle.url},gcs",
        "TRAININGRUN_ALLOWED_URIS": ",".join(
            [
                base_uri(env, "{namespace}"),
                f"s3://{missing_bucket}/{{namespace}}",
                f"gs://{GCS_BUCKET}/{{namespace}}",
            ]
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


def tenant_run_key(namespace: str, name: str) -> str:
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
        key = tenant_run_key(self.runs.namespace, self.name)
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
