"""The operator's limits on what a tenant's bucket can cost it: memory, time and workers.

Covers:

- Store.get / get_with_etag read no more than ``max_get_bytes``: an object whose Content-Length
  is over the cap is refused unread (TooLarge, the body closed), one without a Content-Length
  or with a false one is read to one byte past the cap and refused; one within the cap is read
  whole; the same against moto's S3, and read_run_manifest turns TooLarge into
  ManifestTooLarge naming the object, the cap and the fix; the store's cap is no smaller than
  either manifest's;
- choose_checkpoint() passes over a checkpoint whose MANIFEST.json lists too many files, with
  the reason, and takes the older one;
- RunStores keeps the clients used last, at most ``max_stores`` (128 by default);
- at most ``max_in_flight`` (4 by default) calls go to one custom endpoint at a time: one more
  fails at once with EndpointBusy (a StorageUnavailable) naming the endpoint, while another
  endpoint is served; the slot is free again once a call returns; endpoints are told apart by
  scheme, host and port (AWS S3 by region), without a user or password; AWS S3 itself, shared
  by every tenant on it, is not limited;
- the operator's clients have a short budget (2 attempts, 5 s to connect, 10 s to read), the
  sync sidecar's, the restore's and the user commands' a patient one (8 retries, 60 s);
- against a real blackhole on 127.0.0.1 (a socket that accepts and never answers), an
  operator-side read gives up within its budget with StorageUnavailable, after exactly its
  attempts (it takes about 20 s).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from tests.unit.builders import NAMESPACE, make_run
from tests.unit.fakes import FakeBucket, FakeKube, moto_s3
from trainingrun import contract
from trainingrun.agent import restore
from trainingrun.api import StorageSpec
from trainingrun.checkpoint.lookup import choose_checkpoint, read_run_manifest
from trainingrun.checkpoint.manifest import (
    CHECKPOINT_MANIFEST,
    CHECKPOINT_MANIFEST_MAX_BYTES,
    MAX_FILES,
    RUN_MANIFEST,
    RUN_MANIFEST_MAX_BYTES,
    ManifestTooLarge,
    checkpoint_prefix,
)
from trainingrun.operator.buckets import (
    EndpointBusy,
    EndpointSlots,
    RunStores,
    endpoint_of,
    limited,
)
from trainingrun.storage.opener import (
    MAX_GET_BYTES,
    OPERATOR_BUDGET,
    PATIENT_BUDGET,
    Credentials,
    Location,
    S3Store,
    StorageUnavailable,
    Store,
    TooLarge,
    open_store,
)

RUN = Location("bkt", "runs/ml/r1")
SECRET = dict(zip(contract.CREDENTIAL_KEYS, ("AKIA", "s3cr3t"), strict=True))


@pytest.fixture
def no_aws_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS setting of the machine (a profile's retries, an endpoint) in the way."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_RETRY_MODE", "AWS_MAX_ATTEMPTS"):
        monkeypatch.delenv(name, raising=False)


# -- bounded reads ------------------------------------------------------------------------


class Body:
    """A GET's body that records how much was asked of it."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.asked: list[int | None] = []
        self.closed = False

    def read(self, amt: int | None = None) -> bytes:
        self.asked.append(amt)
        return self.data if amt is None else self.data[:amt]

    def close(self) -> None:
        self.closed = True


class OneObject:
    """get_object answering one object; ``told``: the Content-Length the endpoint sends (None:
    none, as with chunked encoding)."""

    def __init__(self, data: bytes, told: int | None) -> None:
        self.body = Body(data)
        self.told = told

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:  # boto3's argument names
        length = {} if self.told is None else {"ContentLength": self.told}
        return {"Body": self.body, "ETag": '"e1"', **length}


@pytest.mark.parametrize(
    ("data", "told", "asked", "error"),
    [
        pytest.param(b"x" * 16, 16, [17], None, id="at-the-cap-read-whole"),
        pytest.param(b"", 10**9, [], "is 1000000000 bytes, over the 16", id="told-too-large"),
        pytest.param(b"x" * 100, None, [17], "is larger, over the 16", id="no-length-too-large"),
        pytest.param(b"x" * 100, 10, [17], "is larger, over the 16", id="length-lies"),
    ],
)
def test_get_reads_no_more_than_its_cap(
    data: bytes, told: int | None, asked: list[int], error: str | None
) -> None:
    client = OneObject(data, told)
    store = S3Store(client, "b", max_get_bytes=16)

    if error is None:
        assert store.get("k") == data
        assert store.get_with_etag("k") == (data, '"e1"')
    else:
        with pytest.raises(TooLarge, match=f"s3://b/k {error} bytes this read takes"):
            store.get("k")
        assert client.body.closed  # the rest is not drained
    assert client.body.asked == asked * (1 if error else 2)


def test_a_run_manifest_over_the_store_cap_is_refused_unread() -> None:
    client = OneObject(b"", MAX_GET_BYTES + 1)

    with pytest.raises(ManifestTooLarge) as e:
        read_run_manifest(S3Store(client, RUN.bucket), RUN)

    assert str(e.value).startswith(
        f"s3://bkt/runs/ml/r1/manifest.json is {MAX_GET_BYTES + 1} bytes, over the cap of "
        f"{RUN_MANIFEST_MAX_BYTES} bytes: "
    )
    assert "put back a good copy" in str(e.value)
    assert client.body.asked == []


def test_moto_object_over_the_cap_is_too_large() -> None:
    key = RUN.key(RUN_MANIFEST)
    with moto_s3(RUN.bucket) as client:
        store = S3Store(client, RUN.bucket)
        client.put_object(Bucket=RUN.bucket, Key=key, Body=b" " * (MAX_GET_BYTES + 1))
        with pytest.raises(TooLarge, match=f"is {MAX_GET_BYTES + 1} bytes"):
            store.get(key)
        with pytest.raises(ManifestTooLarge, match=f"/{key} is {MAX_GET_BYTES + 1} bytes"):
            read_run_manifest(store, RUN)
        client.put_object(Bucket=RUN.bucket, Key=key, Body=b'{"version": 2}')
        manifest = read_run_manifest(store, RUN)
    assert manifest is not None
    assert manifest.entries == []


def test_the_store_reads_every_manifest_a_parser_accepts() -> None:
    assert max(RUN_MANIFEST_MAX_BYTES, CHECKPOINT_MANIFEST_MAX_BYTES) <= MAX_GET_BYTES


def test_a_checkpoint_of_too_many_files_is_passed_over() -> None:
    bucket = FakeBucket()
    bucket.commit(RUN, 100)
    bucket.commit(RUN, 200, files={f"shard-{i}": b"" for i in range(MAX_FILES + 1)})

    choice = choose_checkpoint(cast(Store, bucket), RUN, set())

    assert choice.entry is not None
    assert choice.entry.step == 100
    [(step, why)] = choice.rejected
    assert step == 200
    assert f"{checkpoint_prefix(200)}{CHECKPOINT_MANIFEST} lists 10001 files" in why


# -- the client cache ---------------------------------------------------------------------


def _storage(bucket: str, endpoint: str | None = None) -> StorageSpec:
    run = make_run().with_storage(uri=f"s3://{bucket}/runs", endpoint=endpoint)
    return run.spec().checkpoint.storage


def test_the_clients_kept_are_the_ones_used_last() -> None:
    bucket = FakeBucket()
    stores = RunStores(FakeKube(), 30.0, bucket.open)  # 128 kept
    for i in range(200):
        stores.store_for(NAMESPACE, _storage(f"bucket-{i:03d}"))
    for i in (199, 72, 150):  # among the newest 128
        stores.store_for(NAMESPACE, _storage(f"bucket-{i:03d}"))
    assert len(bucket.opened) == 200

    stores.store_for(NAMESPACE, _storage("bucket-071"))  # dropped: made again

    assert len(bucket.opened) == 201


def test_a_client_used_again_is_kept_over_an_older_one() -> None:
    bucket = FakeBucket()
    stores = RunStores(FakeKube(), 30.0, bucket.open, max_stores=2)
    for name in ("bk1", "bk2", "bk1", "bk3"):  # bk2 is the least recently used when b3 comes
        stores.store_for(NAMESPACE, _storage(name))
    stores.store_for(NAMESPACE, _storage("bk1"))
    stores.store_for(NAMESPACE, _storage("bk3"))
    assert len(bucket.opened) == 3

    stores.store_for(NAMESPACE, _storage("bk2"))

    assert len(bucket.opened) == 4


# -- calls in flight per endpoint -----------------------------------------------------------

SLOW, FAST = "http://slow.example:9000", "http://fast.example:9000"


class Endpoints:
    """Stands in for open_store: a store of the SLOW endpoint does not answer until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.waiting = threading.Semaphore(0)

    def open(self, storage: StorageSpec, credentials: Credentials | None) -> Store:
        return cast(Store, _Store(self, storage.endpoint == SLOW))


class _Store:
    def __init__(self, endpoints: Endpoints, slow: bool) -> None:
        self.endpoints, self.slow = endpoints, slow

    def get(self, key: str) -> bytes | None:
        if self.slow:
            self.endpoints.waiting.release()
            self.endpoints.release.wait(timeout=5)
        return None

    def get_with_etag(self, key: str) -> tuple[bytes, str] | None:
        self.get(key)
        return None


class Ticking:
    """A monotonic clock that moves only when told (``now += seconds``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_call_past_the_slots_of_a_slow_endpoint_fails_at_once() -> None:
    endpoints, clock = Endpoints(), Ticking()
    stores = RunStores(FakeKube(), 30.0, endpoints.open, max_in_flight=2, monotonic=clock)
    slow = [make_run(f"r{i}").with_storage(endpoint=SLOW).ref() for i in range(3)]
    held = [threading.Thread(target=stores.read_manifest, args=(ref,)) for ref in slow[:2]]
    for thread in held:
        thread.start()
    for _ in held:
        assert endpoints.waiting.acquire(timeout=5)
    clock.now += stores.slots.slow_seconds  # its calls have not answered for a second

    started = time.monotonic()
    with pytest.raises(EndpointBusy, match=f"endpoint {SLOW} is busy or slow: 2 calls") as e:
        stores.read_manifest(slow[2])
    refused_in = time.monotonic() - started
    fast = stores.read_manifest(make_run("r9").with_storage(endpoint=FAST).ref())
    endpoints.release.set()
    for thread in held:
        thread.join(timeout=5)

    assert refused_in < 0.5
    assert "its oldest has waited 1.0 s" in str(e.value)
    assert isinstance(e.value, StorageUnavailable)  # what the reconciler already handles
    assert fast is None  # another tenant's endpoint was served meanwhile
    assert stores.read_manifest(slow[2]) is None  # the slots are free again


def test_a_call_past_the_slots_of_an_answering_endpoint_waits_for_one() -> None:
    """A burst on one shared endpoint queues: the call gets the slot its neighbour gives back."""
    slots = EndpointSlots(limit=1)
    taken, give_back = threading.Event(), threading.Event()

    def neighbour() -> None:
        with slots.hold(SLOW):
            taken.set()
            give_back.wait(timeout=5)

    thread = threading.Thread(target=neighbour)
    thread.start()
    assert taken.wait(timeout=5)
    threading.Timer(0.2, give_back.set).start()

    started = time.monotonic()
    with slots.hold(SLOW):
        waited = time.monotonic() - started
    thread.join(timeout=5)

    assert 0.1 < waited < slots.wait_seconds


def test_a_call_waits_for_a_slot_no_longer_than_its_bound() -> None:
    clock = Ticking()
    slots = EndpointSlots(limit=1, wait_seconds=0.3, slow_seconds=60.0, monotonic=clock)
    with slots.hold(SLOW):
        timer = threading.Timer(0.1, lambda: setattr(clock, "now", clock.now + 0.3))
        timer.start()
        with pytest.raises(EndpointBusy, match=r"no slot came free in 0\.3 s"):
            slots.hold(SLOW).__enter__()
    with slots.hold(SLOW):
        pass  # the slot was given back, and the refused call took none


def test_aws_s3_itself_is_not_limited() -> None:
    endpoints = Endpoints()
    stores = RunStores(FakeKube(), 30.0, endpoints.open, max_in_flight=1)
    aws = make_run("r1").ref()
    assert aws.spec.checkpoint.storage.endpoint is None
    with stores.slots.hold(endpoint_of(aws.spec.checkpoint.storage)):  # its one slot taken
        assert stores.read_manifest(aws) is None
    assert limited(aws.spec.checkpoint.storage) is None
    assert limited(_storage("bk1", SLOW)) == SLOW


def test_endpoint_slots_are_given_back() -> None:
    slots = EndpointSlots(limit=2, wait_seconds=0.1)
    with slots.hold(SLOW), slots.hold(SLOW):
        with pytest.raises(EndpointBusy):
            slots.hold(SLOW).__enter__()
        with slots.hold(FAST):
            pass
    with slots.hold(SLOW), slots.hold(SLOW):
        pass  # both given back, also after the refusal


@pytest.mark.parametrize(
    ("endpoint", "region", "key"),
    [
        pytest.param("http://S3.Example:9000/", None, "http://s3.example:9000", id="case-path"),
        pytest.param("https://s3.example", None, "https://s3.example", id="no-port"),
        pytest.param(None, "eu-west-3", "AWS S3 (eu-west-3)", id="aws-region"),
        pytest.param(None, None, "AWS S3 (default region)", id="aws-default"),
    ],
)
def test_endpoints_are_told_apart_by_scheme_host_and_port(
    endpoint: str | None, region: str | None, key: str
) -> None:
    run = make_run().with_storage(endpoint=endpoint, region=region)

    assert endpoint_of(run.spec().checkpoint.storage) == key


# -- budgets ------------------------------------------------------------------------------


def _budget(client: Any) -> tuple[str, int, float, float]:
    config = client.meta.config
    retries = config.retries
    attempts = retries["total_max_attempts"]
    return retries["mode"], attempts, config.connect_timeout, config.read_timeout


@pytest.mark.usefixtures("no_aws_settings")
def test_the_operator_is_brief_and_the_agents_patient(
    monkeypatch: pytest.MonkeyPatch, run_agent: Callable[[str, dict[str, str]], int]
) -> None:
    storage = _storage("ckpt", endpoint="http://127.0.0.1:9")
    operator = RunStores(FakeKube(), 30.0).store_for(NAMESPACE, storage)
    agents: list[Any] = []

    def restore_main(store: Any, settings: object, metrics: object) -> int:
        agents.append(store)
        return 0

    monkeypatch.setattr(restore, "main", restore_main)
    env = {
        contract.ENV_STORAGE_URI: "s3://ckpt/runs/ml/r1",
        "AWS_ENDPOINT_URL": storage.endpoint,
        contract.ENV_METRICS_PORT: "0",
    }
    assert run_agent("restore", env) == 0  # the sync sidecar's store is made the same way
    [sidecar] = agents
    user = open_store(storage, None)  # trainingrun checkpoints list

    assert _budget(operator.client) == ("standard", 2, 5, 10)
    assert _budget(sidecar.client) == _budget(user.client) == ("adaptive", 9, 5, 60)
    # Worst cases, backoff aside: the operator's within 30 s, the sidecar's rides out minutes.
    brief, patient = OPERATOR_BUDGET, PATIENT_BUDGET
    assert brief.attempts * (brief.connect_timeout + brief.read_timeout) <= 30
    assert patient.attempts * patient.read_timeout >= 8 * 60


@pytest.fixture
def silent_endpoint() -> Iterator[tuple[str, list[socket.socket]]]:
    """An endpoint on 127.0.0.1 that accepts connections and never answers; the list holds the
    connections it accepted."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:  # closed
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}", accepted
    finally:
        server.close()
        for conn in accepted:
            conn.close()


@pytest.mark.usefixtures("no_aws_settings")
def test_an_operator_read_from_a_blackhole_gives_up_within_its_budget(
    silent_endpoint: tuple[str, list[socket.socket]],
) -> None:
    url, accepted = silent_endpoint
    kube = FakeKube()
    kube.secrets[(NAMESPACE, "s3")] = SECRET
    run = make_run().with_storage(endpoint=url, region="us-east-1", credentials_secret="s3")
    stores = RunStores(kube, 30.0)  # the operator's own clients

    started = time.monotonic()
    with pytest.raises(StorageUnavailable, match=r"manifest\.json: Read timeout"):
        stores.read_manifest(run.ref())
    took = time.monotonic() - started

    assert took < 30, f"gave up after {took:.1f} s"
    assert took >= OPERATOR_BUDGET.read_timeout  # it did wait for an answer
    assert len(accepted) == OPERATOR_BUDGET.attempts
