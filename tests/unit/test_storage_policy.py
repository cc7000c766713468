"""Whether a run may use the storage it names (decide/storagepolicy.py), and what the Reconciler
does about storage it cannot use: checked before any call to the bucket.

Covers:

- the admin's endpoint allowlist (``aws`` for AWS S3 itself; URLs compared by scheme, host and
  port, the scheme's default port left out) and uri base paths (part by part; ``{namespace}``
  replaced by the run's namespace): outside them, StorageNotAllowed naming the field and the fix;
- a custom endpoint without credentialsSecret: refused (the operator would sign with its own
  identity), unless the admin listed that endpoint;
- a run folder with a part runs use (``checkpoints``, ``manifest.json``, empty, ``.``, ``..``),
  from the uri or from the namespace and run name: InvalidSpec;
- allowlist entries that can never match stop the operator at start (ConfigurationError);
- the Reconciler fails such a run at once, with no call to the bucket and no pod; an endpoint of
  which no client can be made fails the run as StorageMisconfigured naming the field; a Secret
  whose value is not UTF-8 is waited for like a missing one, with a message that says so; an
  endpoint that does not answer is said in the status and Event without the connection error
  (which stays in the log).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.unit.builders import NAMESPACE
from tests.unit.test_reconciler import World, condition
from trainingrun.api import StorageSpec
from trainingrun.decide import reasons as R
from trainingrun.decide.storagepolicy import Refusal, normal_endpoint, refusal
from trainingrun.operator.settings import ConfigurationError, OperatorSettings
from trainingrun.storage.opener import Credentials, StorageMisconfigured, StorageUnavailable, Store

SECRET = "creds"


def _storage(uri: str = "s3://ckpt/runs", **fields: Any) -> StorageSpec:
    return StorageSpec(uri=uri, **fields)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://minio.minio:9000", "http://minio.minio:9000"),
        ("HTTPS://S3.Example.com:443/path", "https://s3.example.com"),
        ("http://10.0.0.1:80", "http://10.0.0.1"),
        ("http://[::1]:9000", "http://[::1]:9000"),
        ("http://host:99999", None),
        ("ftp://host", None),
        ("http://", None),
    ],
)
def test_endpoints_compare_by_scheme_host_and_port(url: str, expected: str | None) -> None:
    assert normal_endpoint(url) == expected


@pytest.mark.parametrize(
    ("storage", "endpoints", "uris", "reason", "words"),
    [
        pytest.param(_storage(), (), (), None, "", id="aws-no-lists"),
        pytest.param(
            _storage(endpoint="http://minio:9000", credentials_secret=SECRET),
            (),
            (),
            None,
            "",
            id="custom-with-secret",
        ),
        pytest.param(
            _storage(endpoint="http://169.254.169.254", credentials_secret=SECRET),
            ("http://minio:9000",),
            (),
            R.STORAGE_NOT_ALLOWED,
            "http://169.254.169.254 is not one of the endpoints",
            id="endpoint-not-listed",
        ),
        pytest.param(
            _storage(endpoint="http://MINIO:9000/", credentials_secret=SECRET),
            ("http://minio:9000",),
            (),
            None,
            "",
            id="endpoint-listed-other-case",
        ),
        pytest.param(
            _storage(),
            ("http://minio:9000",),
            (),
            R.STORAGE_NOT_ALLOWED,
            "AWS S3",
            id="aws-not-listed",
        ),
        pytest.param(_storage(), ("aws",), (), None, "", id="aws-listed"),
        pytest.param(
            _storage(endpoint="http://10.0.0.5:8080"),
            (),
            (),
            R.STORAGE_NOT_ALLOWED,
            "without credentialsSecret",
            id="custom-without-secret",
        ),
        pytest.param(
            _storage(endpoint="https://bucket.vpce-1.s3.us-east-1.vpce.amazonaws.com"),
            ("https://bucket.vpce-1.s3.us-east-1.vpce.amazonaws.com",),
            (),
            None,
            "",
            id="custom-without-secret-listed",
        ),
        pytest.param(
            _storage("s3://ckpt/other"),
            (),
            ("s3://ckpt/runs",),
            R.STORAGE_NOT_ALLOWED,
            "not under a base path",
            id="uri-outside-base",
        ),
        pytest.param(
            _storage("s3://ckpt/runsx"),
            (),
            ("s3://ckpt/runs",),
            R.STORAGE_NOT_ALLOWED,
            "",
            id="uri-prefix-not-part",
        ),
        pytest.param(
            _storage("s3://ckpt/runs/a"), (), ("s3://ckpt/runs/",), None, "", id="uri-under-base"
        ),
        pytest.param(
            _storage(f"s3://ckpt/t/{NAMESPACE}"),
            (),
            ("s3://ckpt/t/{namespace}",),
            None,
            "",
            id="namespace-base",
        ),
        pytest.param(
            _storage("s3://ckpt/t/other-team"),
            (),
            ("s3://ckpt/t/{namespace}",),
            R.STORAGE_NOT_ALLOWED,
            f"s3://ckpt/t/{NAMESPACE}",
            id="another-namespace-base",
        ),
        pytest.param(
            _storage("s3://ckpt/runs/ml/a/checkpoints"),
            (),
            (),
            R.INVALID_SPEC,
            "'checkpoints'",
            id="inside-checkpoints",
        ),
        pytest.param(_storage("s3://ckpt/runs//x"), (), (), R.INVALID_SPEC, "''", id="empty-part"),
        pytest.param(_storage("s3://ckpt/a/../b"), (), (), R.INVALID_SPEC, "'..'", id="dotdot"),
        pytest.param(_storage("s3://ckpt/runs/"), (), (), None, "", id="trailing-slash"),
        pytest.param(_storage("s3://ckpt"), (), (), None, "", id="bucket-only"),
    ],
)
def test_refusals(
    storage: StorageSpec,
    endpoints: tuple[str, ...],
    uris: tuple[str, ...],
    reason: str | None,
    words: str,
) -> None:
    got = refusal(storage, NAMESPACE, "r1", endpoints, uris)

    if reason is None:
        assert got is None
    else:
        assert got is not None and got.reason == reason
        assert words in got.message and "spec.checkpoint.storage" in got.message


@pytest.mark.parametrize("name", ["checkpoints", "manifest.json"])
def test_a_run_named_like_a_run_folder_part_is_refused(name: str) -> None:
    got = refusal(_storage(), NAMESPACE, name)

    assert isinstance(got, Refusal) and got.reason == R.INVALID_SPEC
    assert repr(name) in got.message


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TRAININGRUN_ALLOWED_ENDPOINTS", "minio:9000"),
        ("TRAININGRUN_ALLOWED_ENDPOINTS", "http://x:99999"),
        ("TRAININGRUN_ALLOWED_URIS", "hdfs://bucket"),
        ("TRAININGRUN_ALLOWED_URIS", "s3://"),
    ],
)
def test_allowlist_entries_that_never_match_stop_the_operator(variable: str, value: str) -> None:
    with pytest.raises(ConfigurationError, match=value.replace(".", r"\.")):
        OperatorSettings.from_env({variable: value})


def test_allowlists_are_read_from_the_environment() -> None:
    s = OperatorSettings.from_env(
        {
            "TRAININGRUN_ALLOWED_ENDPOINTS": "aws, http://minio:9000",
            "TRAININGRUN_ALLOWED_URIS": "s3://b/t",
        }
    )

    assert (s.allowed_endpoints, s.allowed_uris) == (("aws", "http://minio:9000"), ("s3://b/t",))


# -- the Reconciler -----------------------------------------------------------------------------


def test_a_refused_storage_fails_the_run_before_any_call_to_it() -> None:
    settings = OperatorSettings(allowed_endpoints=("http://minio:9000",))
    w = World(
        settings=settings, storage={"endpoint": "http://10.1.2.3:22", "credentials_secret": SECRET}
    )

    assert w.reconcile() is None

    status = w.status()
    assert (status["phase"], status["reason"]) == ("Failed", R.STORAGE_NOT_ALLOWED)
    assert "TRAININGRUN_ALLOWED_ENDPOINTS" in status["message"]
    assert w.events.reasons() == [R.STORAGE_NOT_ALLOWED]
    assert w.bucket.opened == [] and w.kube.creates == []


def test_an_endpoint_no_client_can_be_made_of_fails_the_run_naming_the_field() -> None:
    w = World()

    def refuse(storage: StorageSpec, credentials: Credentials | None) -> Store:
        raise StorageMisconfigured(
            "spec.checkpoint.storage: no S3 client can be made (ValueError: bad)"
        )

    w.bucket.open = refuse  # type: ignore[method-assign]
    w.restart()

    assert w.reconcile() is None

    status = w.status()
    assert (status["phase"], status["reason"]) == ("Failed", R.STORAGE_MISCONFIGURED)
    assert "spec.checkpoint.storage" in status["message"]
    assert condition(status, R.FAILED)["reason"] == R.STORAGE_MISCONFIGURED
    assert w.kube.creates == []


def test_a_secret_that_is_not_utf8_is_waited_for_with_a_message_that_says_so() -> None:
    w = World(secret=SECRET)

    def undecodable(namespace: str, name: str) -> dict[str, str] | None:
        return {"AWS_ACCESS_KEY_ID": b"\xff\xfe".decode()}

    w.kube.get_secret_data = undecodable  # type: ignore[method-assign]

    w.reconcile()

    status = w.status()
    assert (status["phase"], status["reason"]) == ("Pending", R.MISSING_SECRET)
    assert "not UTF-8" in status["message"]
    assert w.kube.creates == []


def test_an_endpoint_that_does_not_answer_is_said_without_the_connection_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = World(storage={"endpoint": "http://10.1.2.3:22", "credentials_secret": SECRET})
    w.kube.secrets[(NAMESPACE, SECRET)] = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "k"}
    detail = "Could not connect to the endpoint URL: Connection refused by 10.1.2.3:22 (SSH-2.0)"

    def unreachable(key: str) -> bytes | None:
        raise StorageUnavailable(detail)

    w.bucket.get = unreachable  # type: ignore[method-assign]
    w.bucket.get_with_etag = unreachable  # type: ignore[assignment]

    with caplog.at_level(logging.WARNING, logger="trainingrun.operator"):
        w.reconcile()

    status = w.status()
    assert (status["phase"], status["reason"]) == ("Pending", R.STORAGE_UNAVAILABLE)
    assert "http://10.1.2.3:22 did not answer" in status["message"]
    assert all(detail not in message for _, _, message in w.events.posted)
    assert detail not in status["message"]
    assert detail in caplog.text  # the operator's log keeps it for the admin
