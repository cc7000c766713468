"""The operator's store calls end by a wall-clock deadline, whatever the endpoint trickles.

The operator's clients (``storebase.OPERATOR_BUDGET``) used to time out per receive only: an
endpoint sending one byte a second never tripped the 10 s read timeout, so one call never
ended. Each call now has a deadline (``CallBudget.call_deadline``, 25 s for the operator), all
attempts included, on S3, Cloud Storage and Azure alike.

Covers, against a local server on 127.0.0.1 that trickles one byte a second:

- a get whose body, status line or headers trickle, and a listing whose pages never end (a
  page every 0.2 s, each naming a next one), on each of the three stores, all at once: each call
  gives up by the documented deadline plus a little slack with ``StorageUnavailable`` naming the
  endpoint and the deadline (on the old code they were all still running when the test stopped
  waiting);
- the same with a short deadline, store by store and way by way (fast);
- a listing stays lazy: its first entries come after the first page, before a second is asked;
- the sidecar's and the restore's budget (``PATIENT_BUDGET``) has no deadline of its own.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from tests.unit.test_bounds_stores_server import (
    LocalServer,
    Piece,
    Request,
    reply,
    run_all,
    trickled,
)
from trainingrun.storage.opener import (
    OPERATOR_BUDGET,
    PATIENT_BUDGET,
    CallBudget,
    Location,
    StorageUnavailable,
    Store,
    open_location,
)

DOCUMENTED_DEADLINE = 25.0  # storebase.OPERATOR_BUDGET: an operator call ends by then
SLACK = 1.5  # the thread's start and the last receive's return
EVERY = 1.0  # the trickle: one byte a second, well under the 10 s read timeout
STORES = ("s3", "gs", "az")
WAYS = ("body", "status", "headers", "pages")
BODY = 1_000_000  # the object's length as the answer's headers tell it (under the 8 MiB cap)
HEADERS = {
    "Content-Length": str(BODY),
    "Content-Range": f"bytes 0-{BODY - 1}/{BODY}",
    "Content-Type": "application/octet-stream",
    "ETag": '"0x8D0000000000001"',
    "Last-Modified": "Wed, 01 Jan 2025 00:00:00 GMT",
    "x-ms-blob-type": "BlockBlob",
    "x-goog-generation": "1",
}


def _head() -> bytes:
    """The status line and headers of a ranged answer whose body is BODY bytes."""
    lines = ["HTTP/1.1 206 Partial Content", *(f"{k}: {v}" for k, v in HEADERS.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _page(kind: str, n: int) -> bytes:
    """Page ``n`` of a listing that never ends: one object, and a next page named."""
    if kind == "s3":
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult '
            'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>bkt</Name><Prefix>p/</Prefix>'
            f"<KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated>"
            f"<NextContinuationToken>t{n}</NextContinuationToken><Contents><Key>p/k{n}</Key>"
            "<Size>1</Size></Contents></ListBucketResult>"
        )
        return reply("200 OK", {"Content-Type": "application/xml"}, xml.encode())
    if kind == "gs":
        item = {"kind": "storage#object", "name": f"p/k{n}", "bucket": "bkt", "size": "1"}
        page = {"kind": "storage#objects", "nextPageToken": f"t{n}", "items": [item]}
        return reply("200 OK", {"Content-Type": "application/json"}, json.dumps(page).encode())
    xml = (
        '<?xml version="1.0" encoding="utf-8"?><EnumerationResults '
        'ServiceEndpoint="http://127.0.0.1/acct/" ContainerName="cont"><Prefix>p/</Prefix>'
        f"<Blobs><Blob><Name>p/k{n}</Name><Properties><Content-Length>1</Content-Length>"
        "<BlobType>BlockBlob</BlobType></Properties></Blob></Blobs>"
        f"<NextMarker>m{n}</NextMarker></EnumerationResults>"
    )
    return reply("200 OK", {"Content-Type": "application/xml"}, xml.encode())


def _answer(kind: str, way: str) -> Callable[[Request, int], Iterable[Piece]]:
    def answer(request: Request, index: int) -> Iterable[Piece]:
        if way == "pages":
            yield 0.2, _page(kind, index)
        elif way == "body":
            yield 0, _head()
            yield from trickled(b"", EVERY, b"{}")
        elif way == "status":
            yield from trickled(_head(), EVERY, b"{}")
        else:  # the status line at once, then the headers byte by byte
            status, _, rest = _head().partition(b"\r\n")
            yield 0, status + b"\r\n"
            yield from trickled(rest, EVERY, b"{}")

    return answer


def _store(kind: str, url: str, budget: CallBudget) -> Store:
    if kind == "s3":
        keys = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "example"}
        return open_location(Location("bkt", "", "s3"), url, "us-east-1", keys, budget)
    if kind == "gs":  # no Secret: anonymous, no token call
        return open_location(Location("bkt", "", "gs"), url, None, None, budget)
    key = {"AZURE_STORAGE_KEY": base64.b64encode(b"k" * 32).decode()}
    return open_location(Location("cont", "", "az", "acct"), f"{url}/acct", None, key, budget)


def _call(store: Store, way: str) -> Callable[[], Any]:
    if way == "pages":
        return lambda: sum(1 for _ in store.list_objects("p/"))
    return lambda: store.get("k")


def _run(ways: dict[str, tuple[str, str]], budget: CallBudget, deadline: float) -> None:
    """Runs each (store, way) against its own trickling server, all at once; each must end by
    ``deadline`` + SLACK with StorageUnavailable naming the endpoint and the deadline."""
    servers = {name: LocalServer(_answer(*kw), lifetime=deadline + 30) for name, kw in ways.items()}
    for server in servers.values():
        server.__enter__()
    try:
        calls = {
            name: _call(_store(kind, servers[name].url, budget), way)
            for name, (kind, way) in ways.items()
        }
        bound = deadline + SLACK + 2
        outcomes = run_all(calls, bound)
    finally:
        for server in servers.values():
            server.__exit__(None, None, None)
    measured = {n: round(o.seconds, 2) for n, o in outcomes.items() if o.done}
    print(f"deadline {deadline} s, measured give-up seconds: {measured}")
    running = sorted(n for n, o in outcomes.items() if not o.done)
    assert not running, f"still running after {bound} s: {running}"
    for name, outcome in outcomes.items():
        assert outcome.seconds <= deadline + SLACK, (name, outcome.seconds)
        assert isinstance(outcome.error, StorageUnavailable), (name, repr(outcome.error))
        said = str(outcome.error)
        assert f"127.0.0.1:{servers[name].port}" in said, (name, said)
        assert f"{deadline:g} s" in said, (name, said)


def test_operator_calls_give_up_by_the_deadline_whatever_the_endpoint_trickles() -> None:
    ways = {f"{kind}-{way}": (kind, way) for kind in STORES for way in WAYS}
    _run(ways, OPERATOR_BUDGET, DOCUMENTED_DEADLINE)
    assert getattr(OPERATOR_BUDGET, "call_deadline", None) == DOCUMENTED_DEADLINE


@pytest.mark.parametrize("way", WAYS)
def test_a_short_deadline_ends_each_way_on_each_store(way: str) -> None:
    budget = dataclasses.replace(OPERATOR_BUDGET, call_deadline=2.0)
    _run({kind: (kind, way) for kind in STORES}, budget, 2.0)


@pytest.mark.parametrize("kind", STORES)
def test_a_listing_stays_lazy_page_by_page(kind: str) -> None:
    budget = dataclasses.replace(OPERATOR_BUDGET, call_deadline=10.0)
    with LocalServer(_answer(kind, "pages"), lifetime=20) as server:

        def pages() -> int:  # the listing's requests (GCS reads the bucket's metadata first)
            return sum("prefix=p%2F" in r.target for r in server.requests)

        listing = iter(_store(kind, server.url, budget).list_objects("p/"))
        first = next(listing)
        assert pages() == 1
        second = next(listing)
        assert pages() == 2
        assert first != second and first[0].startswith("p/k") and first[1] == 1


def test_the_agents_budget_keeps_no_deadline_of_its_own() -> None:
    assert PATIENT_BUDGET.call_deadline is None
    assert OPERATOR_BUDGET.call_deadline is not None
    assert OPERATOR_BUDGET.deadline <= OPERATOR_BUDGET.call_deadline
