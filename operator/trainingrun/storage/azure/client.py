"""How the Azure Blob Storage client of a store is made: its credential (the Secret's account
key or SAS, else the Azure identity chain), its retry policy within the ``CallBudget``, and its
HTTP session, whose connections keep to the calls' deadlines when the budget has one
(``storage.deadline``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.storage.blob import ContainerClient, ExponentialRetry
from requests import Session  # type: ignore[import-untyped,unused-ignore]
from requests.adapters import HTTPAdapter  # type: ignore[import-untyped,unused-ignore]

from trainingrun.contract import AZURE_CREDENTIAL_KEYS
from trainingrun.storage.base import CallBudget, StorageMisconfigured
from trainingrun.storage.deadline import BoundedAdapter

KEY_FIELD, SAS_FIELD = AZURE_CREDENTIAL_KEYS  # the credentials Secret's keys
# Put Blob takes up to 5000 MiB, Put Block 4000 MiB: ``put`` and ``put_checked`` are one request.
SINGLE_PUT, BLOCK = 5000 << 20, 4000 << 20
GET_CHUNK = 8 << 20  # each ranged GET of a download, and the most held in memory at once


def credential(account: str, secret: Mapping[str, str] | None) -> Any:
    """The credential of the Secret's data: an account key, else a SAS (an empty value counts
    as absent); without either, the Azure identity chain (Workload Identity on AKS, managed
    identity, the CLI's login...). Raises StorageMisconfigured for a key that is no key."""
    key = (secret or {}).get(KEY_FIELD, "").strip()
    sas = (secret or {}).get(SAS_FIELD, "").strip().lstrip("?")
    if key:
        try:
            base64.b64decode(key, validate=True)
        except binascii.Error:
            raise StorageMisconfigured(
                f"{KEY_FIELD} in the credentials Secret is not an account key (those are base64)"
            ) from None
        return AzureNamedKeyCredential(account, key)
    if sas:
        return AzureSasCredential(sas)
    from azure.identity import DefaultAzureCredential  # noqa: PLC0415 (msal is slow to import)

    return DefaultAzureCredential(exclude_interactive_browser_credential=True)


class _CappedRetry(ExponentialRetry):
    """Backoff 2, 4, 8, 16, then 20 s (±1): the SDK's default (18, 24, 42... s) outgrows budgets."""

    def get_backoff_time(self, settings: dict[str, Any]) -> float:
        return min(super().get_backoff_time(settings), 20.0)


def container_client(
    url: str,
    account: str,
    container: str,
    secret: Mapping[str, str] | None,
    budget: CallBudget,
    pool: int,
) -> Any:
    """The SDK's client of ``container`` at the account URL ``url``, one HTTP pool of ``pool``
    connections. Raises StorageMisconfigured."""
    session = Session()
    bounded = budget.call_deadline is not None
    adapter = (BoundedAdapter if bounded else HTTPAdapter)(pool_connections=1, pool_maxsize=pool)
    for prefix in ("https://", "http://"):
        session.mount(prefix, adapter)
    retries = max(budget.attempts - 1, 0)
    retry = _CappedRetry(
        initial_backoff=0, increment_base=2, random_jitter_range=1, retry_total=retries
    )
    retry.connect_retries = retry.read_retries = retry.status_retries = retries
    try:
        return ContainerClient(
            url,
            container,
            credential=credential(account, secret),
            session=session,
            retry_policy=retry,
            connection_timeout=budget.connect_timeout,
            read_timeout=budget.read_timeout,
            max_single_put_size=SINGLE_PUT,
            max_block_size=BLOCK,
            max_single_get_size=GET_CHUNK,
            max_chunk_get_size=GET_CHUNK,
        )
    except ValueError as e:  # it names the URL, which holds no credential
        raise StorageMisconfigured(f"spec.checkpoint.storage: no Azure client ({e})") from None
