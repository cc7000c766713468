"""How the Cloud Storage client of a store is made: its credentials (the Secret's service-account
key, checked by ``gcs.key``; anonymous on a custom endpoint without one; else the pod's own
identity, google.auth.default: GKE Workload Identity), its endpoint and its HTTP pool, whose
connections keep to the calls' deadlines when the budget has one (``storage.deadline``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import google.auth
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from google.oauth2 import service_account
from requests.adapters import HTTPAdapter

from trainingrun.storage.base import CallBudget, CredentialsSecretError, StorageMisconfigured
from trainingrun.storage.deadline import BoundedAdapter
from trainingrun.storage.gcs.key import KEY, key_info

# Without an endpoint the cloud's own; named, so STORAGE_EMULATOR_HOST in the environment (which
# the library would otherwise follow, anonymously) cannot redirect a run's calls.
GCS_ENDPOINT = "https://storage.googleapis.com"


def _client(credentials: Any, project: str | None, endpoint: str, pool: int, bounded: bool) -> Any:
    """A client on ``endpoint`` whose HTTP session keeps ``pool`` connections: the transfer's
    threads share it."""
    client = storage.Client(
        project=project, credentials=credentials, client_options={"api_endpoint": endpoint}
    )
    kind = BoundedAdapter if bounded else HTTPAdapter
    adapter = kind(pool_connections=pool, pool_maxsize=pool, max_retries=0)
    for scheme in ("https://", "http://"):
        client._http.mount(scheme, adapter)
    return client


def key_credentials(secret: Mapping[str, str]) -> Any:
    """The credentials of the Secret's key file. Raises StorageMisconfigured naming the key
    (never its value) when the file is refused (``gcs.key``) or holds no usable key."""
    try:
        info = key_info(secret[KEY])
        return service_account.Credentials.from_service_account_info(info)  # type: ignore[no-untyped-call]
    except CredentialsSecretError as e:
        raise StorageMisconfigured(str(e)) from None
    except (KeyError, ValueError, TypeError, AttributeError) as e:  # never the value itself
        raise StorageMisconfigured(
            f"credentialsSecret key {KEY} is not a service-account key file's JSON "
            f"({type(e).__name__}); create the key with `gcloud iam service-accounts keys create`"
        ) from None


def connector(
    endpoint: str | None, secret: Mapping[str, str] | None, budget: CallBudget, pool: int
) -> tuple[str, Callable[[], Any]]:
    """(the endpoint's URL, a function making the client). The Secret's key is read now
    (StorageMisconfigured when it is refused); the client is made at the first call, so that
    finding no credentials is an error of a call (StorageAccessDenied), as elsewhere."""
    url = (endpoint or GCS_ENDPOINT).rstrip("/")
    creds = key_credentials(secret) if secret else None
    bounded = budget.call_deadline is not None

    def connect() -> Any:
        if creds is not None:
            return _client(creds, getattr(creds, "project_id", None), url, pool, bounded)
        if endpoint:
            anonymous = AnonymousCredentials()  # type: ignore[no-untyped-call]
            return _client(anonymous, None, url, pool, bounded)
        found, project = google.auth.default()
        return _client(found, project or None, url, pool, bounded)

    return url, connect
