"""The machine's loopback services, reachable from inside a pod's network namespace: the agents
talk to SeaweedFS at ``http://127.0.0.1:<port>``, which inside the pod would be the pod's own
loopback. For each such port the runner listens on the pod's 127.0.0.1 (and ::1) and relays every
connection to the same port on the machine's loopback, streaming both ways through a pipe with
``splice(2)`` (a checkpoint of gigabytes is never held whole, nor copied through Python) and
passing each side's end of stream on as a half close.

The listening sockets are made on a short-lived thread that first enters the pod's network
namespace with ``setns(2)`` (per thread; Python 3.11 has no ``os.setns``); a socket stays in the
namespace it was made in, so accepting and relaying run on ordinary threads, whose outgoing
connections are made in the machine's namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

log = logging.getLogger("podrunner.forward")

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
CHUNK = 1024 * 1024  # bytes per splice(2), and the relay pipe's size
CONNECT_TIMEOUT_S = 5
_LOOPBACK_URL = re.compile(r"\bhttps?://(?:127\.0\.0\.1|localhost|\[::1\]):(\d{1,5})\b")
_libc = ctypes.CDLL(None, use_errno=True)


def loopback_ports(values: Iterable[str]) -> set[int]:
    """The ports of every loopback URL (``http://127.0.0.1:P``, ``http://localhost:P``,
    ``http://[::1]:P``, or https) in ``values``."""
    ports: set[int] = set()
    for value in values:
        ports.update(int(p) for p in _LOOPBACK_URL.findall(value) if 0 < int(p) < 65536)
    return ports


def in_netns(netns_path: str, make: Callable[[], T]) -> T:
    """``make()`` run on a fresh thread inside the network namespace at ``netns_path``; the
    thread ends with it, so no other code ever runs there."""
    result: list[T] = []
    failure: list[BaseException] = []

    def enter_and_make() -> None:
        try:
            fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {netns_path}: {os.strerror(err)}")
            finally:
                os.close(fd)
            result.append(make())
        except BaseException as e:
            failure.append(e)

    thread = threading.Thread(target=enter_and_make, name="setns", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def _listen(port: int) -> list[socket.socket]:
    """Listening sockets on 127.0.0.1:port and, where the namespace has IPv6, [::1]:port."""
    sockets: list[socket.socket] = []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((host, port))
            s.listen(128)
        except OSError as e:
            s.close()
            if family == socket.AF_INET or e.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                for other in sockets:
                    other.close()
                raise
            continue
        sockets.append(s)
    return sockets


def _connect_out(port: int, family: int) -> socket.socket:
    """A connection to the machine's loopback at ``port``, the listener's family first."""
    hosts = ["127.0.0.1", "::1"] if family == socket.AF_INET else ["::1", "127.0.0.1"]
    error: OSError | None = None
    for host in hosts:
        try:
            out = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        except OSError as e:
            error = e
            continue
        out.settimeout(None)
        return out
    raise error or OSError(f"cannot connect to loopback port {port}")


class Forwarder:
    """The relays of one pod: ``ensure`` adds ports, ``close`` ends them all."""

    def __init__(self, netns_path: str, pod: str) -> None:
        self.netns_path, self.pod = netns_path, pod
        self.ports: set[int] = set()
        self._listeners: list[socket.socket] = []
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False

    def ensure(self, ports: Iterable[int]) -> None:
        """Listens on each new port inside the pod (before its container starts, so the
        first request finds it); a port that cannot be bound is logged and skipped."""
        for port in sorted(set(ports) - self.ports):
            try:
                sockets = in_netns(self.netns_path, functools.partial(_listen, port))
            except OSError as e:
                log.warning("pod %s: loopback port %d not forwarded: %s", self.pod, port, e)
                continue
            with self._lock:
                self.ports.add(port)
                self._listeners.extend(sockets)
            for s in sockets:
                accept = threading.Thread(
                    target=self._accept, args=(s, port), name=f"forward {self.pod}:{port}"
                )
                accept.daemon = True
                accept.start()
            log.info("pod %s: loopback port %d forwarded to the machine's", self.pod, port)

    def close(self) -> None:
        """Stops listening and cuts every open relay (the pod's processes are gone)."""
        with self._lock:
            self._closed = True
            sockets = self._listeners + list(self._open)
            self._listeners, self._open = [], set()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept or recv
            s.close()

    def _accept(self, listener: socket.socket, port: int) -> None:
        while True:
            try:
                inner, _ = listener.accept()
            except OSError:
                return  # closed
            threading.Thread(
                target=self._relay, args=(inner, port, listener.family), daemon=True
            ).start()

    def _track(self, *sockets: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._open.update(sockets)
            return True

    def _relay(self, inner: socket.socket, port: int, family: int) -> None:
        try:
            outer = _connect_out(port, family)
        except OSError as e:
            log.warning("pod %s: loopback port %d unreachable: %s", self.pod, port, e)
            inner.close()
            return
        if not self._track(inner, outer):
            inner.close()
            outer.close()
            return
        back = threading.Thread(target=pump, args=(outer, inner), daemon=True)
        back.start()
        pump(inner, outer)
        back.join()
        with self._lock:
            self._open.difference_update((inner, outer))
        inner.close()
        outer.close()


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copies ``src`` to ``dst`` until ``src`` ends, then half-closes ``dst``; on an error both
    sockets are shut, which ends the other direction too. The bytes go through a pipe with
    ``splice(2)``, never through Python: a pod's restore reads gigabytes through here, and
    copying them in Python cost as much CPU as the restore itself."""
    pipe_out, pipe_in = os.pipe()
    try:
        with contextlib.suppress(OSError):  # a larger pipe: fewer calls per MiB
            fcntl.fcntl(pipe_in, fcntl.F_SETPIPE_SZ, CHUNK)
        while moved := os.splice(src.fileno(), pipe_in, CHUNK):
            while moved:
                moved -= os.splice(pipe_out, dst.fileno(), moved)
    except OSError:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        return
    finally:
        os.close(pipe_out)
        os.close(pipe_in)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
