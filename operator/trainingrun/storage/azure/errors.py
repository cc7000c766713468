"""What the answers and errors of Azure Blob Storage mean, decided in one place (``storage.base``
lists the errors): 404 ContainerNotFound is ``BucketNotFound``, other 404s ``KeyNotFound``; 412
and 409 BlobAlreadyExists (If-None-Match: * on a blob that exists) ``PreconditionFailed``; 401/403
or no credential ``StorageAccessDenied`` naming the RBAC role; Md5Mismatch ``ChecksumMismatch``;
408, 429, 5xx, timeouts: ``StorageUnavailable``, retried within the ``CallBudget``.

Messages show the service's error code only when it is a plain identifier, and never its
message: both go to the error's ``detail`` (the log's).
"""

from __future__ import annotations

import contextlib

from azure.core.exceptions import AzureError, ClientAuthenticationError, HttpResponseError

from trainingrun.storage.azure.client import KEY_FIELD, SAS_FIELD
from trainingrun.storage.base import (
    BucketNotFound,
    ChecksumMismatch,
    KeyNotFound,
    PreconditionFailed,
    StorageAccessDenied,
    StorageError,
    StorageRejected,
    StorageUnavailable,
    shown_code,
)

ROLE = (
    "the role Storage Blob Data Contributor on the container (data actions "
    "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read, write and delete; "
    "docs/storage-azure.md#azure-roles)"
)


def classify(status: int, raw: str, where: str, root: str, detail: str = "") -> StorageError:
    """The error of an answer (HTTP ``status``, x-ms-error-code ``raw``; ``detail``: what else
    the service said); ``root``: az://A/C."""
    code = shown_code(raw)
    said = detail or (f"code {raw}" if raw != code else "")
    if status == 404:
        if code == "ContainerNotFound":
            return BucketNotFound(f"container {root} does not exist: create it first")
        return KeyNotFound(f"{where} does not exist")
    if status == 412 or code in ("ConditionNotMet", "BlobAlreadyExists"):
        return PreconditionFailed(f"{where}: condition not met ({code or status})")
    if status in (401, 403):
        return StorageAccessDenied(
            f"{where}: access denied ({code or status}); check the credentials Secret "
            f"({KEY_FIELD} or {SAS_FIELD}) or give the pod's identity {ROLE}",
            said,
        )
    if code in ("Md5Mismatch", "Crc64Mismatch"):
        return ChecksumMismatch(f"{where}: the service found a checksum mismatch ({code})", said)
    if 400 <= status < 500 and status not in (408, 429):
        refused = f"{where}: the service refused the request ({code or status})"
        return StorageRejected(refused, said)
    return StorageUnavailable(f"{where}: the service answered {status} {code}".rstrip(), said)


def error_body(err: HttpResponseError) -> str:
    """The start of an error answer's body (the SDK has read it), "" when there is none."""
    with contextlib.suppress(Exception):
        return str(err.response.text())[:1000] if err.response is not None else ""
    return ""


def translate(err: Exception, where: str, root: str) -> StorageError:
    """The StorageError of an exception the SDK raised (others are raised again). Messages name
    ``where`` and the service's code, never the SDK's text: a transport error's text can hold
    the request's URL, and a SAS is in its query. An answer's code and message go to the
    error's detail (URLs taken out)."""
    status = getattr(err, "status_code", None) or 0  # a body cut short carries its 200/206
    if isinstance(err, HttpResponseError) and status >= 400:
        headers = getattr(err.response, "headers", None) or {}
        code = headers.get("x-ms-error-code") or getattr(err, "error_code", None) or ""
        code = str(getattr(code, "value", code))  # the SDK's StorageErrorCode enum
        said = f"code {code}; {error_body(err) or err.message}"
        if code == "InvalidOperation" and "contentMD5" in str(err.message):
            code = "Md5Mismatch"  # Azurite's answer to a wrong Content-MD5
        return classify(int(status), code, where, root, said)
    if isinstance(err, ClientAuthenticationError):  # no token (the identity chain) or no key
        return StorageAccessDenied(
            f"{where}: no usable Azure credential ({type(err).__name__}); set "
            f"spec.checkpoint.storage.credentialsSecret with {KEY_FIELD} or {SAS_FIELD}, or give "
            f"the pod an identity (Azure Workload Identity) with {ROLE}"
        )
    if isinstance(err, AzureError):  # connection, timeout, a body cut short
        return StorageUnavailable(f"{where}: {type(err).__name__}")
    raise err
