"""A network of its own for each pod that sets ``spec.subdomain`` (the pods of a gang), as on a
real node: two pods can both bind port 29500, and each finds the others by the names a cluster's
DNS gives them, whichever runner node of the environment they run on.

- The pod's network namespace ``<env>-p<n>`` (``ip netns``) has ``lo`` up and ``eth0`` at
  10.244.0.0/16 address n, one end of a veth pair whose other end ``vp<n>`` is a port of bridge
  ``br0`` in the environment's hub namespace ``<env>-hub``: one flat segment for every runner of
  the environment, so pods of two runner nodes talk directly, with no routing.
- Address n is claimed with a file ``<n>.json`` in ``podnet/`` of the environment's state folder,
  under a lock every runner takes, handed out round-robin (a freed address is not reused at
  once). A claim names its runner process, so a runner starting up reclaims what runners that
  died left; ``localenv down`` removes every ``<env>-*`` namespace as well.
- Each container gets the pod's own ``/etc/hosts`` (``tests.podrunner.hosts``), bind-mounted and
  rewritten in place whenever a peer of its subdomain comes or goes (``tests.podrunner.peers``).
- The machine's loopback services named in the containers' env are forwarded into the pod
  (``tests.podrunner.forward``).

Nothing is created or changed in the machine's own network namespace; a pod's namespace has no
route but 10.244.0.0/16 and reaches the machine only through the forwarded loopback ports.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.localenv import IP, NETNS_DIR, netns_prefix, state_dir
from tests.podrunner.forward import Forwarder, loopback_ports
from tests.podrunner.hosts import Peer, hosts_file
from tests.podrunner.peers import PeerDirectory
from tests.podrunner.process import Identity, Mount
from tests.podrunner.spec import ConfigError, pod_hostname

log = logging.getLogger("podrunner.net")

SUBNET = ipaddress.IPv4Network("10.244.0.0/16")
FIRST_INDEX = 2  # .0.0 is the network, .0.1 is left for a gateway no one needs
LAST_INDEX = SUBNET.num_addresses - 2  # the last is the broadcast address
BRIDGE = "br0"
NEXT_FILE = "next"  # the index the round-robin search starts at


class NetworkError(ConfigError):
    """The pod's network could not be set up; the pod waits in ContainerCreating (retried)."""


def wants_network(pod: dict[str, Any]) -> bool:
    """A pod with a subdomain is one of a gang: it gets a network of its own."""
    return bool((pod.get("spec") or {}).get("subdomain"))


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (with the pid, it names one process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_alive(claim: dict[str, Any]) -> bool:
    pid = int(claim.get("pid", 0))
    return pid > 0 and _start_time(pid) == claim.get("start")


def _write_in_place(path: Path, text: str) -> None:
    """Rewrites ``path`` keeping its inode, as a bind mount of it needs (a rename would leave
    the containers with the old file). A reader may glimpse a half-new file for a moment."""
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


class Networks:
    """The pod networks of one runner; claims are shared with every runner of the
    environment."""

    def __init__(self, env_name: str, peers: PeerDirectory) -> None:
        self.prefix = netns_prefix(env_name)
        self.hub = f"{self.prefix}hub"
        self.dir = state_dir(env_name) / "podnet"
        self.peers = peers

    def netns(self, index: int) -> str:
        return f"{self.prefix}p{index}"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with (self.dir / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            yield

    def _claims(self) -> dict[int, dict[str, Any]]:
        claims = {}
        for path in self.dir.glob("*.json"):
            with contextlib.suppress(ValueError, OSError):
                claims[int(path.stem)] = json.loads(path.read_text())
        return claims

    def reclaim(self) -> list[str]:
        """Removes what runners that are gone left: their claims, namespaces and veths (and
        any namespace of the environment's no claim names). Returns the namespaces removed."""
        removed = []
        with self._locked():
            claims = self._claims()
            live = {self.netns(i) for i, claim in claims.items() if _owner_alive(claim)}
            for path in sorted(NETNS_DIR.glob(f"{self.prefix}p*")):
                if path.name in live:
                    continue
                if _ip("netns", "delete", path.name, check=False).returncode == 0:
                    removed.append(path.name)
            for index, claim in claims.items():
                if not _owner_alive(claim):
                    _ip("-n", self.hub, "link", "delete", f"vp{index}", check=False)
                    (self.dir / f"{index}.json").unlink(missing_ok=True)
        if removed:
            log.info("reclaimed the network namespaces of runners gone: %s", removed)
        return removed

    def _ensure_hub(self) -> None:
        if not (NETNS_DIR / self.hub).exists():
            _ip("netns", "add", self.hub)
        if _ip("-n", self.hub, "link", "show", BRIDGE, check=False).returncode != 0:
            _ip("-n", self.hub, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", self.hub, "link", "set", BRIDGE, "up")

    def _claim(self, pod: str) -> int:
        """The next free address index after the last one handed out."""
        next_file = self.dir / NEXT_FILE
        try:
            start = int(next_file.read_text())
        except (FileNotFoundError, ValueError):
            start = FIRST_INDEX
        if not FIRST_INDEX <= start <= LAST_INDEX:
            start = FIRST_INDEX
        span = LAST_INDEX - FIRST_INDEX + 1
        claim = {"pid": os.getpid(), "start": _start_time(os.getpid()), "pod": pod}
        for step in range(span):
            index = FIRST_INDEX + (start - FIRST_INDEX + step) % span
            try:
                fd = os.open(self.dir / f"{index}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(claim, f)
            next_file.write_text(str(index + 1))
            return index
        raise NetworkError(f"no free address left in {SUBNET}")

    def release(self, index: int) -> None:
        (self.dir / f"{index}.json").unlink(missing_ok=True)

    def attach(self, pod: dict[str, Any], hosts_path: Path) -> PodNet:
        """Sets up the pod's network (namespace, veth, address, hosts file, peer updates)."""
        meta = pod["metadata"]
        with self._locked():
            self._ensure_hub()
            index = self._claim(f"{meta['namespace']}/{meta['name']}")
        net = PodNet(self, index, pod, hosts_path)
        try:
            net.open()
        except (OSError, subprocess.SubprocessError, NetworkError) as e:
            net.close()
            raise NetworkError(f"pod network not set up: {e}") from e
        return net


class PodNet:
    """One pod's network: what its containers enter, see and reach."""

    def __init__(self, networks: Networks, index: int, pod: dict[str, Any], hosts: Path) -> None:
        meta = pod["metadata"]
        self.networks, self.index = networks, index
        self.netns, self.veth = networks.netns(index), f"vp{index}"
        self.ip = str(SUBNET[index])
        self.namespace = str(meta["namespace"])
        self.pod = f"{self.namespace}/{meta['name']}"
        self.own = Peer(pod_hostname(pod), str(pod["spec"]["subdomain"]), self.ip, meta["uid"])
        self.hosts_path = hosts
        self.identity = Identity(netns=str(NETNS_DIR / self.netns), hostname=self.own.hostname)
        self.forwarder = Forwarder(self.identity.netns, self.pod)
        self._unsubscribe: Callable[[], None] | None = None
        self._written = ""
        self._closed = False
        self._lock = threading.Lock()

    def open(self) -> None:
        hub, ns = self.networks.hub, self.netns
        if (NETNS_DIR / ns).exists():
            _ip("netns", "delete", ns)  # left by a runner that died: its claim was free
        _ip("-n", hub, "link", "delete", self.veth, check=False)
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        peer = ["peer", "name", self.veth, "netns", hub]  # born in the hub: never in the root ns
        _ip("-n", ns, "link", "add", "eth0", "type", "veth", *peer)
        _ip("-n", hub, "link", "set", self.veth, "master", BRIDGE, "up")
        _ip("-n", ns, "addr", "add", f"{self.ip}/{SUBNET.prefixlen}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        self._write_hosts([])
        self._unsubscribe = self.networks.peers.subscribe(self.namespace, self._write_hosts)
        log.info("pod %s: network %s, %s as %s", self.pod, ns, self.ip, self.own.hostname)

    def hosts_mount(self) -> Mount:
        return Mount(source=self.hosts_path, target="/etc/hosts", is_file=True)

    def forward(self, env: dict[str, str]) -> None:
        """Forwards the loopback ports of the URLs in a container's env (before it starts)."""
        self.forwarder.ensure(loopback_ports(env.values()))

    def _write_hosts(self, peers: list[Peer]) -> None:
        text = hosts_file(self.namespace, self.own, peers)
        with self._lock:
            if self._closed or text == self._written:
                return
            _write_in_place(self.hosts_path, text)
            self._written = text

    def close(self) -> None:
        """Removes the namespace, the veth pair and the forwarders, and frees the address."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._unsubscribe:
            self._unsubscribe()
        self.forwarder.close()
        _ip("-n", self.networks.hub, "link", "delete", self.veth, check=False)
        _ip("netns", "delete", self.netns, check=False)
        self.networks.release(self.index)
        log.info("pod %s: network %s removed", self.pod, self.netns)
