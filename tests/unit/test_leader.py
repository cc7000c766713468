"""The Lease lock of the leader election (trainingrun.leader) against an in-memory Lease API with
the API server's optimistic concurrency: a create of an existing Lease and a replace with a
stale resourceVersion both lose; a new holder counts a transition and a renewal does not; an
unreachable API server is a failed round, not a crash. The election itself, with two real
operator processes, is tests/integration/test_failover.py."""

from __future__ import annotations

import copy
import json
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord

from trainingrun.leader import LeaseLock, Timing


class Leases:
    """``CoordinationV1Api``'s three Lease calls, in memory."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], Any] = {}
        self.version = 0
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise ConnectionRefusedError("connection refused")

    def read_namespaced_lease(self, name: str, namespace: str) -> Any:
        self._check()
        if (namespace, name) not in self.stored:
            raise ApiException(status=404, reason="Not Found")
        return copy.deepcopy(self.stored[(namespace, name)])

    def create_namespaced_lease(self, namespace: str, body: Any) -> Any:
        self._check()
        key = (namespace, body.metadata.name)
        if key in self.stored:
            raise ApiException(status=409, reason="AlreadyExists")
        self.version += 1
        body.metadata.resource_version = str(self.version)
        self.stored[key] = copy.deepcopy(body)
        return body

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any) -> Any:
        self._check()
        current = self.stored[(namespace, name)]
        if body.metadata.resource_version != current.metadata.resource_version:
            raise ApiException(status=409, reason="Conflict")
        self.version += 1
        body.metadata.resource_version = str(self.version)
        self.stored[(namespace, name)] = copy.deepcopy(body)
        return copy.deepcopy(body)


def record(holder: str) -> LeaderElectionRecord:
    return LeaderElectionRecord(holder, "10", "t", "t")


def lock(leases: Leases, me: str) -> LeaseLock:
    return LeaseLock(cast(client.CoordinationV1Api, leases), "op", "ns", me)


def test_the_first_candidate_creates_the_lease_and_a_second_create_loses() -> None:
    leases = Leases()
    a, b = lock(leases, "a"), lock(leases, "b")

    found, failed = a.get("op", "ns")
    assert not found and json.loads(failed.body)["code"] == 404
    assert a.create("op", "ns", record("a"))
    assert not b.create("op", "ns", record("b"))

    found, held = b.get("op", "ns")
    assert found and held.holder_identity == "a" and held.lease_duration == "10"
    spec = leases.stored[("ns", "op")].spec
    assert (spec.holder_identity, spec.lease_transitions) == ("a", 0)


def test_a_write_after_someone_elses_loses() -> None:
    leases = Leases()
    a, b = lock(leases, "a"), lock(leases, "b")
    a.create("op", "ns", record("a"))
    a.get("op", "ns")
    b.get("op", "ns")

    assert b.update("op", "ns", record("b"))  # b read the newest: it takes the lease
    assert not a.update("op", "ns", record("a"))  # a's read is stale: its renewal loses

    assert leases.stored[("ns", "op")].spec.holder_identity == "b"


@pytest.mark.parametrize(
    ("writer", "transitions"), [("a", 0), ("b", 1)], ids=["renewal", "takeover"]
)
def test_a_takeover_counts_a_transition_and_a_renewal_does_not(
    writer: str, transitions: int
) -> None:
    leases = Leases()
    a = lock(leases, "a")
    a.create("op", "ns", record("a"))
    first = leases.stored[("ns", "op")].spec
    w = lock(leases, writer)
    w.get("op", "ns")

    assert w.update("op", "ns", record(writer))

    spec = leases.stored[("ns", "op")].spec
    assert (spec.holder_identity, spec.lease_transitions) == (writer, transitions)
    assert spec.renew_time > first.renew_time
    if writer == "a":
        assert spec.acquire_time == first.acquire_time  # a renewal keeps it
    else:
        assert spec.acquire_time > first.acquire_time


def test_an_unreachable_api_server_is_a_lost_round_not_a_crash() -> None:
    leases = Leases()
    a = lock(leases, "a")
    a.create("op", "ns", record("a"))
    leases.down = True

    found, failed = a.get("op", "ns")

    assert not found and json.loads(failed.body)["code"] == 0
    assert not a.update("op", "ns", record("a"))
    assert not a.create("op", "ns", record("a"))


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
