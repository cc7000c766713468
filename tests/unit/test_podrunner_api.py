"""The pod runner's API calls through an API server that is briefly away (restarted): a lookup
is served from what was looked up before or makes the container wait, and the final delete is
reported as not done so it is sent again, never an error that ends the pod's worker."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from urllib3.exceptions import MaxRetryError

from tests.podrunner.link import Link
from tests.podrunner.podapi import PodApi
from tests.podrunner.spec import ConfigError


class Secret:
    def __init__(self, data: dict[str, str]) -> None:
        self.data = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}


class Core:
    """CoreV1Api's calls the worker makes, answering or failing as told."""

    def __init__(self) -> None:
        self.fail: BaseException | None = None
        self.deletes = 0

    def read_namespaced_secret(self, name: str, namespace: str) -> Secret:
        if self.fail:
            raise self.fail
        return Secret({"key": f"{namespace}/{name}"})

    def delete_namespaced_pod(self, name: str, namespace: str, **_: Any) -> None:
        self.deletes += 1
        if self.fail:
            raise self.fail


def refused() -> MaxRetryError:
    return MaxRetryError(None, "/api/v1/namespaces/ns/secrets/s", "connection refused")


def worker() -> tuple[PodApi, Core]:
    core = Core()
    return PodApi(core, Link(), "ns", "pod-1", "uid-1"), core  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "failure",
    [refused(), ApiException(status=503, reason="Service Unavailable")],
    ids=["connection refused", "503"],
)
def test_a_lookup_while_the_api_server_is_away(failure: BaseException) -> None:
    api, core = worker()
    core.fail = failure
    with pytest.raises(ConfigError, match="failed to sync secret cache: Secret ns/s"):
        api.lookup("Secret", "ns", "s")  # never looked up: the container waits
    core.fail = None
    assert api.lookup("Secret", "ns", "s") == {"key": "ns/s"}
    core.fail = failure
    assert api.lookup("Secret", "ns", "s") == {"key": "ns/s"}  # served as looked up before


def test_a_missing_secret_is_none_not_an_outage() -> None:
    api, core = worker()
    core.fail = ApiException(status=404, reason="Not Found")
    assert api.lookup("Secret", "ns", "s") is None


def test_a_refused_lookup_is_a_config_error_of_its_own() -> None:
    api, core = worker()
    core.fail = ApiException(status=403, reason="Forbidden")
    with pytest.raises(ConfigError, match=r"^Secret ns/s: 403 Forbidden$"):
        api.lookup("Secret", "ns", "s")


@pytest.mark.parametrize(
    ("failure", "done"),
    [
        (refused(), False),
        (ApiException(status=503, reason="Service Unavailable"), False),
        (ApiException(status=404, reason="Not Found"), True),  # gone already
        (ApiException(status=409, reason="Conflict"), True),  # another pod of the name now
        (None, True),
    ],
    ids=["connection refused", "503", "404", "409", "deleted"],
)
def test_the_final_delete_says_whether_it_was_taken(
    failure: BaseException | None, done: bool
) -> None:
    api, core = worker()
    core.fail = failure
    assert api.delete() is done
    assert core.deletes == 1
