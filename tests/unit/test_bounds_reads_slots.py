"""Who shares the operator's slots of calls in flight: one endpoint however it is spelled, and
one namespace whatever endpoints it names.

Covers:

- the slots of an endpoint are counted by the address its host resolves to and its port (the
  scheme's default when not given): ``http://h``, ``http://h:80`` and ``http://H.:80`` share
  one, and so do two host names that resolve to one address (wildcard DNS);
- one namespace holds at most ``max_per_namespace`` calls in flight to custom endpoints,
  whatever endpoints it names: one more fails at once with EndpointBusy naming the namespace,
  while another namespace is served;
- a host name is resolved once per ``ttl_seconds``, not at every call; a lookup that does not
  answer within ``timeout_seconds`` is given up and the calls are counted by the host name;
- an IP address is not looked up.
"""

from __future__ import annotations

import threading
import time
from typing import cast

import pytest

from tests.unit.builders import make_run
from tests.unit.fakes import FakeKube
from trainingrun.api import StorageSpec
from trainingrun.decide.naming import RunRef
from trainingrun.operator.buckets import EndpointBusy, RunStores
from trainingrun.operator.slots import Addresses
from trainingrun.storage.opener import Credentials, Store


class Names:
    """A resolver over a table of host -> addresses; ``asked`` records each lookup."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.asked: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in self.table:
            raise OSError(f"{host}: not known")
        return self.table[host]


class Hanging:
    """Stands in for open_store: a call waits until released (or 5 s), so a test holds a slot
    with it; once released, calls answer at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.waiting = threading.Semaphore(0)

    def open(self, storage: StorageSpec, credentials: Credentials | None) -> Store:
        return cast(Store, _Store(self))


class _Store:
    def __init__(self, hanging: Hanging) -> None:
        self.hanging = hanging

    def get_with_etag(self, key: str) -> tuple[bytes, str] | None:
        if not self.hanging.release.is_set():
            self.hanging.waiting.release()
            self.hanging.release.wait(timeout=5)
        return None


class Ticking:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _ref(name: str, endpoint: str, namespace: str = "team-a") -> RunRef:
    ref = make_run(name).with_storage(endpoint=endpoint).ref()
    return RunRef(name=ref.name, namespace=namespace, uid=ref.uid, spec=ref.spec)


def _holding(stores: RunStores, hanging: Hanging, refs: list[RunRef]) -> list[threading.Thread]:
    """Threads reading the manifests of ``refs``, each holding a slot until released."""
    threads = [threading.Thread(target=stores.read_manifest, args=(ref,)) for ref in refs]
    for thread in threads:
        thread.start()
    for _ in threads:
        assert hanging.waiting.acquire(timeout=5)
    return threads


def _release(hanging: Hanging, threads: list[threading.Thread]) -> None:
    hanging.release.set()
    for thread in threads:
        thread.join(timeout=5)


@pytest.mark.parametrize(
    ("first", "second", "names"),
    [
        pytest.param("http://h", "http://h:80", {"h": ["10.0.0.7"]}, id="default-port"),
        pytest.param("http://h", "http://H.:80", {"h": ["10.0.0.7"]}, id="case-dot-port"),
        pytest.param("https://s3.h:443/", "https://S3.H", {"s3.h": ["10.0.0.8"]}, id="https"),
        pytest.param(
            "http://a.x.nip.io:9000",
            "http://b.x.nip.io:9000",
            {"a.x.nip.io": ["10.0.0.9"], "b.x.nip.io": ["10.0.0.9"]},
            id="two-names-one-address",
        ),
        pytest.param("http://h", "http://h.", {}, id="unresolved-names-by-their-normal-form"),
    ],
)
def test_spellings_of_one_endpoint_share_its_slots(
    first: str, second: str, names: dict[str, list[str]]
) -> None:
    hanging, clock = Hanging(), Ticking()
    stores = RunStores(
        FakeKube(), 30.0, hanging.open, max_in_flight=1, monotonic=clock, resolve=Names(names)
    )
    threads = _holding(stores, hanging, [_ref("r1", first)])
    clock.now += stores.slots.slow_seconds  # the endpoint is slow: no waiting for a slot

    try:
        with pytest.raises(EndpointBusy, match="is busy or slow: 1 calls"):
            stores.read_manifest(_ref("r2", second, "team-b"))
    finally:
        _release(hanging, threads)


def test_different_addresses_have_slots_of_their_own() -> None:
    hanging, clock = Hanging(), Ticking()
    names = Names({"a.example": ["10.0.0.1"], "b.example": ["10.0.0.2"]})
    stores = RunStores(
        FakeKube(), 30.0, hanging.open, max_in_flight=1, monotonic=clock, resolve=names
    )
    threads = _holding(stores, hanging, [_ref("r1", "http://a.example")])
    clock.now += stores.slots.slow_seconds
    hanging.release.set()  # calls from here on answer at once

    try:
        assert stores.read_manifest(_ref("r2", "http://b.example", "team-b")) is None
    finally:
        _release(hanging, threads)


def test_one_namespace_holds_no_more_than_its_share() -> None:
    hanging, clock = Hanging(), Ticking()
    table = {f"e{i}.example": [f"10.0.1.{i}"] for i in range(6)}
    stores = RunStores(
        FakeKube(),
        30.0,
        hanging.open,
        max_in_flight=4,
        max_per_namespace=2,
        monotonic=clock,
        resolve=Names(table),
    )
    mine = [_ref(f"r{i}", f"http://e{i}.example") for i in range(2)]
    threads = _holding(stores, hanging, mine)
    clock.now += stores.slots.slow_seconds

    try:
        with pytest.raises(EndpointBusy, match="namespace team-a has 2 calls in flight") as e:
            stores.read_manifest(_ref("r3", "http://e3.example"))  # another endpoint still
        hanging.release.set()
        assert stores.read_manifest(_ref("r4", "http://e4.example", "team-b")) is None
    finally:
        _release(hanging, threads)
    assert "its share of the operator's workers" in str(e.value)
    assert stores.read_manifest(_ref("r3", "http://e3.example")) is None  # given back


def test_a_name_is_resolved_once_per_ttl() -> None:
    clock = Ticking()
    names = Names({"h.example": ["10.0.0.3"]})
    addresses = Addresses(names, ttl_seconds=30.0, monotonic=clock)

    first = [addresses.of("h.example", 80) for _ in range(100)]
    clock.now += 30.0
    again = addresses.of("h.example", 80)

    assert set(first) == {again} == {"10.0.0.3:80"}
    assert names.asked == ["h.example", "h.example"]


def test_a_lookup_that_does_not_answer_is_given_up() -> None:
    answer = threading.Event()

    def hanging(host: str, port: int) -> list[str]:
        answer.wait(timeout=10)
        return ["10.0.0.4"]

    addresses = Addresses(hanging, timeout_seconds=0.2)
    started = time.monotonic()
    try:
        got = addresses.of("slow-dns.example", 9000)
        took = time.monotonic() - started
        again = addresses.of("slow-dns.example", 9000)  # the same lookup, not another
    finally:
        answer.set()

    assert got == again == "slow-dns.example:9000"
    assert took < 2.0


def test_an_address_is_not_looked_up() -> None:
    names = Names({})
    addresses = Addresses(names)

    assert addresses.of("10.1.2.3", 9000) == "10.1.2.3:9000"
    assert addresses.of("::1", 9000) == "[::1]:9000"
    assert names.asked == []
