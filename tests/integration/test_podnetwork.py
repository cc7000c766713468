"""Networks of their own for gang pods (tests/podrunner/podnet.py), on two runner nodes of the
real environment, no mocks.

Covers: two pods of subdomain ``g`` on two nodes both hold TCP port 29500 at once; rank 1,
started first, reaches rank 0 by ``g-1-0.g:29500`` (and the ``….svc.cluster.local`` name) once
rank 0's address is known, and they exchange bytes; distinct podIPs in status and through
``fieldRef status.podIP``; each pod sees its own hostname; torchrun's gloo all-reduce between
two such pods, rank 0 found as ``PET_MASTER_ADDR=<pod>.g`` (when torch is installed); a
container reaches SeaweedFS at ``AWS_ENDPOINT_URL`` (the machine's loopback) through the
forwarder, uploading 32 MiB in parallel parts and reading it back; each container runs in its
pod's namespace, and after the pods are deleted their namespaces are gone and the machine's own
network namespace is as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.support import wait_for
from tests.integration.test_podrunner import create, make_pod, pod_exists, terminated, wait_phase
from tests.localenv import IP, NETNS_DIR, LocalEnv, netns_prefix
from tests.podrunner import RunnerHandle, start_runner
from tests.podrunner.podnet import SUBNET

SUBDOMAIN = "g"
PORT = 29500
FIELD_ENV = [
    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
]

RANK0 = f"""
import os, socket
server = socket.create_server(("0.0.0.0", {PORT}))
server.settimeout(60)
conn, peer = server.accept()
conn.settimeout(30)
data = conn.recv(1024)
conn.sendall(b"pong:" + data)
conn.close()
fields = [socket.gethostname(), os.environ["POD_IP"], peer[0], data.decode()]
open("/dev/termination-log", "w").write("|".join(fields))
"""

RANK1 = f"""
import os, socket, time
own = socket.create_server(("0.0.0.0", {PORT}))  # the port rank 0 holds, at the same time
deadline = time.monotonic() + 60
while True:
    try:
        conn = socket.create_connection(("g-1-0.{SUBDOMAIN}", {PORT}), timeout=5)
        break
    except OSError:  # no address for the name yet, or rank 0 not listening yet
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
conn.settimeout(30)
conn.sendall(b"hello from " + socket.gethostname().encode())
reply = conn.recv(1024)
fqdn = "g-1-0.{SUBDOMAIN}." + os.environ["NS"] + ".svc.cluster.local"
fields = [socket.gethostname(), os.environ["POD_IP"], conn.getpeername()[0],
          socket.gethostbyname(fqdn), reply.decode()]
own.close()
open("/dev/termination-log", "w").write("|".join(fields))
"""

S3_ROUNDTRIP = """
import hashlib, io, os, boto3
from boto3.s3.transfer import TransferConfig
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
data = os.urandom(32 * 1024 * 1024)
parts = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20, max_concurrency=4)
s3.upload_fileobj(io.BytesIO(data), os.environ["BUCKET"], os.environ["KEY"], Config=parts)
back = io.BytesIO()
s3.download_fileobj(os.environ["BUCKET"], os.environ["KEY"], back, Config=parts)
assert back.getvalue() == data, "read back differs"
open("/dev/termination-log", "w").write(hashlib.sha256(data).hexdigest())
"""

ALLREDUCE = """
import socket, torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
message = f"{socket.gethostname()}|{dist.get_rank()}|{total.item()}"
dist.destroy_process_group()
open("/dev/termination-log", "w").write(message)
"""

WAIT_FOR_TERM = "trap 'exit 0' TERM; while true; do sleep 0.1; done"


@pytest.fixture(scope="module")
def nodes(localenv: LocalEnv) -> Iterator[tuple[RunnerHandle, RunnerHandle]]:
    with contextlib.ExitStack() as stack:
        handles = []
        for _ in range(2):
            handle = start_runner(localenv)
            stack.callback(handle.stop)
            handles.append(handle)
        yield handles[0], handles[1]
        for handle in handles:
            print(f"--- {handle.node} log (last 3000 chars) ---\n{handle.runner_log()[-3000:]}")


def gang_pod(
    name: str, node: str, command: list[str], env: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A pod of a gang: hostname = its name, subdomain ``g``."""
    container = {
        "name": "main",
        "image": "local.invalid/none",
        "command": command,
        "env": [*FIELD_ENV, *(env or [])],
    }
    pod = make_pod(name, node, [container], grace=3)
    pod["metadata"]["labels"] = {"trainingrun.dev/run": SUBDOMAIN}
    pod["spec"].update(hostname=name, subdomain=SUBDOMAIN)
    return pod


def env_netns(localenv: LocalEnv) -> set[str]:
    """The environment's pod network namespaces (not its hub)."""
    return {p.name for p in NETNS_DIR.glob(f"{netns_prefix(localenv.name)}p*")}


def root_network() -> tuple[list[str], list[str]]:
    """The machine's own interfaces and addresses, as ``ip -o`` lists them."""

    def lines(*args: str) -> list[str]:
        out = subprocess.run([IP, "-o", *args], capture_output=True, text=True, check=True)
        return sorted(out.stdout.splitlines())

    return lines("link"), lines("addr")


def netns_of(pid: int) -> str:
    out = subprocess.run(
        [IP, "netns", "identify", str(pid)], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_two_ranks_on_two_nodes_share_a_port_and_find_each_other_by_name(
    nodes: tuple[RunnerHandle, RunnerHandle], core_v1: Any, namespace: str
) -> None:
    first, second = nodes
    # Rank 1 first: it starts before rank 0 has an address, as a gang's pods may.
    create(core_v1, namespace, gang_pod("g-1-1", second.node, ["python", "-c", RANK1]))
    wait_phase(core_v1, namespace, "g-1-1", ("Running",))
    create(core_v1, namespace, gang_pod("g-1-0", first.node, ["python", "-c", RANK0]))

    done = {
        n: wait_phase(core_v1, namespace, n, ("Succeeded", "Failed")) for n in ("g-1-0", "g-1-1")
    }
    for name, handle in (("g-1-0", first), ("g-1-1", second)):
        log = handle.log_of(namespace, name, "main")
        assert done[name]["status"]["phase"] == "Succeeded", f"{name}: {log}"
    ip0, ip1 = (done[n]["status"]["podIP"] for n in ("g-1-0", "g-1-1"))
    assert ip0 != ip1
    assert all(ipaddress.ip_address(ip) in SUBNET for ip in (ip0, ip1))
    assert done["g-1-0"]["status"]["podIPs"] == [{"ip": ip0}]
    host0, env_ip0, peer_of_0, received = terminated(done["g-1-0"], "main")["message"].split("|")
    assert (host0, env_ip0, peer_of_0) == ("g-1-0", ip0, ip1)
    assert received == "hello from g-1-1"
    host1, env_ip1, connected_to, fqdn_ip, reply = terminated(done["g-1-1"], "main")[
        "message"
    ].split("|")
    assert (host1, env_ip1, connected_to, fqdn_ip) == ("g-1-1", ip1, ip0, ip0)
    assert reply == "pong:hello from g-1-1"


def test_torchrun_gloo_allreduce_across_two_nodes_by_the_short_name(
    nodes: tuple[RunnerHandle, RunnerHandle], core_v1: Any, namespace: str
) -> None:
    pytest.importorskip("torch", reason="torch comes with the hf extra")
    gang = {"g-4-0": nodes[0], "g-4-1": nodes[1]}
    for rank, (name, handle) in reversed(list(enumerate(gang.items()))):
        env = [
            {"name": "PET_MASTER_ADDR", "value": f"g-4-0.{SUBDOMAIN}"},
            {"name": "PET_MASTER_PORT", "value": str(PORT)},
            {"name": "PET_NNODES", "value": "2"},
            {"name": "PET_NPROC_PER_NODE", "value": "1"},
            {"name": "PET_NODE_RANK", "value": str(rank)},
        ]
        command = ["torchrun", "--no-python", "python", "-c", ALLREDUCE]
        create(core_v1, namespace, gang_pod(name, handle.node, command, env))
    for rank, (name, handle) in enumerate(gang.items()):
        done = wait_phase(core_v1, namespace, name, ("Succeeded", "Failed"), timeout_s=120)
        log = handle.log_of(namespace, name, "main")[-3000:]
        assert done["status"]["phase"] == "Succeeded", log
        assert terminated(done, "main")["message"] == f"{name}|{rank}|3.0"


def test_a_container_reaches_the_machines_s3_through_its_loopback(
    nodes: tuple[RunnerHandle, RunnerHandle],
    core_v1: Any,
    namespace: str,
    localenv: LocalEnv,
    s3: Any,
) -> None:
    key = f"podnet/{uuid.uuid4().hex[:10]}/blob"
    assert localenv.s3_endpoint.startswith("http://127.0.0.1:")
    env = [
        {"name": "AWS_ENDPOINT_URL", "value": localenv.s3_endpoint},
        {"name": "AWS_ACCESS_KEY_ID", "value": localenv.s3_access_key},
        {"name": "AWS_SECRET_ACCESS_KEY", "value": localenv.s3_secret_key},
        {"name": "AWS_DEFAULT_REGION", "value": localenv.s3_region},
        {"name": "BUCKET", "value": localenv.bucket},
        {"name": "KEY", "value": key},
    ]
    pod = gang_pod("g-2-0", nodes[0].node, ["python", "-c", S3_ROUNDTRIP], env)
    create(core_v1, namespace, pod)
    done = wait_phase(core_v1, namespace, "g-2-0", ("Succeeded", "Failed"), timeout_s=90)
    log = nodes[0].log_of(namespace, "g-2-0", "main")
    assert done["status"]["phase"] == "Succeeded", log
    stored = s3.get_object(Bucket=localenv.bucket, Key=key)["Body"].read()
    assert len(stored) == 32 * 1024 * 1024
    assert terminated(done, "main")["message"] == hashlib.sha256(stored).hexdigest()
    s3.delete_object(Bucket=localenv.bucket, Key=key)


def test_pod_namespaces_go_with_the_pods_and_the_root_namespace_is_untouched(
    nodes: tuple[RunnerHandle, RunnerHandle], core_v1: Any, namespace: str, localenv: LocalEnv
) -> None:
    root_before, netns_before = root_network(), env_netns(localenv)
    names = {"g-3-0": nodes[0], "g-3-1": nodes[1]}
    for name, handle in names.items():
        create(core_v1, namespace, gang_pod(name, handle.node, ["sh", "-c", WAIT_FOR_TERM]))
    for name in names:
        wait_phase(core_v1, namespace, name, ("Running",))
    pods_netns = {netns_of(h.wait_pid(namespace, n, "main")) for n, h in names.items()}
    assert len(pods_netns) == 2 and pods_netns <= env_netns(localenv) - netns_before
    assert root_network() == root_before, "a pod's network changed the machine's"

    for name in names:
        core_v1.delete_namespaced_pod(name, namespace)
    wait_for(lambda: not (pods_netns & env_netns(localenv)), 30, "the pods' netns removed")
    wait_for(lambda: not any(pod_exists(core_v1, namespace, n) for n in names), 30, "pods gone")
    assert root_network() == root_before, "the machine's network namespace changed"
