"""The operator counts its own calls: to the Kubernetes API and to the runs' buckets.

Covers:

- ``RestClient`` (the client ``load_config`` makes) against a loopback HTTP server on
  127.0.0.1: every request the Kube wrapper sends is told once, by verb and the API path's
  template, with a custom resource's plural filled in; a client with no listener sends as
  before;
- ``RunStores(on_call=...)``: the store it opens is counted call by call, by operation, and
  each call reaches the store with its arguments and its result;
- the operator's metrics: ``trainingrun_api_calls`` and ``trainingrun_bucket_calls`` add up
  what they are told, by label.
"""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.unit.builders import NAMESPACE, make_run
from tests.unit.fakes import FakeBucket, FakeKube, answer_json, loopback_api_client
from trainingrun.operator.buckets import RunStores
from trainingrun.operator.kube import Kube
from trainingrun.operator.kubeconn import RestClient
from trainingrun.operator.metrics import OperatorMetrics

RUN_PATH = "/apis/{group}/{version}/namespaces/{namespace}/trainingruns/{name}"


class _NotFound(BaseHTTPRequestHandler):
    """An API server that has nothing: 404 to every request."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        answer_json(self, 404, {"kind": "Status", "code": 404, "reason": "NotFound"})

    do_GET = do_PATCH = do_DELETE = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        del format, args  # the server's own access log is not under test


@pytest.fixture
def loopback_api() -> Iterator[RestClient]:
    with loopback_api_client(_NotFound) as api:
        yield api


@pytest.mark.parametrize(
    "call, expected",
    [
        pytest.param(lambda kube: kube.get_run("team-a", "r1"), ("GET", RUN_PATH), id="get-run"),
        pytest.param(
            lambda kube: kube.patch_run_status("team-a", "r1", {"attempt": 2}),
            ("PATCH", RUN_PATH + "/status"),
            id="patch-run-status",
        ),
        pytest.param(
            lambda kube: kube.get_pod("team-a", "r1-1"),
            ("GET", "/api/v1/namespaces/{namespace}/pods/{name}"),
            id="get-pod",
        ),
        pytest.param(
            lambda kube: kube.delete_pod_by_uid("team-a", "r1-1", "uid-1"),
            ("DELETE", "/api/v1/namespaces/{namespace}/pods/{name}"),
            id="delete-pod",
        ),
        pytest.param(
            lambda kube: kube.get_secret_data("team-a", "creds"),
            ("GET", "/api/v1/namespaces/{namespace}/secrets/{name}"),
            id="get-secret",
        ),
        pytest.param(
            lambda kube: kube.get_node("kwok-node-0"),
            ("GET", "/api/v1/nodes/{name}"),
            id="get-node",
        ),
    ],
)
def test_each_api_request_is_told_once_by_verb_and_path(
    loopback_api: RestClient, call: Any, expected: tuple[str, str]
) -> None:
    told: list[tuple[str, str]] = []
    loopback_api.on_call = lambda verb, resource: told.append((verb, resource))

    call(Kube(loopback_api))

    assert told == [expected]


def test_a_client_with_no_listener_sends_as_before(loopback_api: RestClient) -> None:
    assert loopback_api.on_call is None
    assert Kube(loopback_api).get_run("team-a", "r1") is None  # the 404 came back as None


def test_the_stores_calls_are_counted_and_reach_the_store() -> None:
    bucket = FakeBucket()
    told: list[str] = []
    storage = make_run().with_storage(uri="s3://bk1/runs").spec().checkpoint.storage
    stores = RunStores(FakeKube(), 30.0, bucket.open, on_call=told.append)
    store = stores.store_for(NAMESPACE, storage)

    etag = store.put("runs/a", b"one")
    got = store.get_with_etag("runs/a")
    missing = store.get("runs/b")

    assert told == ["put", "get_with_etag", "get"]
    assert got == (b"one", etag)
    assert missing is None
    assert bucket.gets == ["runs/a", "runs/b"]
    assert stores.store_for(NAMESPACE, storage) is store  # one client, kept


def test_the_metrics_add_up_by_label() -> None:
    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)
    for verb, resource in [("GET", "/a"), ("GET", "/a"), ("PATCH", "/a")]:
        metrics.count_api_call(verb, resource)
    for operation in ("get", "put", "get"):
        metrics.count_bucket_call(operation)

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("trainingrun_api_calls_total", verb="GET", resource="/a") == 2
    assert sample("trainingrun_api_calls_total", verb="PATCH", resource="/a") == 1
    assert sample("trainingrun_bucket_calls_total", operation="get") == 2
    assert sample("trainingrun_bucket_calls_total", operation="put") == 1
