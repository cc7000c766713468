"""What the answers and errors of an S3 endpoint mean, decided in one place (``storage.base``
lists the errors every store raises):

- 404 / NoSuchKey: ``KeyNotFound`` (``None`` from the reads); NoSuchBucket: ``BucketNotFound``.
- 412 PreconditionFailed: ``PreconditionFailed`` (a create-only or compare-and-swap lost).
- 429, 5xx, timeouts, connection errors: ``StorageUnavailable`` (botocore has retried them
  within the client's ``CallBudget``).
- 403 / credentials: ``StorageAccessDenied`` naming the IAM actions and the fix.
- 400 BadDigest: ``ChecksumMismatch`` (bytes changed on the way); other 4xx: ``StorageRejected``.

Messages show the endpoint's error code only when it is a plain identifier, never its message
or a body botocore could not parse: those go to the error's ``detail`` (the log's).
"""

from __future__ import annotations

import http.client
from typing import Any

import botocore.exceptions
from botocore.parsers import ResponseParserError

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

_DENIED = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch")
_CHECKSUM = ("BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch")
_FIX = (
    "check the credentials Secret or the role's bucket policy: s3:ListBucket, "
    "s3:ListBucketMultipartUploads on the bucket; s3:GetObject, s3:PutObject, s3:DeleteObject, "
    "s3:AbortMultipartUpload on the prefix (docs/storage-s3.md#bucket-permissions)"
)
# botocore errors whose text can hold the endpoint's own bytes: a body it could not parse, an
# exception of the HTTP layer (a status line or chunk length it could not read). Their subclasses
# (timeouts, closed connections) are worded by botocore alone.
_ECHOING = (
    ResponseParserError,
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ResponseStreamingError,
)


def _answer(err: botocore.exceptions.ClientError, where: str, bucket: str) -> StorageError:
    """The error of an answer the endpoint gave (a status and an S3 error document)."""
    meta: dict[str, Any] = dict(err.response.get("ResponseMetadata") or {})
    error: dict[str, Any] = dict(err.response.get("Error") or {})
    status = int(meta.get("HTTPStatusCode") or 0)
    raw = str(error.get("Code") or "")
    code = shown_code(raw)
    said = f"code {raw}; message: {error.get('Message')}" if raw or error.get("Message") else ""
    if status == 404 or code in ("NoSuchKey", "NoSuchBucket", "NotFound"):
        if code == "NoSuchBucket":
            return BucketNotFound(f"bucket {bucket!r} does not exist: create it first")
        return KeyNotFound(f"{where} does not exist")
    if status == 412 or code == "PreconditionFailed":
        return PreconditionFailed(f"{where}: condition not met")
    if status == 403 or code in _DENIED:
        return StorageAccessDenied(f"{where}: access denied ({code or status}); {_FIX}", said)
    if code in _CHECKSUM:
        return ChecksumMismatch(f"{where}: the endpoint found a checksum mismatch ({code})", said)
    if 400 <= status < 500 and status not in (408, 429):
        return StorageRejected(
            f"{where}: the endpoint refused the request ({code or status})", said
        )
    return StorageUnavailable(f"{where}: {code or status}", said)


def translate(err: Exception, where: str, bucket: str) -> StorageError:
    """The StorageError of an exception of boto3 (or of the direct reads of a body) about
    ``where`` in ``bucket``; any other exception is raised again."""
    if isinstance(err, botocore.exceptions.ClientError):
        return _answer(err, where, bucket)
    if isinstance(err, botocore.exceptions.NoCredentialsError):
        return StorageAccessDenied(
            f"{where}: no credentials found; set spec.checkpoint.storage.credentialsSecret "
            "or give the pod an identity (IRSA, Workload Identity)"
        )
    if type(err) in _ECHOING:
        return StorageUnavailable(f"{where}: {type(err).__name__}", str(err))
    # HTTPException: a body cut short under the direct reads of ``_stream`` (IncompleteRead).
    if isinstance(err, (botocore.exceptions.BotoCoreError, OSError, http.client.HTTPException)):
        return StorageUnavailable(f"{where}: {err}")
    raise err


def delete_refusal(where: str, first: dict[str, Any], refused: int, asked: int) -> StorageError:
    """The error of a DeleteObjects answer (200) listing ``refused`` of ``asked`` keys as not
    deleted, ``first`` its first entry; ``where`` names a key of the request, not the answer's."""
    code = shown_code(first.get("Code")) or "an error"
    said = f"key {first.get('Key')}; code {first.get('Code')}; message: {first.get('Message')}"
    return StorageError(f"{where}: {refused} of {asked} objects not deleted ({code})", said)
