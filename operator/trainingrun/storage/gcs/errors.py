"""What the errors of google-cloud-storage mean for a Cloud Storage bucket, decided in one place
(``storage.base`` lists the errors every store raises). The service's own words go to an error's
``detail`` (the log's), without the request's URL: a resumable upload's session URL is a
credential of its own. A message shows neither.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable

import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc
from google.cloud.storage import exceptions as storage_exc

from trainingrun.storage import base as sb
from trainingrun.storage.base import KeyNotFound, StorageError, StorageRejected

_URL = re.compile(r"\w+://\S+")
_CRC = re.compile(r"[A-Za-z0-9+/]{6}==")  # a CRC32C as GCS gives it: 4 bytes in base64
_FIX = (
    "give the service account (credentialsSecret key GOOGLE_SERVICE_ACCOUNT_JSON, or the pod's "
    "Workload Identity) storage.objects.get, storage.objects.create, storage.objects.delete and "
    "storage.objects.list on the bucket (role roles/storage.objectUser) "
    "(docs/storage-gcs.md#permissions-on-cloud-storage)"
)


def crc_shown(value: object) -> str:
    """A CRC32C the endpoint gave, as a message may show it (only a CRC32C's shape)."""
    return str(value) if _CRC.fullmatch(str(value)) else "(not a CRC32C)"


def _message(text: str) -> str:
    """The service's words for an error's detail, without the request's URL (a resumable
    upload's session URL is a credential of its own): the JSON error's message if there is one."""
    text = _URL.sub("<url>", text)
    with contextlib.suppress(ValueError, LookupError, TypeError):
        text = str(json.JSONDecoder().raw_decode(text, text.index("{"))[0]["error"]["message"])
    return text[:300]


def translate(
    err: Exception, where: str, bucket: str, bucket_missing: Callable[[], bool]
) -> StorageError:
    """What an error of the library means (storage.base's list). ``where`` is the gs:// name; a 404
    whose message does not say whether the bucket or the object is missing (the emulator's)
    asks ``bucket_missing``. The service's own text goes to the error's detail, without the
    request's URL; the message carries neither it nor a credential."""
    if isinstance(err, gexc.RetryError):  # the budget ran out on retryable errors
        return sb.StorageUnavailable(f"{where}: gave up retrying ({type(err.cause).__name__})")
    if isinstance(err, auth_exc.DefaultCredentialsError):
        return sb.StorageAccessDenied(f"{where}: no Google credentials found; {_FIX}")
    if isinstance(err, auth_exc.RefreshError) and not getattr(err, "retryable", False):
        return sb.StorageAccessDenied(f"{where}: the credentials were refused; {_FIX}")
    status, message = 0, ""
    if isinstance(err, gexc.GoogleAPICallError):
        status, message = int(err.code or 0), _message(str(err.message or ""))
    elif isinstance(err, storage_exc.InvalidResponse):
        status = int(getattr(err.response, "status_code", 0) or 0)
    lowered = message.lower()
    if status == 404:
        if "bucket does not exist" in lowered or (
            "no such object" not in lowered and bucket_missing()
        ):
            return sb.BucketNotFound(f"bucket gs://{bucket} does not exist: create it first")
        return KeyNotFound(f"{where} does not exist")
    if status == 412:
        return sb.PreconditionFailed(f"{where}: condition not met (the generation moved)")
    if status in (401, 403):
        return sb.StorageAccessDenied(f"{where}: access denied ({status}); {_FIX}", message)
    if status == 400 and ("crc32c" in lowered or "md5" in lowered) and "match" in lowered:
        mismatch = f"{where}: the endpoint found a checksum mismatch (400)"
        return sb.ChecksumMismatch(mismatch, message)
    if 400 <= status < 500 and status not in (408, 429):
        return StorageRejected(f"{where}: the endpoint refused the request ({status})", message)
    if status or isinstance(
        err, (storage_exc.DataCorruption, auth_exc.GoogleAuthError, requests.RequestException)
    ):
        return sb.StorageUnavailable(f"{where}: {status or type(err).__name__}", message)
    if isinstance(err, OSError):
        return sb.StorageUnavailable(f"{where}: {type(err).__name__}: {err}")
    raise err
