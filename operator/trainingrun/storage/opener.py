"""Opening a run's store: the uri's scheme picks it (``s3://`` boto3, ``gs://``
google-cloud-storage, ``az://`` azure-storage-blob), with the run's endpoint, region and
credentials. The interface every store gives and the errors it raises are ``storage.base``'s,
re-exported here so callers import one module.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from trainingrun.api import StorageSpec
from trainingrun.contract import STORE_CREDENTIAL_KEYS
from trainingrun.storage.base import (
    MAX_GET_BYTES,
    OPERATOR_BUDGET,
    PATIENT_BUDGET,
    SCHEMES,
    BucketNotFound,
    CallBudget,
    ChecksumMismatch,
    CredentialsSecretError,
    KeyNotFound,
    Location,
    NotFound,
    PreconditionFailed,
    StorageAccessDenied,
    StorageError,
    StorageMisconfigured,
    StorageRejected,
    StorageUnavailable,
    Store,
    TooLarge,
    log_text,
)
from trainingrun.storage.gcs.key import key_info
from trainingrun.storage.s3.store import Credentials, S3Store, make_client, open_s3

__all__ = [
    "MAX_GET_BYTES",
    "OPERATOR_BUDGET",
    "PATIENT_BUDGET",
    "BucketNotFound",
    "CallBudget",
    "ChecksumMismatch",
    "Credentials",
    "CredentialsSecretError",
    "KeyNotFound",
    "Location",
    "NotFound",
    "PreconditionFailed",
    "S3Store",
    "SecretValues",
    "StorageAccessDenied",
    "StorageError",
    "StorageMisconfigured",
    "StorageRejected",
    "StorageUnavailable",
    "Store",
    "TooLarge",
    "log_text",
    "make_client",
    "open_location",
    "open_store",
    "parse_uri",
    "secret_credentials",
]


def parse_uri(uri: str) -> Location:
    """``s3://bucket/prefix``, ``gs://bucket/prefix`` or ``az://account/container/prefix``."""
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError(
            f"storage uri {uri!r} must start with s3://, gs:// or az:// "
            "(s3://bucket/prefix, gs://bucket/prefix, az://account/container/prefix)"
        )
    account = ""
    if scheme == "az":
        account, _, rest = rest.partition("/")
        if not account:
            raise ValueError(f"storage uri {uri!r} has no storage account (az://account/...)")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        what = "container (az://account/container/prefix)" if scheme == "az" else "bucket"
        raise ValueError(f"storage uri {uri!r} has no {what}")
    return Location(bucket, prefix.strip("/"), scheme, account)


class SecretValues(dict[str, str]):
    """The credential keys of a run's Secret that its store reads; never printed."""

    def __repr__(self) -> str:
        return f"SecretValues({', '.join(sorted(self))}: ***)"

    __str__ = __repr__

    def fingerprint(self) -> str:
        """A hash of the values: stores opened with other keys are other stores."""
        joined = "\0".join(f"{k}={self[k]}" for k in sorted(self))
        return hashlib.sha256(joined.encode()).hexdigest()


def secret_credentials(
    namespace: str, name: str, data: Mapping[str, str] | None, scheme: str = "s3"
) -> SecretValues:
    """The keys the ``scheme``'s store reads, from the decoded data of the Secret named by
    credentialsSecret; empty values count as absent. A gs:// key file must be one the store
    takes (``gcs.key``: Google's token_uri, bounded size and fields). Raises
    CredentialsSecretError naming the key or field at fault, never a value."""
    keys, all_needed = STORE_CREDENTIAL_KEYS[scheme]
    wanted = " and ".join(keys) if all_needed else " or ".join(keys)
    if data is None:
        raise CredentialsSecretError(
            f"Secret {namespace}/{name} named by spec.checkpoint.storage.credentialsSecret does "
            f"not exist: create it with {'keys' if all_needed else 'key'} {wanted}"
        )
    found = SecretValues({k: data[k] for k in keys if data.get(k)})
    missing = [k for k in keys if k not in found]
    if (all_needed and missing) or not found:
        raise CredentialsSecretError(
            f"Secret {namespace}/{name} has no key {missing[0] if all_needed else wanted}"
        )
    if scheme == "gs":  # its token_uri is a URL the client would call: checked before any use
        try:
            key_info(found[keys[0]])
        except CredentialsSecretError as e:
            raise CredentialsSecretError(f"Secret {namespace}/{name}: {e}") from None
    return found


def open_location(
    location: Location,
    endpoint: str | None,
    region: str | None,
    secret: Mapping[str, str] | None,
    budget: CallBudget = PATIENT_BUDGET,
    pool: int = 16,
) -> Store:
    """The store of ``location``'s bucket. ``secret`` holds the keys of
    ``contract.STORE_CREDENTIAL_KEYS`` for its scheme; None: the pod's own identity (the AWS
    chain, GKE or Azure Workload Identity). Raises StorageMisconfigured."""
    # Each cloud's SDK is imported when a run uses it: an operator of S3 runs loads neither.
    if location.scheme == "gs":
        from trainingrun.storage.gcs.store import open_gcs  # noqa: PLC0415

        return open_gcs(location, endpoint, secret, budget, pool)
    if location.scheme == "az":
        from trainingrun.storage.azure.store import open_azure  # noqa: PLC0415

        return open_azure(location, endpoint, secret, budget, pool)
    keys = STORE_CREDENTIAL_KEYS["s3"][0]
    creds = Credentials(secret[keys[0]], secret[keys[1]]) if secret else None
    return open_s3(location, endpoint, region, creds, budget, pool)


def open_store(
    storage: StorageSpec, secret: Mapping[str, str] | None, budget: CallBudget = PATIENT_BUDGET
) -> Store:
    """The store of a run's bucket, with its endpoint and region. Raises StorageMisconfigured."""
    location = parse_uri(storage.uri)
    return open_location(location, storage.endpoint, storage.region, secret, budget)
