"""The operator's slots of calls in flight to tenants' endpoints: a few workers serve every
tenant, so no endpoint and no namespace may hold them all.

A call takes a slot of the address its endpoint resolves to (with the port, the scheme's default
when not given), so ``http://h``, ``http://h:80``, ``http://H.:80`` and two wildcard DNS names
of one server share one endpoint's slots; and a slot of its namespace, so a namespace naming
many endpoints still holds at most its share of the workers. Host names are looked up off the
calling thread, within ``timeout_seconds``, and remembered for ``ttl_seconds``: a call costs no
DNS lookup, and a name whose lookup does not answer is counted by its own normal form.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from urllib.parse import urlsplit

from trainingrun.storage.opener import StorageUnavailable

DEFAULT_PORTS = {"http": 80, "https": 443}

# host, port -> the addresses it resolves to
Resolve = Callable[[str, int], list[str]]


class EndpointBusy(StorageUnavailable):
    """Every slot of the run's endpoint, or of its namespace, is taken by calls still waiting
    for an answer."""


def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (the system's resolver)."""
    return [str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


def host_port(endpoint: str) -> tuple[str, int] | None:
    """The host (lowercase, without a trailing dot) and port (the scheme's default when not
    given) of an endpoint URL; None when it has no host or a port that is not a number."""
    url = urlsplit(endpoint.strip())
    host = (url.hostname or "").rstrip(".")
    try:
        port = url.port or DEFAULT_PORTS.get(url.scheme.lower(), 0)
    except ValueError:
        return None
    return (host, port) if host else None


def _address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


class Addresses:
    """Where host names point, as the slots count them: each looked up on a thread of its own,
    waited for ``timeout_seconds``, and remembered (answer or not) for ``ttl_seconds``; at most
    ``max_names`` remembered, and ``max_lookups`` under way (more are counted by the name)."""

    def __init__(
        self,
        resolve: Resolve = resolve,
        ttl_seconds: float = 30.0,
        timeout_seconds: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        max_names: int = 1024,
        max_lookups: int = 8,
    ) -> None:
        self._resolve = resolve
        self._ttl, self._timeout = ttl_seconds, timeout_seconds
        self._monotonic = monotonic
        self._max_names, self._max_lookups = max_names, max_lookups
        self._known: OrderedDict[tuple[str, int], tuple[float, Future[list[str]]]] = OrderedDict()
        self._lock = threading.Lock()

    def of(self, host: str, port: int) -> str:
        """``ip:port`` of the address ``host`` resolves to (the least, when it has several: the
        same for every order a DNS server gives them); ``host:port`` when it did not resolve
        in time."""
        try:
            return _address(str(ipaddress.ip_address(host)), port)
        except ValueError:
            pass
        lookup = self._lookup(host, port)
        try:
            found = lookup.result(timeout=self._timeout) if lookup is not None else []
        except Exception:  # not answered in time, or not at all: counted by the name
            found = []
        return _address(min(found), port) if found else f"{host}:{port}"

    def _lookup(self, host: str, port: int) -> Future[list[str]] | None:
        """The lookup of ``host`` made in the last ``ttl_seconds``, or a new one; None when too
        many are under way."""
        key, now = (host, port), self._monotonic()
        with self._lock:
            known = self._known.get(key)
            if known is not None and now - known[0] < self._ttl:
                self._known.move_to_end(key)
                return known[1]
            if sum(not f.done() for _, f in self._known.values()) >= self._max_lookups:
                return None
            lookup: Future[list[str]] = Future()
            self._known[key] = (now, lookup)
            self._known.move_to_end(key)
            while len(self._known) > self._max_names:
                self._known.popitem(last=False)
        # A daemon thread: a lookup the resolver never ends holds neither a worker nor exit.
        threading.Thread(target=self._run, args=(lookup, host, port), daemon=True).start()
        return lookup

    def _run(self, lookup: Future[list[str]], host: str, port: int) -> None:
        try:
            lookup.set_result(self._resolve(host, port))
        except Exception as e:  # any failure to resolve: counted by the name
            lookup.set_exception(e)


Key = tuple[str, str]  # ("endpoint", its address) or ("namespace", its name)


class EndpointSlots:
    """At most ``limit`` calls in flight to one endpoint, and ``per_namespace`` (None: no limit)
    from one namespace. A call that finds every slot taken waits for one, up to
    ``wait_seconds``, while the calls holding them answer (the oldest started under
    ``slow_seconds`` ago): a burst of starts on one shared endpoint (every tenant on one MinIO,
    a spot pool reclaimed at once) queues for a moment instead of failing. Once the oldest is
    older than that, a call past the slots fails at once (EndpointBusy): a worker never waits
    long on another tenant's slow endpoint."""

    def __init__(
        self,
        limit: int,
        wait_seconds: float = 2.0,
        slow_seconds: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        per_namespace: int | None = None,
    ) -> None:
        self.limit = limit
        self.per_namespace = per_namespace
        self.wait_seconds = wait_seconds
        self.slow_seconds = slow_seconds
        self._monotonic = monotonic
        self._started: dict[Key, list[float]] = {}  # when each call in flight began
        self._freed = threading.Condition()

    def _full(self, keys: list[Key]) -> Key | None:
        for key in keys:
            limit = self.limit if key[0] == "endpoint" else self.per_namespace
            if limit is not None and len(self._started.get(key, ())) >= limit:
                return key
        return None

    def _busy(self, key: Key, given_up_at: float) -> str | None:
        """Why a call may not wait for a slot of ``key`` any longer; None: it may."""
        now = self._monotonic()
        oldest = min(self._started[key])
        if now - oldest >= self.slow_seconds:
            return f"its oldest has waited {now - oldest:.1f} s"
        if now >= given_up_at:
            return f"no slot came free in {self.wait_seconds:g} s"
        return None

    def _refusal(self, key: Key, endpoint: str, why: str) -> EndpointBusy:
        calls = len(self._started[key])
        if key[0] == "endpoint":
            what = f"endpoint {endpoint} is busy or slow: {calls} calls to it are"
            check = "the endpoint's health and latency"
        else:
            what = (
                f"namespace {key[1]} has {calls} calls in flight to its endpoints, its share of "
                "the operator's workers; they are"
            )
            check = "the health and latency of every endpoint this namespace's runs name"
        return EndpointBusy(
            f"{what} still waiting for an answer ({why}); the call is tried again on a later "
            f"pass (if this lasts, check {check})"
        )

    @contextlib.contextmanager
    def hold(
        self, endpoint: str | None, namespace: str | None = None, address: str | None = None
    ) -> Iterator[None]:
        """A slot of ``endpoint`` (counted by its ``address`` when given) and of ``namespace``
        for the body of the ``with``; ``endpoint`` None: no limit. Raises EndpointBusy."""
        if endpoint is None:
            yield
            return
        keys: list[Key] = [("endpoint", address or endpoint)]
        if namespace is not None:
            keys.append(("namespace", namespace))
        given_up_at = self._monotonic() + self.wait_seconds
        with self._freed:
            while (full := self._full(keys)) is not None:
                why = self._busy(full, given_up_at)
                if why is not None:
                    raise self._refusal(full, endpoint, why)
                self._freed.wait(timeout=0.05)
            began = self._monotonic()
            for key in keys:
                self._started.setdefault(key, []).append(began)
        try:
            yield
        finally:
            with self._freed:
                for key in keys:
                    calls = self._started[key]
                    calls.remove(began)
                    if not calls:
                        del self._started[key]
                self._freed.notify_all()
