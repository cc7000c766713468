"""The local pod runner's pure network rules (tests/podrunner/hosts.py, forward.py, spec.py,
status.py): which pods are a pod's peers, the hosts file it gets, which loopback ports are
forwarded, and the pod's own address in ``fieldRef status.podIP`` and in its status."""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import pytest

from tests.podrunner import forward
from tests.podrunner.forward import loopback_ports
from tests.podrunner.hosts import Peer, hosts_file, peer_of
from tests.podrunner.spec import container_env, field_value
from tests.podrunner.status import Progress, Transitions, pod_status


def pod(name: str, **spec: Any) -> dict[str, Any]:
    status = spec.pop("status", {"podIP": "10.244.0.9", "phase": "Running"})
    meta = {"name": name, "namespace": "ml", "uid": f"u-{name}"}
    return {"metadata": meta, "spec": spec, "status": status}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (pod("r-1-0", hostname="h0", subdomain="r"), Peer("h0", "r", "10.244.0.9", "u-r-1-0")),
        (pod("r-1-0", subdomain="r"), Peer("r-1-0", "r", "10.244.0.9", "u-r-1-0")),
        (pod("r-1-0", hostname="h0"), None),
        (pod("r-1-0", subdomain="r", status={"phase": "Pending"}), None),
        (pod("r-1-0", subdomain="r", status={"podIP": "10.244.0.9", "phase": "Failed"}), None),
    ],
    ids=["hostname", "name-as-hostname", "no-subdomain", "no-address-yet", "ended"],
)
def test_peer_of(obj: dict[str, Any], expected: Peer | None) -> None:
    assert peer_of(obj) == expected


def test_hosts_file_names_the_pod_and_its_subdomains_peers() -> None:
    own = Peer("r-1-1", "r", "10.244.0.3", "u1")
    peers = [
        Peer("r-1-1", "r", "10.244.0.3", "u1"),  # itself, as the API shows it
        Peer("r-1-0", "r", "10.244.0.2", "u0"),
        Peer("r-1-0", "r", "10.244.0.7", "u0-old"),  # a second one of a hostname: the first wins
        Peer("x-1-0", "x", "10.244.0.5", "ux"),  # another subdomain
    ]
    lines = hosts_file("ml", own, peers).splitlines()
    assert "127.0.0.1\tlocalhost" in lines
    assert "10.244.0.3\tr-1-1.r.ml.svc.cluster.local\tr-1-1.r.ml.svc\tr-1-1.r\tr-1-1" in lines
    assert "10.244.0.2\tr-1-0.r.ml.svc.cluster.local\tr-1-0.r.ml.svc\tr-1-0.r" in lines
    assert not [line for line in lines if "10.244.0.7" in line or "x-1-0" in line]
    assert sum("r-1-1" in line for line in lines) == 1


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["http://127.0.0.1:8333"], {8333}),
        (["http://localhost:9000/bucket", "https://[::1]:443"], {9000, 443}),
        (["endpoint=http://127.0.0.1:1 and http://localhost:2"], {1, 2}),
        (["http://10.0.0.1:8333", "127.0.0.1:8333", "http://127.0.0.1"], set()),
        (["http://127.0.0.1:99999", "http://localhost:0"], set()),
    ],
    ids=["ip", "localhost-and-ipv6", "several-in-one", "not-loopback-urls", "no-such-port"],
)
def test_loopback_ports(values: list[str], expected: set[int]) -> None:
    assert loopback_ports(values) == expected


def test_own_address_and_hostname_reach_the_environment() -> None:
    gang = pod("r-1-0", hostname="h0", subdomain="r")
    ip_ref = {"fieldRef": {"fieldPath": "status.podIP"}}
    container = {"name": "c", "env": [{"name": "IP", "valueFrom": ip_ref}]}
    env = container_env(gang, container, lambda *_: None, "10.244.0.2")
    assert (env["IP"], env["HOSTNAME"]) == ("10.244.0.2", "h0")
    assert field_value(gang, "status.podIP") == "127.0.0.1"  # without an address of its own
    assert field_value(gang, "status.hostIP", "10.244.0.2") == "127.0.0.1"


@pytest.mark.parametrize("ip", ["127.0.0.1", "10.244.0.2"])
def test_status_reports_the_pod_address(ip: str) -> None:
    progress = Progress(
        sandbox=True, done=False, lost=False, shut_down=False, start_time=None, pod_ip=ip
    )
    status = pod_status([], progress, Transitions(), set())
    assert (status["podIP"], status["podIPs"], status["hostIP"]) == (ip, [{"ip": ip}], "127.0.0.1")


# -- the relay's pump -------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 3 * 1024 * 1024 + 17], ids=["empty", "one-byte", "3mib"])
def test_the_pump_copies_every_byte_both_ways_and_passes_the_end_on(size: int) -> None:
    """Two relayed directions at once, as a connection through a pod's relay: each side's
    bytes arrive whole and in order, and each side's end of stream arrives as a half close."""
    pod_side, relay_in = socket.socketpair()
    relay_out, server_side = socket.socketpair()
    up, down = os.urandom(size), os.urandom(size // 2 + 5)
    back = threading.Thread(target=forward.pump, args=(relay_out, relay_in))
    there = threading.Thread(target=forward.pump, args=(relay_in, relay_out))
    back.start()
    there.start()
    got: dict[str, bytes] = {}

    def read_all(name: str, s: socket.socket) -> None:
        chunks = []
        while chunk := s.recv(1 << 16):
            chunks.append(chunk)
        got[name] = b"".join(chunks)

    readers = [
        threading.Thread(target=read_all, args=("server", server_side)),
        threading.Thread(target=read_all, args=("pod", pod_side)),
    ]
    for r in readers:
        r.start()
    pod_side.sendall(up)
    pod_side.shutdown(socket.SHUT_WR)
    server_side.sendall(down)
    server_side.shutdown(socket.SHUT_WR)
    for t in (*readers, back, there):
        t.join(30)
        assert not t.is_alive()
    for s in (pod_side, relay_in, relay_out, server_side):
        s.close()

    assert got["server"] == up
    assert got["pod"] == down
