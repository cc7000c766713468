"""Leader election on a ``coordination.k8s.io`` Lease: two or more operator replicas, one acting.

The election is client-go's: a candidate takes the Lease when its record (holder, renew time)
has not changed for ``lease_duration`` by the candidate's own clock, so no two clocks are
compared; the holder renews every ``retry_period``. Every write is guarded by the API server (a
create by the name, a replace by the resourceVersion read), so two candidates never both win one
round.

A replica runs the operator only once it holds the Lease; until then it waits (its liveness
endpoint answers meanwhile). A leader exits at once (the kubelet restarts it as a candidate)
when it finds another holder in the Lease, or at its deadline: ``renew_deadline`` after the
START of its last round that renewed the Lease (the renewal was sent after that instant, so no
standby saw it, and began counting its ``lease_duration``, before it). The leader's sleeps and
calls end by the deadline: a Lease call is tried once (no client retries: the next round is the
retry) with a timeout of ``retry_period``, cut to the time left before the deadline. So the
leader has stopped ``renew_deadline`` (6 s) after its last renewal was sent, and a standby leads
``lease_duration`` (10 s) after it saw that renewal at the earliest: never do two replicas act at
once, as long as their clocks run at the same rate. The 4 s between them is the margin for a
call that overruns its timeout (urllib3's timeouts bound each socket operation) and the exit.
"""

from __future__ import annotations

import http.server
import logging
import os
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import urllib3

from trainingrun.contract import now_rfc3339_micro
from trainingrun.operator.kubeconn import Connection, HttpError, RestClient

log = logging.getLogger("trainingrun.operator.leader")

EXIT_LOST_LEADERSHIP = 75  # EX_TEMPFAIL: restarted by the kubelet as a candidate
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
LEASE = LEASES + "/{name}"


@dataclass(frozen=True)
class Timing:
    """Seconds. A standby leads within about ``lease_duration + retry_period`` of the leader's
    last renewal; the leader gives up ``renew_deadline`` after the start of the round that sent
    it, sooner. A Lease call gives up after ``retry_period`` (``call_timeout``)."""

    lease_duration: int = 10
    renew_deadline: int = 6
    retry_period: int = 2

    def __post_init__(self) -> None:
        if self.renew_deadline + self.call_timeout >= self.lease_duration:
            raise ValueError(
                "leader election: renew_deadline + retry_period must be shorter than "
                "lease_duration, or a leader could still act after another took the Lease"
            )

    @property
    def call_timeout(self) -> float:
        """One Lease call's timeout, and the margin a leader keeps for a call that overruns."""
        return float(self.retry_period)


MIN_CALL_SECONDS = 0.05  # less time than this before the deadline: no call is worth sending
NO_RETRIES = False  # urllib3: no retry, the error itself raised


def lease_client(conn: Connection, timing: Timing) -> RestClient:
    """The Lease calls' own client: no retries (urllib3 tries a call with no answer 4 times by
    default, each with the full timeout: a round would outlast the renew deadline), a call at
    most one ``call_timeout``."""
    timeout = urllib3.Timeout(total=timing.call_timeout)
    return RestClient(conn, pool_size=2, timeout=timeout, retries=NO_RETRIES)


class LeaseLock:
    """The three calls on one Lease: read, create, and replace of the Lease as last read. Each
    is sent once (no client retries), and gives up after ``timeout`` seconds."""

    def __init__(self, rest: RestClient, name: str, namespace: str, identity: str) -> None:
        self.rest, self.name, self.namespace, self.identity = rest, name, namespace, identity

    def read(self, timeout: float = Timing().call_timeout) -> dict[str, Any] | None:
        """The Lease, or None when there is none; raises when the API server does not answer."""
        try:
            return self.rest.call(
                "GET", LEASE, namespace=self.namespace, name=self.name, **_once(timeout)
            )
        except HttpError as e:
            if e.status == 404:
                return None
            raise

    def create(self, duration: int, timeout: float = Timing().call_timeout) -> bool:
        """False when another candidate created it first (409) or the call failed."""
        now = now_rfc3339_micro()  # a Lease's MicroTime
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": duration,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        return self._write("POST", LEASES, body, timeout)

    def hold(
        self, lease: dict[str, Any], duration: int, timeout: float = Timing().call_timeout
    ) -> bool:
        """Renews the Lease as read, or takes it from its holder (a transition); False when it
        changed since the read (409) or the call failed."""
        spec = dict(lease.get("spec") or {})
        now = now_rfc3339_micro()  # a Lease's MicroTime
        taken = spec.get("holderIdentity") != self.identity
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=duration, renewTime=now)
        if taken or not spec.get("acquireTime"):
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + int(taken)
        return self._write("PUT", LEASE, {**lease, "spec": spec}, timeout, name=self.name)

    def _write(
        self, method: str, path: str, body: dict[str, Any], timeout: float, **where: str
    ) -> bool:
        try:
            self.rest.call(method, path, body, namespace=self.namespace, **where, **_once(timeout))
        except Exception as e:  # 409 (another wrote first), no answer: a lost round
            log.debug("lease %s/%s not written: %s", self.namespace, self.name, e)
            return False
        return True


def _once(timeout: float) -> dict[str, Any]:
    """A Lease call's options: sent once, given up after ``timeout`` seconds."""
    return {"retries": NO_RETRIES, "timeout": urllib3.Timeout(total=timeout)}


class Election:
    """One candidate's view of the Lease, and its rounds."""

    def __init__(
        self,
        lock: LeaseLock,
        timing: Timing,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.lock, self.timing, self.monotonic, self.sleep = lock, timing, monotonic, sleep
        self._seen: tuple[Any, Any] | None = None  # the record (holder, renew time) last read
        self._seen_at = 0.0  # when it last changed, by this candidate's clock
        self.other_holder = False  # the last round found the Lease held by someone else
        # When this candidate must stop acting as the leader: renew_deadline after the start of
        # its last round that took or renewed the Lease.
        self.deadline = float("-inf")

    def _timeout(self, until: float | None) -> float | None:
        """A call's timeout: ``call_timeout``, cut to the time left before ``until``; None when
        too little is left to send one."""
        timeout = self.timing.call_timeout
        if until is not None:
            timeout = min(timeout, until - self.monotonic())
        return timeout if timeout >= MIN_CALL_SECONDS else None

    def round(self, until: float | None = None) -> bool:
        """One try to take or renew the Lease: whether this candidate holds it now. Its calls
        end by ``until`` (the leader's deadline), if given."""
        self.other_holder = False
        started = self.monotonic()
        timeout = self._timeout(until)
        if timeout is None:
            return False
        try:
            lease = self.lock.read(timeout)
        except Exception as e:  # no answer, an error status, a token unreadable: a lost round
            log.debug("lease %s/%s not read: %s", self.lock.namespace, self.lock.name, e)
            return False
        duration = self.timing.lease_duration
        if lease is not None:
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity")
            record = (holder, spec.get("renewTime"))
            now = self.monotonic()
            if record != self._seen:
                self._seen, self._seen_at = record, now
            if holder and holder != self.lock.identity:
                self.other_holder = True
                if now < self._seen_at + duration:
                    return False  # its holder renewed it within its duration
        timeout = self._timeout(until)
        if timeout is None:
            return False
        if lease is None:
            won = self.lock.create(duration, timeout)
        else:
            won = self.lock.hold(lease, duration, timeout)
        if won:
            self.deadline = started + self.timing.renew_deadline
        return won

    def acquire(self) -> None:
        """Returns once this candidate holds the Lease, with time left before its deadline."""
        while not (self.round() and self.monotonic() < self.deadline):
            self.sleep(self.timing.retry_period)

    def keep(self) -> None:
        """Renews every ``retry_period``; returns when the Lease is lost: at the deadline
        (``renew_deadline`` after the start of the last round that renewed it; no sleep and
        no call goes past it), or when another holds it."""
        while True:
            self.sleep(min(self.timing.retry_period, max(0.0, self.deadline - self.monotonic())))
            if self.monotonic() >= self.deadline:
                return
            self.round(until=self.deadline)
            if self.other_holder or self.monotonic() >= self.deadline:
                return


def identity() -> str:
    """This process's name in the Lease: its pod's name, its pid and a random suffix of its
    own. The pid alone is not enough: in a container it is 1 every time, and a leader's
    container restarted by the kubelet would take its dead predecessor's name and renew the
    Lease as if it had led all along."""
    host = os.environ.get("HOSTNAME") or "operator"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:10]}"


class _Alive(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a probe every few seconds is not news


@contextmanager
def answering(liveness: str | None) -> Iterator[None]:
    """Answers the liveness probe while this replica waits to lead; the port is free again
    when the operator (which serves the probe from then on) starts."""
    if not liveness:
        yield
        return
    url = urllib.parse.urlsplit(liveness)
    server = http.server.ThreadingHTTPServer((url.hostname or "", url.port or 80), _Alive)
    thread = threading.Thread(target=server.serve_forever, name="standby-liveness", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def lead(
    conn: Connection,
    name: str,
    namespace: str,
    timing: Timing = Timing(),
    me: str | None = None,
    liveness: str | None = None,
) -> None:
    """Returns once this replica holds the Lease; from then on a background thread renews it,
    and ends the process the moment the Lease is lost. ``liveness``: the operator's liveness
    endpoint, answered while waiting."""
    me = me or identity()
    election = Election(LeaseLock(lease_client(conn, timing), name, namespace, me), timing)
    leading = threading.Event()

    def run() -> None:
        try:
            election.acquire()
            leading.set()
            election.keep()
            log.error("lost the lease %s/%s: exiting so that no two replicas act", namespace, name)
        except BaseException:  # an election that stopped must not leave the operator acting
            log.exception("the election on %s/%s failed: exiting", namespace, name)
        finally:
            logging.shutdown()
            os._exit(EXIT_LOST_LEADERSHIP)

    log.info("%s: waiting to lead (lease %s/%s)", me, namespace, name)
    with answering(liveness):
        threading.Thread(target=run, name="leader-election", daemon=True).start()
        leading.wait()
    log.info("%s: leading (lease %s/%s)", me, namespace, name)
