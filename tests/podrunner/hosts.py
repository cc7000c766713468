"""The /etc/hosts of a pod with a network of its own, as plain data: the names a cluster's DNS
gives the pods of a headless Service's subdomain (``<hostname>.<subdomain>``, ``….<ns>.svc``,
``….<ns>.svc.cluster.local``), the pod's own hostname, and the localhost lines the kubelet
writes. Nothing here talks to the API; ``tests.podrunner.peers`` learns the peers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tests.podrunner.spec import pod_hostname
from tests.podrunner.status import TERMINAL

CLUSTER_DOMAIN = "cluster.local"
HEADER = "# Kubernetes-managed hosts file (tests.podrunner: this pod and its subdomain's peers)."
LOCALHOST = [
    "127.0.0.1\tlocalhost",
    "::1\tlocalhost ip6-localhost ip6-loopback",
    "fe00::0\tip6-localnet",
    "fe00::0\tip6-mcastprefix",
    "fe00::1\tip6-allnodes",
    "fe00::2\tip6-allrouters",
]


@dataclass(frozen=True, order=True)
class Peer:
    """A pod as its subdomain's DNS names it."""

    hostname: str
    subdomain: str
    ip: str
    uid: str


def peer_of(pod: dict[str, Any]) -> Peer | None:
    """The pod as a peer: one with a subdomain and an address, not ended (an ended pod's
    address may already be another pod's)."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    if not spec.get("subdomain") or not status.get("podIP") or status.get("phase") in TERMINAL:
        return None
    return Peer(
        hostname=pod_hostname(pod),
        subdomain=str(spec["subdomain"]),
        ip=str(status["podIP"]),
        uid=str(pod["metadata"].get("uid", "")),
    )


def dns_names(peer: Peer, namespace: str) -> list[str]:
    """The names a cluster's DNS resolves to ``peer``, longest first, as the kubelet writes
    its own line; the short form relies on the search domain ``<ns>.svc.cluster.local``."""
    short = f"{peer.hostname}.{peer.subdomain}"
    return [f"{short}.{namespace}.svc.{CLUSTER_DOMAIN}", f"{short}.{namespace}.svc", short]


def hosts_file(namespace: str, own: Peer, peers: Iterable[Peer]) -> str:
    """The whole file: localhost, the pod itself (also by its bare hostname), then every other
    pod of its subdomain (the first of one hostname wins)."""
    lines = [HEADER, *LOCALHOST, "\t".join([own.ip, *dns_names(own, namespace), own.hostname])]
    seen = {own.hostname}
    for peer in sorted(peers):
        if peer.uid == own.uid or peer.subdomain != own.subdomain or peer.hostname in seen:
            continue
        seen.add(peer.hostname)
        lines.append("\t".join([peer.ip, *dns_names(peer, namespace)]))
    return "\n".join(lines) + "\n"
