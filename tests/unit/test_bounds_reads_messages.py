"""What status and Events say of a failed bucket call: the operator's own words, the endpoint's
normalised scheme, host and port, and the names the run's spec gives; never text or numbers
the endpoint sent (an Event that echoed them would let a tenant read what a service on the
operator's network answers).

Covers ``stores.public_message`` for each kind of storage error and for a manifest that cannot
be used, from a custom endpoint and from a cloud's own service.
"""

from __future__ import annotations

import pytest

from tests.unit.builders import make_run
from trainingrun.api import StorageSpec
from trainingrun.checkpoint.capped import ManifestTooNew
from trainingrun.checkpoint.lookup import ReadsTooSlow
from trainingrun.checkpoint.manifest import RUN_MANIFEST, ManifestError, too_large
from trainingrun.operator.buckets import EndpointBusy, public_message
from trainingrun.storage.opener import (
    BucketNotFound,
    ChecksumMismatch,
    PreconditionFailed,
    StorageAccessDenied,
    StorageError,
    StorageRejected,
    StorageUnavailable,
    TooLarge,
)

# What an endpoint on the operator's network might answer, and a size it might tell.
TOLD = "internal-admin-token-7f3a"
SIZE = 987654321
KEY = "s3://ckpt/runs/ml/r1/manifest.json"


def _storage(endpoint: str | None) -> StorageSpec:
    return (
        make_run().with_storage(uri="s3://ckpt/runs", endpoint=endpoint).spec().checkpoint.storage
    )


ERRORS = {
    "unavailable": StorageUnavailable(f"{KEY}: 503 {TOLD}"),
    "denied": StorageAccessDenied(f"{KEY}: AccessDenied: {TOLD}"),
    "no-bucket": BucketNotFound(f"{KEY}: NoSuchBucket: {TOLD}"),
    "rejected": StorageRejected(f"{KEY}: the endpoint refused the request ({TOLD})"),
    "checksum": ChecksumMismatch(f"{KEY}: BadDigest {TOLD}"),
    "precondition": PreconditionFailed(f"{KEY}: {TOLD}"),
    "too-large": TooLarge(KEY, SIZE, 8 << 20),
    "other": StorageError(f"{KEY}: {TOLD}"),
    "manifest-too-large": too_large(KEY, SIZE, 4 << 20),
    "manifest-malformed": ManifestError(f"{RUN_MANIFEST} is not valid JSON ({TOLD})"),
    "manifest-too-new": ManifestTooNew(f"{RUN_MANIFEST} has version {SIZE}", RUN_MANIFEST, 2),
}


@pytest.mark.parametrize("error", list(ERRORS.values()), ids=list(ERRORS))
def test_a_custom_endpoint_is_said_in_our_own_words(error: Exception) -> None:
    said = public_message(error, _storage("http://10.0.0.5:8080/"))

    assert TOLD not in said
    assert str(SIZE) not in said
    assert "10.0.0.5:8080" in said or RUN_MANIFEST in said


@pytest.mark.parametrize(
    "error",
    [
        EndpointBusy("endpoint http://10.0.0.5:8080 is busy or slow: 4 calls to it are ..."),
        ReadsTooSlow("reading the committed checkpoints took over 120 s, the most a start may"),
    ],
    ids=["busy", "too-slow"],
)
def test_what_the_operator_itself_says_is_kept(error: Exception) -> None:
    assert public_message(error, _storage("http://10.0.0.5:8080")) == str(error)


def test_a_cloud_service_s_manifest_error_is_kept() -> None:
    """From a cloud's own service the manifest is the tenant's own bucket, and what is wrong
    with it helps them fix it; nothing there is on the operator's network."""
    error = ManifestError(f"{RUN_MANIFEST} has version 9, newer than the 2 this build reads")

    assert public_message(error, _storage(None)) == str(error)


def test_a_cloud_service_s_storage_error_is_said_in_our_own_words() -> None:
    said = public_message(ERRORS["denied"], _storage(None))

    assert TOLD not in said
    assert said.startswith("AWS S3 (default region) denied the run's credentials")


@pytest.mark.parametrize(
    ("error", "says"),
    [
        pytest.param(ERRORS["no-bucket"], "does not exist", id="no-bucket"),
        pytest.param(ERRORS["manifest-too-new"], "upgrade the operator", id="too-new"),
        pytest.param(ERRORS["manifest-too-large"], "over the cap of 4194304 bytes", id="large"),
        pytest.param(ERRORS["denied"], "credentialsSecret", id="denied"),
    ],
)
def test_our_own_words_still_say_what_to_do(error: Exception, says: str) -> None:
    assert says in public_message(error, _storage("http://10.0.0.5:8080"))
