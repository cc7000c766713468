"""The leader election (trainingrun.operator.leader) against an in-memory Lease API with the API
server's
optimistic concurrency, and a clock of the test's.

Covers: a create of an existing Lease and a replace with a stale resourceVersion both lose; a
new holder counts a transition and a renewal does not; a candidate takes a Lease only once its
record has not changed for ``lease_duration`` by its own clock (a holder that renews keeps it),
and at once when the Lease has no holder; a leader stops after ``renew_deadline`` of failed
renewals, and at once when another holds the Lease; an unreachable API server, or a token that
cannot be read, is a failed round, not a crash; the timing refuses a renew deadline that lets a
leader outlive its Lease. The election with two real operator processes is
tests/integration/test_failover.py."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest
import urllib3

from trainingrun.operator import leader
from trainingrun.operator.kubeconn import HttpError, KubeConfigError, RestClient
from trainingrun.operator.leader import LEASE, LEASES, Election, LeaseLock, Timing


class Leases:
    """The Lease calls ``LeaseLock`` makes, in memory, with the API server's answers."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.down = False
        self.failing: Exception | None = None  # raised by every call when set
        self.calls: list[str] = []

    def call(self, method: str, template: str, body: Any = None, **where: str) -> dict[str, Any]:
        self.calls.append(method)
        if self.failing is not None:
            raise self.failing
        if self.down:
            raise urllib3.exceptions.NewConnectionError(None, "connection refused")  # type: ignore[arg-type]
        if method == "GET" and template == LEASE:
            key = (where["namespace"], where["name"])
            if key not in self.stored:
                raise HttpError(404, "Not Found", "leases not found")
            return copy.deepcopy(self.stored[key])
        assert body is not None
        key = (where["namespace"], body["metadata"]["name"])
        if method == "POST" and template == LEASES:
            if key in self.stored:
                raise HttpError(409, "Conflict", "already exists")
        elif method == "PUT" and template == LEASE:
            if body["metadata"].get("resourceVersion") != self.stored[key]["metadata"].get(
                "resourceVersion"
            ):
                raise HttpError(409, "Conflict", "the object has been modified")
        else:
            raise AssertionError(f"unexpected call {method} {template}")
        self.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.stored[key] = stored
        return copy.deepcopy(stored)

    def spec(self) -> dict[str, Any]:
        return dict(self.stored[("ns", "op")]["spec"])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def lock(leases: Leases, me: str) -> LeaseLock:
    return LeaseLock(cast(RestClient, leases), "op", "ns", me)


def election(leases: Leases, me: str, clock: Clock) -> Election:
    return Election(lock(leases, me), Timing(), monotonic=clock, sleep=clock.sleep)


def test_the_first_candidate_creates_the_lease_and_a_second_create_loses() -> None:
    leases = Leases()
    a, b = lock(leases, "a"), lock(leases, "b")

    assert a.read() is None
    assert a.create(10)
    assert not b.create(10)

    held = b.read()
    assert held is not None
    assert (held["spec"]["holderIdentity"], held["spec"]["leaseDurationSeconds"]) == ("a", 10)
    assert leases.spec()["leaseTransitions"] == 0


def test_a_write_after_someone_elses_loses() -> None:
    leases = Leases()
    a, b = lock(leases, "a"), lock(leases, "b")
    a.create(10)
    read_by_a, read_by_b = a.read(), b.read()
    assert read_by_a is not None and read_by_b is not None

    assert b.hold(read_by_b, 10)  # b read the newest: it takes the lease
    assert not a.hold(read_by_a, 10)  # a's read is stale: its renewal loses

    assert leases.spec()["holderIdentity"] == "b"


@pytest.mark.parametrize(
    ("writer", "transitions"), [("a", 0), ("b", 1)], ids=["renewal", "takeover"]
)
def test_a_takeover_counts_a_transition_and_a_renewal_does_not(
    writer: str, transitions: int
) -> None:
    leases = Leases()
    lock(leases, "a").create(10)
    first = leases.spec()
    w = lock(leases, writer)
    lease = w.read()
    assert lease is not None

    assert w.hold(lease, 10)

    spec = leases.spec()
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == (writer, transitions)
    assert spec["renewTime"] > first["renewTime"]
    if writer == "a":
        assert spec["acquireTime"] == first["acquireTime"]  # a renewal keeps it
    else:
        assert spec["acquireTime"] > first["acquireTime"]


def test_a_candidate_waits_while_the_holder_renews_and_takes_the_lease_once_it_stops() -> None:
    leases, clock = Leases(), Clock()
    a, b = election(leases, "a", clock), election(leases, "b", clock)
    assert a.round()  # a creates it

    for _ in range(10):  # 20 s: a renews every 2 s, b is refused every time
        clock.sleep(2)
        assert a.round()
        assert not b.round()
    # a stops renewing: b sees the same record for a lease duration first
    waited = 0
    while not b.round():
        clock.sleep(2)
        waited += 2
        assert waited <= 12
    assert waited >= 10
    assert leases.spec()["holderIdentity"] == "b"
    assert leases.spec()["leaseTransitions"] == 1


def test_a_lease_without_holder_is_taken_at_once() -> None:
    leases, clock = Leases(), Clock()
    lock(leases, "a").create(10)
    spec = leases.stored[("ns", "op")]["spec"]
    spec["holderIdentity"] = None  # released

    assert election(leases, "b", clock).round()
    assert leases.spec()["holderIdentity"] == "b"


def test_a_leader_that_cannot_renew_stops_after_its_renew_deadline() -> None:
    leases, clock = Leases(), Clock()
    a = election(leases, "a", clock)
    a.acquire()
    started = clock.now
    leases.down = True

    a.keep()

    assert clock.now - started == Timing().renew_deadline  # 3 failed rounds, 2 s apart
    assert clock.now - started + Timing().retry_period < Timing().lease_duration


def test_a_leader_that_finds_another_holder_stops_at_once() -> None:
    leases, clock = Leases(), Clock()
    a = election(leases, "a", clock)
    a.acquire()
    spec = leases.stored[("ns", "op")]["spec"]
    spec["holderIdentity"] = "b"  # another replica took it (a's clock ran slow)
    started = clock.now

    a.keep()

    assert clock.now - started == Timing().retry_period  # the first round found it


def test_an_unreachable_api_server_is_a_lost_round_not_a_crash() -> None:
    leases, clock = Leases(), Clock()
    a = election(leases, "a", clock)
    leases.down = True

    assert not a.round()
    assert not lock(leases, "a").create(10)
    leases.down = False
    assert a.round()


def test_a_leader_whose_token_cannot_be_read_stops_after_its_renew_deadline() -> None:
    leases, clock = Leases(), Clock()
    a = election(leases, "a", clock)
    a.acquire()
    started = clock.now
    leases.failing = KubeConfigError("cannot read the token file /var/run/...: gone")

    a.keep()  # the error is a lost round, not a dead election thread

    assert clock.now - started == Timing().renew_deadline


@pytest.mark.parametrize(
    ("lease", "renew", "retry", "ok"),
    [(10, 6, 2, True), (8, 6, 2, False), (10, 8, 2, False), (15, 10, 2, True)],
)
def test_a_leader_stops_before_its_lease_can_pass_on(
    lease: int, renew: int, retry: int, ok: bool
) -> None:
    if ok:
        Timing(lease, renew, retry)
    else:
        with pytest.raises(ValueError, match="shorter than lease_duration"):
            Timing(lease, renew, retry)


def test_each_process_has_an_identity_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a container the pid is 1 every time: a restarted leader container must not take its
    dead predecessor's name in the Lease."""
    monkeypatch.setenv("HOSTNAME", "trainingrun-operator-7d9f-abcde")
    monkeypatch.setattr(leader.os, "getpid", lambda: 1)

    first, again = leader.identity(), leader.identity()

    assert first != again
    assert first.startswith("trainingrun-operator-7d9f-abcde-")
